"""One sub-package per instrumented framework.

An integration is a package ``tpu_closure_fix.integrations.<name>`` with:

* ``NAME``: its name (equal to ``<name>``);
* ``PACKAGES``: the top-level import names whose import arms the start-up
  watcher (the start-up module keeps a literal copy of their union: a test
  checks they agree);
* ``CALL_SITES``: its rows of the call-site table (:mod:`tpu_closure_fix.sites`);
* optionally ``late_enable_warning()``: called when the shim is enabled after
  the framework was imported; returns a message if unfixed steps already ran.
* optionally ``COMPILED_ONLY``: {distribution: its call} of compiled-only
  distributions that no row covers and only this integration's guard can
  (``status`` names them when installed: :func:`tpu_closure_fix.report.compiled_only`).

Its fixes live in ``<name>/fixes.py``; what the self-test and the graph check
drive for it lives in ``<name>/verify.py``, which the patching core never
imports. Adding a framework is one such package plus its name in :data:`NAMES`
and its release-matrix targets.
"""
import importlib

#: Integrations in table order. The torch_xla guard comes last: it is the net
#: under every framework site, which keeps its own, more exact fix.
NAMES = ("lightning", "accelerate", "optimum_neuron", "torch_xla")

_loaded = []


def load():
    """The integration modules, imported once, in :data:`NAMES` order."""
    if not _loaded:
        _loaded.extend(importlib.import_module("%s.%s" % (__name__, name)) for name in NAMES)
    return list(_loaded)
