"""Scenario: Lightning imported without the shim's post-import hook firing; what status() says and does.

``python -m support.unhooked CAUSE`` with the pytorch-lightning 1.8.6 target on PYTHONPATH. CAUSE:

* ``finder``: a ``sys.meta_path`` finder ahead of wrapt's returns Lightning's module specs itself (the
  pattern of runtime type-checker import hooks), so wrapt's loader wrapper, which runs the hooks, is
  never used;
* ``register``: ``wrapt.register_post_import_hook`` raises (a broken or incompatible wrapt).

Prints one JSON line: every loaded call-site record of ``status()`` (which reconciles first), whether
each ``patched`` record's class really resolves the method to the shim's wrapper, the shim's warnings,
and the recorded events of one Trainer step after it.
"""
import importlib.machinery
import json
import sys
import warnings


class SpecReturningFinder(object):
    """Finds Lightning's modules itself (PathFinder), ahead of every other finder."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname.split(".")[0] != "pytorch_lightning":
            return None
        return importlib.machinery.PathFinder.find_spec(fullname, path)


def resolves_to_wrapper(record):
    from tpu_closure_fix import engine

    module = sys.modules.get(record["module"])
    class_name, attr = engine.split_qualname(record["method"])
    owner = getattr(module, class_name, None) if class_name else module
    for klass in getattr(owner, "__mro__", (owner,)):
        if attr in vars(klass):
            return engine.is_ours(vars(klass)[attr])
    return False


def main(cause):
    warnings.simplefilter("always")
    with warnings.catch_warnings(record=True) as caught:
        if cause == "register":
            import wrapt

            def broken(hook, name):
                raise RuntimeError("register_post_import_hook is broken")

            wrapt.register_post_import_hook = broken
        import tpu_closure_fix  # enables: registers (or fails to register) the hooks
        if cause == "finder":
            sys.meta_path.insert(0, SpecReturningFinder())
        from support import probe

        probe.lightning()  # imports Lightning through the finders, binds the torch_xla stand-in
        loaded = [r for r in tpu_closure_fix.status() if r["verdict"] != "not installed"]
        _, _, events = probe.train(1)
    shim_warnings = [str(w.message) for w in caught if w.category.__name__ == "TPUClosureFixWarning"]
    print(json.dumps({
        "status": loaded,
        "patched_really": {"%s:%s" % (r["module"], r["method"]): resolves_to_wrapper(r)
                           for r in loaded if r["verdict"] == "patched"},
        "warnings": shim_warnings,
        "events": events,
    }))


if __name__ == "__main__":
    main(sys.argv[1])
