"""sitecustomize for tpu-closure-fix: auto-enable where .pth files are not processed.

Put this directory on PYTHONPATH (``PYTHONPATH=/path/to/sitecustomize_example``)
or copy the file into a directory that is. Python imports ``sitecustomize`` at
start-up; this one arms the same lazy watcher the .pth file arms: nothing but
that small module is loaded until a watched package is imported, and
``TPU_CLOSURE_FIX=0`` disables it. Requires tpu-closure-fix to be installed
(the wheel ships the ``_tpu_closure_fix_startup`` module this file imports).

The same file works as ``PYTHONSTARTUP`` for interactive sessions (Python runs
PYTHONSTARTUP only for the interactive prompt, never for scripts).

If your environment already has a sitecustomize.py, add the three lines
below to it instead of shadowing it with this file.
"""
try:
    import _tpu_closure_fix_startup
except ImportError:  # tpu-closure-fix is not installed: say so on stderr, never on stdout
    import warnings

    warnings.warn("sitecustomize: tpu-closure-fix is not installed; Lightning runs unpatched", RuntimeWarning)
else:
    _tpu_closure_fix_startup.install()
