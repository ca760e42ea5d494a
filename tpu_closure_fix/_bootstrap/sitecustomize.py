"""tpu-closure-fix bootstrap: arm the shim in this interpreter, then run the sitecustomize this one shadows.

Shipped inside the installed package (``tpu_closure_fix/_bootstrap/``);
``tpu-closure-fix run`` puts this directory first on ``PYTHONPATH``, so every
Python interpreter started under it imports this file at start-up. It arms the
same lazy watcher as the ``.pth`` file (``_tpu_closure_fix_startup.install()``:
nothing beyond that small module until a package the shim patches is imported;
``TPU_CLOSURE_FIX=0`` disables it), then imports the next ``sitecustomize`` on
``sys.path``, if any, so an image's own sitecustomize keeps working.

Several of these directories may be on the path (``run`` nested in ``run``
from two installations): the first one arms, each one that runs adds its
directory to a list kept in ``sys.modules``, and every chain step skips all
directories on that list, so the chain always moves forward and ends; the
user's own sitecustomize runs exactly once.

Nothing here writes anything, and it reads only this file's own directory and
its package's parent (to find the start-up module, the package and its runtime
dependencies -- by name, nothing else -- when the interpreter cannot import the
start-up module, e.g. a different Python than the one that ran ``run``).
"""
import os as _os
import sys as _sys

#: sys.modules key of the per-interpreter record: the bootstrap directories that already ran.
_STATE_KEY = "_tpu_closure_fix_bootstrap_state"


class _TpuClosureFixInstallation(object):
    """A ``sys.meta_path`` finder, last in line, for the installation this file belongs to: it finds
    the start-up module, ``tpu_closure_fix`` and its runtime dependencies there, and nothing else.

    Used when the interpreter cannot import the start-up module itself (``run -- /other/python``, a
    source checkout).  Appending the whole installation directory to ``sys.path`` would also hand
    that interpreter every other package installed there (another venv's torch).  Submodules are
    found through their package's ``__path__``; the interpreter's own copies come first.
    """

    NAMES = frozenset(("_tpu_closure_fix_startup", "tpu_closure_fix", "wrapt", "packaging"))

    def __init__(self, directories):
        self.directories = directories

    def find_spec(self, fullname, path=None, target=None):
        if fullname not in self.NAMES:
            return None
        import importlib.machinery

        return importlib.machinery.PathFinder.find_spec(fullname, self.directories)


def _tpu_closure_fix_arm(here):
    try:
        import _tpu_closure_fix_startup
    except ImportError:
        # Not installed in this interpreter's path: this installation's copy, found by name only.
        package_root = _os.path.dirname(_os.path.dirname(here))
        directories = [extra for extra in (package_root, _os.path.join(package_root, "startup"))
                       if _os.path.isdir(extra)]
        _sys.meta_path.append(_TpuClosureFixInstallation(directories))
        try:
            import _tpu_closure_fix_startup
        except ImportError:
            import warnings

            warnings.warn("tpu-closure-fix run: _tpu_closure_fix_startup is not importable; "
                          "this process runs unpatched", RuntimeWarning)
            return
    _tpu_closure_fix_startup.install()


def _tpu_closure_fix_chain(skip):
    """Import the sitecustomize this one shadows: the first on sys.path outside the bootstrap directories."""
    import importlib.machinery
    import importlib.util

    rest = [entry for entry in _sys.path
            if isinstance(entry, str) and _os.path.realpath(entry or _os.curdir) not in skip]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is not None and spec.loader is not None:
        module = importlib.util.module_from_spec(spec)
        _sys.modules["sitecustomize"] = module
        spec.loader.exec_module(module)


def _tpu_closure_fix_bootstrap():
    here = _os.path.dirname(_os.path.realpath(__file__))
    state = _sys.modules.get(_STATE_KEY)
    first = state is None
    if first:
        state = type(_sys)(_STATE_KEY)
        state.directories = []
        _sys.modules[_STATE_KEY] = state
    if here in state.directories:  # cannot happen through the chain (it skips these); never loop anyway
        return
    state.directories.append(here)
    if first:
        _tpu_closure_fix_arm(here)
    _tpu_closure_fix_chain(frozenset(state.directories))


_tpu_closure_fix_bootstrap()
