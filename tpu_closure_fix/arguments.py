"""What the commands' parsers share: lines that fit the terminal, and the types of ``--python`` and ``--timeout``."""
import argparse
import os
import sys

from . import textfit


def existing_python(text):
    """An ``argparse`` type: an executable interpreter, by path or by a name looked up on PATH as a shell does
    (never in the working directory: :func:`.verify.child.interpreter_path`)."""
    from .verify.child import interpreter_path

    path = interpreter_path(text)
    if path is None:
        raise argparse.ArgumentTypeError("%s is not an executable file%s (give the python of an environment, e.g. "
                                         "/path/to/venv/bin/python)" % (text, " on PATH" if os.sep not in text else ""))
    return path  # the file checked, never a same-named one found later


def positive_seconds(text):
    """An ``argparse`` type: a number of seconds greater than 0 (``--timeout``)."""
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not value > 0 or value != value or value == float("inf"):
        raise argparse.ArgumentTypeError("%r is not a number of seconds > 0 (e.g. 600)" % text)
    return value


#: The help of ``--timeout`` (``status`` and ``check``).
TIMEOUT_HELP = "seconds to wait for each interpreter started (default 600)"


class FittedHelpFormatter(argparse.HelpFormatter):
    """Help and usage wrapped to the terminal's columns (:func:`.textfit.width`)."""

    def __init__(self, prog, indent_increment=2, max_help_position=24, width=None):
        super().__init__(prog, indent_increment, max_help_position, width or textfit.width())


class FittedParser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose usage, help and error lines fit the terminal (:func:`.textfit.width`); its
    subcommands' parsers are of this class too."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("formatter_class", FittedHelpFormatter)
        super().__init__(*args, **kwargs)

    def format_usage(self):
        return textfit.fit(super().format_usage().rstrip("\n"), textfit.width()) + "\n"

    def format_help(self):
        return textfit.fit(super().format_help().rstrip("\n"), textfit.width()) + "\n"

    def error(self, message):
        self.print_usage(sys.stderr)
        self.exit(2, textfit.fit("%s: error: %s" % (self.prog, message), textfit.width()) + "\n")
