"""A private package, call-site table and engine state for the engine's unit tests (no framework needed).

:class:`World` writes a package ``<top>`` (release ``release``) with a module ``<top>.mod`` holding
:data:`MODULE`'s classes to a temporary folder and imports it for real (so the source is on disk and
:mod:`tpu_closure_fix.identity` can fingerprint it, and wrapt's import hooks fire), replaces the
call-site table by the rows a test gives (``sites.make_site``) and gives the engine a fresh state.
"""
import importlib
import itertools
import sys
import textwrap
import warnings

import pytest

from tpu_closure_fix import engine, identity, sites
from tpu_closure_fix.config import TPUClosureFixWarning
from tpu_closure_fix.fixes import FixUnavailable
from tpu_closure_fix.shape import Shape

#: The buggy shape: the closure goes to xm.optimizer_step in optimizer_args, no reduction of its own.
BUGGY = Shape(("optimizer", "closure"), varkw=False, requires=("optimizer_step", "optimizer_args"),
              forbids=("reduce_gradients",))
#: The upstream fix's shape: the closure runs, then the gradients are reduced.
FIXED = Shape(("optimizer", "closure"), varkw=False, requires=("reduce_gradients",))
#: The guard's shape (a module function).
GUARD = Shape(("optimizer", "optimizer_args"), varkw=False, method=False, requires=("step",))

MODULE = '''
import types

xm = types.SimpleNamespace(optimizer_step=lambda optimizer, optimizer_args=None: optimizer.step(**optimizer_args),
                           reduce_gradients=lambda optimizer: None)


class Base(object):
    def step(self, optimizer, closure=None):
        return xm.optimizer_step(optimizer, optimizer_args={"closure": closure})


class Legacy(Base):
    """A class kept for an old import path: inherits Base.step."""


class Override(Base):
    def step(self, optimizer, closure=None):
        return xm.optimizer_step(optimizer, optimizer_args={"closure": closure})


class Fixed(object):
    def step(self, optimizer, closure=None):
        loss = closure()
        xm.reduce_gradients(optimizer)
        return loss


class FixedChild(Fixed):
    pass


class Plain(object):
    def step(self, optimizer, closure=None):
        return optimizer.step(closure=closure)


class Empty(object):
    pass


class Unrelated(object):
    def step(self, optimizer, closure=None):
        return xm.optimizer_step(optimizer, optimizer_args={"closure": closure})


class FromUnrelated(Unrelated):
    pass


def optimizer_step(optimizer, optimizer_args):
    return optimizer.step(**optimizer_args)
'''

_numbers = itertools.count()


class RecordingFix(object):
    """A fix that marks its result, so a call shows whether the patched code ran."""

    name = "test-rules"

    def __init__(self, unavailable=None):
        self.unavailable = unavailable
        self.prepared = []

    def describe(self):
        return "returns ('fixed', result)"

    def prepare(self, site, original, switch):
        if self.unavailable:
            raise FixUnavailable(self.unavailable)
        self.prepared.append((site.variant, original))

        def wrapper(wrapped, instance, args, kwargs):
            result = wrapped(*args, **kwargs)
            return ("fixed", result) if switch.on else result

        return wrapper


class World(object):
    """A private package ``<top>`` (release ``release``) with module ``<top>.mod`` (:data:`MODULE`) on
    disk, a private call-site table and a fresh engine state."""

    def __init__(self, tmp_path, monkeypatch, release="1.5", source=MODULE, import_now=True, arm_reload=False):
        self.monkeypatch = monkeypatch
        self.top = "tcf_rules_%d" % next(_numbers)
        self.mod = self.top + ".mod"
        folder = tmp_path / self.top
        folder.mkdir()
        (folder / "__init__.py").write_text("" if release is None else "__version__ = %r\n" % release)
        (folder / "mod.py").write_text(textwrap.dedent(source))
        monkeypatch.syspath_prepend(str(tmp_path))
        monkeypatch.setattr(engine, "_state", engine._State())
        if not arm_reload:  # no wrapt hook left behind for this private module (the reload tests want one)
            monkeypatch.setattr(engine, "_arm_for_reload", lambda name: None)
        monkeypatch.setattr(sites, "CALL_SITES", ())
        self.fix = RecordingFix()
        self.module = self.load() if import_now else None

    def load(self):
        importlib.invalidate_caches()
        module = importlib.import_module(self.mod)
        self.module = module
        return module

    def forget(self):
        """Drop the private modules and any wrapt post-import hook left for them."""
        for name in (self.mod, self.top):
            sys.modules.pop(name, None)
        try:
            import wrapt.importer as importer

            with importer._post_import_hooks_lock:
                for name in (self.mod, self.top):
                    importer._post_import_hooks.pop(name, None)
        except Exception:  # pragma: no cover - other wrapt internals: nothing was left there
            pass

    def row(self, qualname, releases=">=1.0,<2", shape=BUGGY, fix="default", inherits=None, fingerprints=(),
            variant=None, module=None, package=None, integration="accelerate"):
        return sites.make_site(variant or "%s-%s" % (qualname, releases), integration, package or self.top,
                               self.top, module or self.mod, qualname, releases, shape,
                               self.fix if fix == "default" else fix, inherits, fingerprints)

    def table(self, *rows):
        self.monkeypatch.setattr(sites, "CALL_SITES", tuple(rows))
        return rows

    def key(self, qualname):
        return (self.mod, qualname)

    def decide(self, qualname, module=None):
        return engine._decide(self.key(qualname), module)

    def examine(self, qualname):
        return engine.examine(self.key(qualname))

    def fingerprint(self, qualname):
        cls, attr = qualname.split(".") if "." in qualname else (None, qualname)
        owner = getattr(self.module, cls) if cls else self.module
        value = identity.fingerprint(vars(owner)[attr])
        assert value is not None  # the source is on disk: the fingerprint is known
        return value

    def enable(self):
        """engine.enable(); returns the TPUClosureFixWarning texts."""
        self.monkeypatch.delenv("TPU_CLOSURE_FIX_DISABLE", raising=False)
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            assert engine.enable() is True
        return [str(w.message) for w in seen if w.category is TPUClosureFixWarning]


@pytest.fixture
def world(tmp_path, monkeypatch):
    made = []

    def make(**kwargs):
        made.append(World(tmp_path, monkeypatch, **kwargs))
        return made[-1]

    yield make
    engine._state.switch.on = False
    for w in made:
        w.forget()
