"""Byte-compile this checkout's shim and the tests' ``support`` package once per test session.

Test children import both from the checkout; under PYTHONDONTWRITEBYTECODE (set in this machine's environment)
each child would compile them again from source (about 0.15 CPU-s a child). The files land in ``__pycache__``
folders (named for the interpreter: each one's its own), which git and the wheel leave out; a source edited later
is compiled again as it is imported (the compiled file records the source's time and size)."""
import compileall
import os

TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REPO = os.path.dirname(TESTS)


def compile_checkout():
    for folder in (os.path.join(REPO, "tpu_closure_fix"), os.path.join(TESTS, "support")):
        compileall.compile_dir(folder, quiet=2)
