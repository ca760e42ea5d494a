"""The one renderer of ``status`` and ``check``: the JSON object (:func:`json_object`) and the text (:func:`text`).

The text is the header (the interpreter asked about and its start-up hook), the site table, the uncovered steps
and compiled-only distributions, the sections only ``check`` has (its self-tests, given as lines), the outcome's
reason and the zero-code sync check's line. Every line fits :func:`..textfit.width` columns: long sentences wrap,
a site name is elided before anything else, a distribution or release is never cut (a terminal too narrow for
the table gets one block per site instead); ``--json`` holds every value complete.
"""
from .. import engine, textfit
from . import records as _records

#: The version of the JSON object ``status --json`` and ``check --json`` print (docs/status.schema.json).
JSON_SCHEMA = 1
#: The most room site names give up for verdicts with their reasons on the row (longer: the reasons wrap).
VERDICT_ROOM = 36
#: The narrowest a site cell is elided to in the table; a terminal without that room gets a block per site.
SITE_CELL = 20
HEADING = ("distribution", "release", "site", "verdict")


def json_object(evidence, outcome, command="status", extra=None):
    """The one object ``status --json`` (and, with check's ``extra`` keys, ``check --json``) prints: schema
    :data:`JSON_SCHEMA`, docs/status.schema.json."""
    facts, payload = evidence.facts, evidence.payload or {}
    result = {"schema": JSON_SCHEMA, "command": command, "outcome": outcome.name, "exit_code": outcome.exit_code,
              "reason": outcome.reason, "rule": outcome.rule,
              "python": {"executable": evidence.python, "version": facts.get("version"), "flags": facts.get("flags")},
              "startup_hook": {"active": evidence.hook[0], "reason": evidence.hook[1]},
              "shim_version": payload.get("shim_version"), "shim_path": payload.get("shim_path"),
              "sync_check": evidence.sync, "sites": evidence.records or [], "uncovered": payload.get("uncovered") or [],
              "beside_script": (payload.get("beside_script") or {}).get("found") or [],
              "compiled_only": payload.get("compiled_only") or []}
    result.update(extra or {})
    return result


def text(evidence, outcome, show_all=False, sections=(), width=None):
    """What ``status`` prints (``check``: with its ``sections``, each a list of lines, after the table), every
    line at most ``width`` columns (default :func:`..textfit.width`)."""
    width = width or textfit.width()
    lines = header(evidence)
    if evidence.records is not None:
        lines.append(table(evidence.records, show_all=show_all, width=width))
        payload = evidence.payload or {}
        lines.extend(uncovered_lines(payload.get("uncovered")) + compiled_only_lines(payload.get("compiled_only")))
    for section in sections:
        lines.extend([""] + [cell(line) for line in section])
    lines.extend(["", cell(outcome.reason), cell(evidence.sync)])
    return textfit.fit("\n".join(lines), width)


def header(evidence):
    """The first two lines: which interpreter was asked, and its start-up hook (a line each, so that a long
    interpreter path and a long reason each keep their own line)."""
    active, why = evidence.hook
    version = evidence.facts.get("version") or "no report, the outcome below says why"
    state = "not known" if active is None and not evidence.facts else \
        "not asked" if active is None else "active" if active else "INACTIVE"
    if why and why.startswith(state):
        why = why[len(state):].lstrip(": ")
    return [cell("python: %s (%s)" % (evidence.python, version)),
            cell("start-up hook: %s%s" % (state, " (%s)" % why if why else ""))]


def cell(value):
    """A value read from the environment (a release string, an exception message, a path) as printable ASCII on
    one line: it may hold a line break or a character an ASCII stdout cannot encode."""
    text_ = str(value)
    if text_.isascii() and text_.isprintable():
        return text_
    return ascii(text_)[1:-1]


# --------------------------------------------------------------------------- the site table
def table(records, show_all=False, width=None):
    """The site table, every line at most ``width`` columns: the distribution and release cells whole, a long
    site cell elided in the middle, a verdict's reason on its row when every one fits :data:`VERDICT_ROOM`,
    else wrapped below it. Where the whole cells leave the site less than :data:`SITE_CELL` columns, one
    block per site instead (:func:`_blocks`)."""
    width = width or textfit.width()
    rows = [r for r in records if show_all or r["verdict"] not in (engine.NOT_INSTALLED, engine.ABSENT)]
    if not rows:
        return "No known call site is installed in this environment (use --all to list every known site)."
    cells = [(cell(r["distribution"] or "-"), cell(r["release"] or "-"), cell(_records.site_name(r)),
              cell(r["verdict"]), cell(r["reason"]) if r["reason"] else "") for r in rows]
    widths = [max([len(HEADING[i])] + [len(c[i]) for c in cells]) for i in range(2)]
    # room for every verdict with its reason when they all fit VERDICT_ROOM; else for the verdict words only
    # (the reasons wrap below them), so that site names keep what room there is
    full = max(len(c[3]) + (len(c[4]) + 3 if c[4] else 0) for c in cells)
    verdict_room = max(full if full <= VERDICT_ROOM else max(len(c[3]) for c in cells), len(HEADING[3]))
    site_cap = width - verdict_room - sum(widths) - 6
    if site_cap < SITE_CELL:
        return _blocks(cells, width)
    widths.append(max([len(HEADING[2])] + [min(len(c[2]), site_cap) for c in cells]))

    def columns(row):
        return "  ".join(textfit.elide(value, widths[j]).ljust(widths[j]) for j, value in enumerate(row[:3])) + "  "

    lines = [columns(HEADING) + HEADING[3], columns(tuple("-" * w for w in widths)) + "-" * 7]
    for row in cells:
        lines.extend(line.rstrip() for line in textfit.hanging(columns(row), _verdict(row), width))
    return "\n".join(lines)


def _blocks(cells, width):
    """The table of a terminal too narrow for its columns: per site, its distribution and release on a line
    (wrapped at spaces, never cut), its site elided to the width, its verdict wrapped below."""
    lines = []
    for row in cells:
        lines.extend(textfit.wrap("%s %s" % (row[0], row[1]), width, commands=False))
        lines.append("  " + textfit.elide(row[2], width - 2))
        lines.extend(textfit.wrap("    " + _verdict(row), width, commands=False))
    return "\n".join(lines)


def _verdict(row):
    return row[3] + (" (%s)" % row[4] if row[4] else "")


# --------------------------------------------------------------------------- findings beside the table
def uncovered_lines(found):
    """Lines naming the XLA optimizer steps no row covers (nothing when there are none)."""
    return [cell("XLA optimizer step no row covers: %s:%d (%s:%s)" % (u["file"], u["line"], u["module"],
                                                                     u["function"])) for u in found or []]


def compiled_only_lines(found):
    """One line per installed compiled-only distribution: the guard covers its call, or nothing does."""
    lines = []
    for item in found or []:
        head = "%s %s (compiled only, never patched or read; %s)" % (item["distribution"], item["release"],
                                                                     item["call"])
        if item["covered_by"]:
            tail = "covered by the %s guard (%s)" % (item["covered_by"], item["guard"])
        else:
            tail = "NOTHING covers it: the %s guard is not in place (%s)" % (item["integration"], item["guard"])
        lines.append(cell("%s: %s." % (head, tail)))
    return lines
