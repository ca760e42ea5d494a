"""A command longer than a line is laid out on lines of its own, broken at its spaces with a shell's `` \\``
continuation: pasted, it runs as the one command; no word of it is ever cut."""
import textwrap

import pytest

from tpu_closure_fix import textfit

COMMAND = ("/home/user/very/long/path/to/a/venv/bin/python -m pip install --no-deps pytorch-lightning==1.5.3 "
           "torchmetrics==0.7.3 'numpy<2' 'setuptools<82' pyDeprecate==0.3.1 fsspec")
LINE = "COULD NOT VERIFY: the release cannot be installed as it is. Fix: `%s` then run status again." % COMMAND


def _pasted(lines):
    """The command as a shell reads the lines: backquotes off, each backslash-newline and the indentation after
    it joined into one space."""
    text = "\n".join(lines)
    start, end = text.index("`") + 1, text.rindex("`")
    return " ".join(piece.strip() for piece in text[start:end].split(" \\\n"))


@pytest.mark.parametrize("width", [60, 80, 100, 120])
def test_a_long_command_pastes_as_one_command_and_no_line_is_too_wide(width):
    lines = textfit.wrap(LINE, width)
    assert max(len(line) for line in lines) <= width, lines
    assert _pasted(lines) == COMMAND
    words = set(COMMAND.split(" "))
    assert all(word in words for line in lines for word in line.strip(" `\\").split(" ") if word in COMMAND
               and "`" not in word and len(word) > 3 and word not in ("then", "run", "status", "again.")), lines


def test_twin_the_command_held_as_one_word_is_cut_mid_word():
    """What the layout avoids: the command held as one word and cut where a line ends."""
    held = LINE.replace(COMMAND, COMMAND.replace(" ", "\x00"))
    cut = [line.replace("\x00", " ") for line in textwrap.wrap(held, 120, break_long_words=True)]
    assert _pasted(cut) != COMMAND


def test_a_command_that_fits_stays_on_one_line():
    lines = textfit.wrap("Fix: `pip install 'setuptools<81'` and run it again. " + "x " * 50, 80)
    assert any("`pip install 'setuptools<81'`" in line for line in lines)
