"""What the commands' parsers share: the types of ``--python`` and ``--timeout``."""
import argparse
import os


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
