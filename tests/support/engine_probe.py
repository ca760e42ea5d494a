"""Engine checks that need a fresh interpreter with the real target release (tests/target/test_engine.py).

Run as ``python -m support.engine_probe CHECK SITES_JSON``. ``SITES_JSON`` is the
list of ``[module, "Class.method"]`` of the rows to look at: passed in because
importing ``tpu_closure_fix`` (to read its table) would enable the shim, and
when that happens is what these checks are about. Prints one ``PROBE {json}``
line.

* ``lifecycle``: the wrapper depth, and whether the class attribute is the
  release's own function, after each of: the framework import (with the .pth
  auto-enable of the base venv), ``import tpu_closure_fix``, ``enable()`` twice,
  ``importlib.reload(tpu_closure_fix)``, ``disable()`` twice, ``enable()``;
  then ``status()``.
* ``unknown-release``: the framework's ``__version__`` rewritten to 99.0.0
  before the shim is enabled (started with TPU_CLOSURE_FIX=0, switched on in
  the environment before the import): nothing is touched, the status and the
  warnings say why.
"""
import importlib
import json
import os
import sys
import warnings

from support.layers import depth, innermost
from support.site_classes import defining_classes


warnings.simplefilter("ignore")


def loaded_sites(sites):
    """{(module, qualname): (class, attr, the release's own function)} for the sites the target has."""
    return {(module_name, qualname): (cls, attr, innermost(vars(cls)[attr]))
            for module_name, qualname, cls, attr in defining_classes(sites)}


def lifecycle(sites):
    originals = loaded_sites(sites)

    def snapshot():
        out = {}
        for (module, qualname), (cls, attr, original) in originals.items():
            current = vars(cls)[attr]
            out[module + ":" + qualname] = {"depth": depth(current), "is_original": current is original,
                                           "wraps_original": innermost(current) is original}
        return out

    log = {"before": snapshot(), "auto_enabled": "_tpu_closure_fix_startup" in sys.modules}
    import tpu_closure_fix

    log["import"] = snapshot()
    tpu_closure_fix.enable()
    tpu_closure_fix.enable()
    log["enable_twice"] = snapshot()
    importlib.reload(tpu_closure_fix)
    log["reload_package"] = snapshot()
    tpu_closure_fix.disable()
    log["disable"] = snapshot()
    tpu_closure_fix.disable()
    log["disable_twice"] = snapshot()
    tpu_closure_fix.enable()
    log["enable_again"] = snapshot()
    log["status"] = tpu_closure_fix.status()
    return log


def unknown_release(sites):
    loaded = {key: (cls, attr, vars(cls)[attr]) for key, (cls, attr, _) in loaded_sites(sites).items()}
    # A release newer than any row (what a user gets after upgrading Lightning past the table):
    for top in ("pytorch_lightning", "lightning", "lightning_lite", "lightning_fabric"):
        if top in sys.modules:
            sys.modules[top].__version__ = "99.0.0"
    os.environ["TPU_CLOSURE_FIX"] = "1"  # the parent set 0 to keep the .pth auto-enable out of the way so far
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        import tpu_closure_fix

        tpu_closure_fix.enable()
    untouched = {"%s:%s" % key: vars(cls)[attr] is original for key, (cls, attr, original) in loaded.items()}
    return {"untouched": untouched, "loaded": len(loaded), "status": tpu_closure_fix.status(),
            "warnings": [str(w.message) for w in seen if w.category.__name__ == "TPUClosureFixWarning"]}


CHECKS = {"lifecycle": lifecycle, "unknown-release": unknown_release}


def main(argv=None):
    check, sites = (argv or sys.argv[1:])[:2]
    result = CHECKS[check]([tuple(site) for site in json.loads(sites)])
    print("PROBE " + json.dumps(result, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
