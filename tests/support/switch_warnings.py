"""The shape every bad-value warning of a ``TPU_CLOSURE_FIX*`` variable has (``config.bad_value_message``), and
the width rule for what a user sees on stderr.

Python prints a warning as ``path:line: TPUClosureFixWarning: `` followed by the message, then the source line.
So the message's first line is short (room for the path of a user's script), and its other lines stand on
their own, each at most ``textfit.WIDTH`` columns.
"""
from tpu_closure_fix import config, textfit

#: The widest first line of a message: what ``path:line: TPUClosureFixWarning: `` leaves of 120 columns for a
#: script path of about 70 columns (a pytest ``tmp_path``, a project folder in a home directory).
HEAD_ROOM = 20


def assert_bad_value_lines(message):
    """``message`` is a bad-value warning: a short first line, then indented lines of at most 120 columns,
    printable ASCII, ending in a next step holding a command."""
    lines = message.split("\n")
    assert lines[0] == config.BAD_VALUE_HEAD and len(lines[0]) <= HEAD_ROOM, lines[0]
    assert len(lines) >= 4, message  # the value and the accepted ones, what applies instead, the next step
    for line in lines[1:]:
        assert line.startswith(config.BAD_VALUE_INDENT) and len(line) <= textfit.WIDTH, line
    assert message.isascii() and all(line.isprintable() for line in lines), message  # no control character
    assert "Next step: `" in message, message


def too_wide(stderr):
    """The lines of ``stderr`` wider than 120 columns."""
    return [line for line in stderr.splitlines() if len(line) > textfit.WIDTH]
