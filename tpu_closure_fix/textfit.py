"""Lines that fit a terminal: what ``status`` and ``check`` print is at most :func:`width` columns.

The text output wraps long sentences (an outcome, a reason) onto indented continuation lines and elides
long table cells in the middle; ``--json`` is never shortened (it carries every value complete).
"""
import os
import textwrap

#: The widest line ``status`` and ``check`` print.
WIDTH = 120
#: The narrowest terminal they fit: a narrower ``COLUMNS`` is read as this.
NARROWEST = 60


def width(environ=None):
    """The columns the CLI's lines fit: ``COLUMNS`` of ``environ`` (default ``os.environ``) clamped to
    :data:`NARROWEST`..:data:`WIDTH`; :data:`WIDTH` when it is unset or not a whole number."""
    raw = (os.environ if environ is None else environ).get("COLUMNS", "").strip()
    if not (raw.isascii() and raw.isdigit()):
        return WIDTH
    return max(NARROWEST, min(WIDTH, int(raw)))
#: How far a wrapped line's continuation is indented beyond the line's own indentation.
CONTINUATION = "    "
#: What stands for the elided middle of a cell.
ELLIPSIS = "..."


def elide(text, width, keep_end=True):
    """``text`` itself when it fits ``width`` columns, else its start and end around :data:`ELLIPSIS`
    (the end of a site or path name tells most, so it keeps the larger half); with ``keep_end`` false, its
    start followed by :data:`ELLIPSIS` (a list of names, whose first one tells most)."""
    if len(text) <= width:
        return text
    if width <= len(ELLIPSIS):
        return text[:width]
    kept = width - len(ELLIPSIS)
    if not keep_end:
        return text[:kept] + ELLIPSIS
    head = kept // 2
    return text[:head] + ELLIPSIS + text[len(text) - (kept - head):]


#: Stands for a space inside a `command` while a line is wrapped (a command is never broken across lines).
_HELD_SPACE = "\x00"


def _hold_commands(text):
    """``text`` with the spaces of every `backquoted` command held (:data:`_HELD_SPACE`): one word to wrap."""
    parts = text.split("`")
    return "`".join(part.replace(" ", _HELD_SPACE) if i % 2 else part for i, part in enumerate(parts))


def _release(lines):
    return [line.replace(_HELD_SPACE, " ") for line in lines]


def wrap(line, width=WIDTH, commands=True):
    """``line`` as lines of at most ``width`` columns: broken at spaces outside `backquoted` commands
    (``commands=False``: at any space -- a line quoting what a user typed, whose backquotes are no commands),
    continuation lines indented as the line is plus :data:`CONTINUATION`; a word or command longer than a
    line (a long path) is cut where it must be."""
    if len(line) <= width:
        return [line]
    indent = line[:len(line) - len(line.lstrip(" "))]
    follow = indent + CONTINUATION
    if len(follow) >= width // 2:  # a deeply indented line keeps room for its words
        follow = CONTINUATION
    if commands:
        parts = line.split("`")
        for i in range(1, len(parts) - 1, 2):  # a command no line holds: on lines of its own, still pastable
            if len(parts[i]) + 2 > width - len(follow):
                before, after = "`".join(parts[:i]).rstrip(), "`".join(parts[i + 1:])
                out = wrap(before, width, commands) if before.strip() else []
                out += [follow + piece for piece in _shell_lines(parts[i], width - len(follow))]
                rest = after.strip()
                return out + (wrap(follow + rest, width, commands) if rest else [])
    held = _hold_commands(line.lstrip(" ")) if commands else line.lstrip(" ")
    return _release(textwrap.wrap(held, width=width, initial_indent=indent,
                                  subsequent_indent=follow, break_long_words=True, break_on_hyphens=False,
                                  drop_whitespace=True)) or [line[:width]]


def _shell_lines(command, room):
    """```command``` broken at its spaces into lines of at most ``room`` columns, each but the last ending in
    `` \\`` (a shell's line continuation: pasted, the lines run as the one command); a single word longer than a
    line stays whole on its own line."""
    lines, current = [], "`"
    for word in command.split(" "):
        if current not in ("`", "") and len(current) + 1 + len(word) + 2 > room:
            lines.append(current + " \\")
            current = word
        else:
            current = current + word if current == "`" else current + " " + word
    return lines + [current + "`"]


def fit(text, width=WIDTH):
    """Every line of ``text`` (one string, lines separated by ``\\n``) wrapped to ``width`` columns."""
    out = []
    for line in text.split("\n"):
        out.extend(wrap(line.rstrip(), width) if line.strip() else [line.rstrip()])
    return "\n".join(out)


def hanging(first, text, width=WIDTH):
    """``first`` followed by ``text``, the text wrapped into the columns after ``first`` (a table row's last
    cell): continuation lines are indented to that column while it leaves a third of the width and every word
    fits there, else by :data:`CONTINUATION`."""
    column = len(first)
    room = width - column
    if room < width // 3 or max([len(word) for word in text.split()] or [0]) > room:
        return wrap(first + text, width)
    pieces = textwrap.wrap(text, width=room, break_long_words=True, break_on_hyphens=False) or [""]
    return [first + pieces[0]] + [" " * column + piece for piece in pieces[1:]]
