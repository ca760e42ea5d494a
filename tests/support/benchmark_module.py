"""A benchmark script of benchmarks/ loaded as a module, for the tests of its rules and its smoke run."""
import importlib.util
import os

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def path(name):
    """The script ``benchmarks/NAME.py``."""
    return os.path.join(REPO, "benchmarks", name + ".py")


def load(name):
    """``benchmarks/NAME.py`` imported under ``NAME`` (its ``main`` is not run)."""
    spec = importlib.util.spec_from_file_location(name, path(name))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
