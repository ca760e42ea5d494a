"""engine._decide's numbered rules and examine()'s rule 14, one by one, in process, with no framework installed.

Each test builds the situation a rule decides -- the rows of a private call-site table
(``sites.make_site``), the release of a private package (its ``__version__``), the code of its
classes (real source files in a temporary folder, so :mod:`tpu_closure_fix.identity` can fingerprint
them), identity fingerprints and the guard -- and asserts the exact verdict and reason, with the
neighbouring situation that must fall to another rule (support/engine_world.py builds the world).
"""
import sys
import types
import warnings

import pytest

from support.engine_world import BUGGY, FIXED, GUARD, RecordingFix, World, world  # noqa: F401 (a fixture)
from tpu_closure_fix import engine, identity, settings, sites
from tpu_closure_fix.config import TPUClosureFixWarning
from tpu_closure_fix.shape import Shape


def _enabled(world):
    """The engine switched on, as enable() leaves it, without patching anything."""
    engine._state.enabled = True
    engine._state.switch.on = True
    return world


# --------------------------------------------------------------------------- rule 1: no row
def test_rule_1_a_site_no_row_names_is_skipped(world):
    w = world()
    w.table(w.row("Base.step"))
    finding = w.decide("Plain.step")
    assert finding == engine.Finding(engine.SKIPPED, "no row for %s:Plain.step in the call-site table" % w.mod,
                                     None, None, None)


def test_rule_1_twin_a_row_names_it(world):
    w = world()
    w.table(w.row("Base.step"))
    assert w.decide("Base.step").verdict == engine.DISABLED  # a row: the later rules decide (not enabled)


# --------------------------------------------------------------------------- rule 2: not imported
def test_rule_2_a_module_not_imported_is_not_imported_yet(world):
    w = world(import_now=False)
    w.table(w.row("Base.step"))
    assert w.decide("Base.step") == engine.Finding(engine.NOT_IMPORTED, "", None, None, None)


def test_rule_2_twin_the_module_given_or_imported_is_judged(world):
    w = world(import_now=False)
    w.table(w.row("Base.step"))
    module = w.load()
    assert w.decide("Base.step").verdict == engine.DISABLED
    sys.modules.pop(w.mod)
    assert w.decide("Base.step", module).verdict == engine.DISABLED  # the module passed in is the one judged
    sys.modules[w.mod] = module


# --------------------------------------------------------------------------- rule 3: no release
def test_rule_3_no_readable_release_is_never_guessed(world):
    w = world(release=None)
    w.table(w.row("Base.step"))
    finding = w.decide("Base.step")
    assert finding == engine.Finding(engine.SKIPPED, "cannot read the release of %s (no __version__)" % w.top,
                                     None, None, None)


def test_rule_3_names_the_top_level_package_of_a_dotted_package(world):
    w = world(release=None)
    w.table(w.row("Base.step", package=w.mod))  # a namespace-style package name: its top level is named
    assert w.decide("Base.step").reason == "cannot read the release of %s (no __version__)" % w.top


def test_rule_3_twin_a_release_is_read(world):
    w = world(release="1.5")
    w.table(w.row("Base.step"))
    assert w.decide("Base.step").release == "1.5"


# --------------------------------------------------------------------------- rule 4: inherited from a site
def _legacy_world(world, base_fingerprints=True, base_fix="default", base_shape=BUGGY, release="3.0"):
    w = world(release=release)
    base = w.row("Base.step", shape=base_shape, fix=base_fix,
                 fingerprints=(("1.5", w.fingerprint("Base.step")),) if base_fingerprints else ())
    legacy = w.row("Legacy.step")
    w.table(base, legacy)
    return w, base, legacy


def test_rule_4_an_unknown_release_inheriting_a_site_is_judged_as_that_site(world):
    w, base, legacy = _legacy_world(world)
    _enabled(w)
    finding = w.decide("Legacy.step")
    reason = "via %s.Base.step (3.0 not in the table)" % w.mod
    assert finding == engine.Finding(engine.PATCHABLE, reason, base, "3.0",
                                     (w.module.Base, "step", vars(w.module.Base)["step"]))


def test_rule_4_the_base_left_untouched_gives_its_verdict_and_reason(world):
    w, base, legacy = _legacy_world(world, base_fingerprints=False)
    _enabled(w)
    finding = w.decide("Legacy.step")
    base_finding = w.decide("Base.step")
    assert base_finding.verdict == engine.SKIPPED and base_finding.reason.startswith("unknown release 3.0")
    assert finding == engine.Finding(engine.SKIPPED, "via %s.Base.step (3.0 not in the table): %s"
                                     % (w.mod, base_finding.reason), legacy, "3.0", None)


def test_rule_4_the_base_already_patched(world):
    w, base, legacy = _legacy_world(world)
    w.enable()
    assert w.decide("Base.step").verdict == engine.PATCHED
    assert w.decide("Legacy.step") == engine.Finding(
        engine.PATCHED, "via %s.Base.step (3.0 not in the table)" % w.mod, legacy, "3.0", None)
    engine._state.switch.on = False  # a wrapper that could not be removed: passes through
    finding = w.decide("Legacy.step")
    assert (finding.verdict, finding.site) == (engine.DISABLED, legacy)
    assert finding.reason.endswith("a wrapper it could not remove passes calls through to the original")


def test_rule_4_the_base_fixed_upstream_is_checked_on_the_inheriting_class(world, monkeypatch):
    w = world(release="3.0")
    base = w.row("Fixed.step", shape=FIXED, fix=None, fingerprints=(("1.5", w.fingerprint("Fixed.step")),))
    child = w.row("FixedChild.step")
    w.table(base, child)
    reason = "via %s.Fixed.step (3.0 not in the table)" % w.mod
    assert w.decide("FixedChild.step") == engine.Finding(engine.FIXED_UPSTREAM, reason + ": 3.0 not in the table; "
                                                         "code identical to 1.5", base, "3.0", None)
    # the same base judged on the inheriting class, whose helper is not the fix's: skipped with the reason
    helper = Shape(FIXED.params, varkw=False, requires=("reduce_gradients",), helpers=(("flush", ("a", "b")),))
    w.table(base._replace(shape=helper), child)
    monkeypatch.setattr(w.module.Fixed, "flush", lambda self: (self.a, self.b), raising=False)
    monkeypatch.setattr(w.module.FixedChild, "flush", lambda self: (self.b, self.a), raising=False)
    finding = w.decide("FixedChild.step")
    assert finding.verdict == engine.SKIPPED
    assert finding.reason == reason + ": expected the upstream fix, but its helper flush loads b before a"
    assert finding.site == child


def test_rule_4_twin_a_release_the_package_knows_is_not_judged_as_the_base(world):
    w, base, legacy = _legacy_world(world, release="1.5")  # rows name 1.5: rule 4 does not apply
    _enabled(w)
    finding = w.decide("Legacy.step")
    assert (finding.verdict, finding.site) == (engine.SKIPPED, legacy)
    assert finding.reason == "Legacy defines no step"  # rule 9, with the row for 1.5


def test_rule_4_twin_a_class_inheriting_from_no_site_goes_on_to_rule_5(world):
    w = world(release="3.0")
    w.table(w.row("FromUnrelated.step"))
    finding = w.decide("FromUnrelated.step")
    assert finding.verdict == engine.SKIPPED and finding.reason.startswith("unknown release 3.0 of %s" % w.top)


# --------------------------------------------------------------------------- rule 5: identical code
def test_rule_5_a_release_no_row_names_with_identical_code_takes_that_row(world):
    w = world(release="3.0")
    (row,) = w.table(w.row("Base.step", fingerprints=(("1.4", "sha256:0000000000000000"),
                                                      ("1.5", w.fingerprint("Base.step")))))
    _enabled(w)
    assert w.decide("Base.step") == engine.Finding(
        engine.PATCHABLE, "3.0 not in the table; code identical to 1.5", row, "3.0",
        (w.module.Base, "step", vars(w.module.Base)["step"]))


def test_rule_5_the_last_identical_row_wins(world):
    w = world(release="3.0")
    value = w.fingerprint("Base.step")
    first = w.row("Base.step", releases=">=1.0,<1.5", fingerprints=(("1.4", value),))
    second = w.row("Base.step", releases=">=1.5,<2", fingerprints=(("1.5", value),))
    w.table(first, second)
    _enabled(w)
    finding = w.decide("Base.step")
    assert (finding.site, finding.reason) == (second, "3.0 not in the table; code identical to 1.5")


def test_rule_5_identical_to_upstream_fixed_code_is_fixed_upstream(world):
    w = world(release="3.0")
    (row,) = w.table(w.row("Fixed.step", shape=FIXED, fix=None, fingerprints=(("1.5", w.fingerprint("Fixed.step")),)))
    assert w.decide("Fixed.step") == engine.Finding(engine.FIXED_UPSTREAM, "3.0 not in the table; code identical "
                                                    "to 1.5", row, "3.0", None)


def test_rule_5_identity_reads_the_code_under_our_wrapper(world):
    w = world(release="1.5")
    row = w.row("Base.step", fingerprints=(("1.5", w.fingerprint("Base.step")),))
    w.table(row)
    w.enable()
    assert w.decide("Base.step").verdict == engine.PATCHED
    w.monkeypatch.setattr(w.module, "__version__", "3.0", raising=False)
    sys.modules[w.top].__version__ = "3.0"
    assert engine._same_code_row([row], w.module.Base, "step", "3.0") == (
        row, "3.0 not in the table; code identical to 1.5")
    finding = w.decide("Base.step")
    assert (finding.verdict, finding.site) == (engine.PATCHED, row)


@pytest.mark.parametrize("case", ["other-fingerprint", "no-fingerprints", "inheriting-row", "no-source",
                                  "unknown-decorator"])
def test_rule_5_twin_code_not_identical_is_an_unknown_release(world, case):
    w = world(release="3.0")
    value = w.fingerprint("Base.step")
    fingerprints = (("1.5", "sha256:0123456789abcdef" if case == "other-fingerprint" else value),)
    if case == "no-fingerprints":
        fingerprints = ()
    row = w.row("Base.step", fingerprints=fingerprints, inherits="Other.step" if case == "inheriting-row" else None)
    w.table(row)
    if case == "no-source":
        namespace = {"xm": w.module.xm}
        exec("def step(self, optimizer, closure=None):\n"
             "    return xm.optimizer_step(optimizer, optimizer_args={'closure': closure})\n", namespace)
        w.monkeypatch.setattr(w.module.Base, "step", namespace["step"])
    if case == "unknown-decorator":
        original = vars(w.module.Base)["step"]
        w.monkeypatch.setattr(identity, "decorators_known", lambda function: function is not original)
    assert engine._same_code_row([row], w.module.Base, "step", "3.0") == (None, "")
    finding = w.decide("Base.step")
    if case == "inheriting-row":  # an inheriting row's own rule: never identity
        return
    assert finding.verdict == engine.SKIPPED
    assert finding.reason == ("unknown release 3.0 of %s: not verified (known: >=1.0,<2; its code is not "
                              "identical to a verified release); left untouched" % w.top)
    assert finding.site is None and finding.release == "3.0"


def test_rule_5_a_missing_class_is_never_compared(world):
    w = world(release="3.0")
    w.table(w.row("Missing.step", fingerprints=(("1.5", w.fingerprint("Base.step")),)))
    assert w.decide("Missing.step") == engine.Finding(engine.ABSENT, "", None, "3.0", None)


# --------------------------------------------------------------------------- rule 6: unknown release
def test_rule_6_no_such_method_in_this_release_is_absent(world):
    w = world(release="3.0")
    w.table(w.row("Empty.step"))
    assert w.decide("Empty.step") == engine.Finding(engine.ABSENT, "", None, "3.0", None)


def test_rule_6_a_module_function_that_is_missing_is_absent_and_one_that_exists_is_not(world):
    w = world(release="3.0")
    w.table(w.row("gone", shape=GUARD), w.row("optimizer_step", shape=GUARD))
    assert w.decide("gone") == engine.Finding(engine.ABSENT, "", None, "3.0", None)
    assert w.decide("optimizer_step").verdict == engine.SKIPPED


def test_rule_6_an_inherited_method_exists(world):
    w = world(release="3.0")
    w.table(w.row("FromUnrelated.step"))
    assert w.decide("FromUnrelated.step").verdict == engine.SKIPPED  # it has step (inherited): not absent


def test_rule_6_a_release_another_site_knows_without_the_buggy_call_is_absent(world):
    w = world(release="3.0")
    w.table(w.row("Base.step", releases=">=3.0,<4"), w.row("Plain.step"))
    assert w.decide("Plain.step") == engine.Finding(engine.ABSENT, "", None, "3.0", None)


def test_rule_6_a_release_another_site_knows_with_the_buggy_call_is_skipped(world):
    w = world(release="3.0")
    w.table(w.row("Plain.step", releases=">=3.0,<4"), w.row("Base.step"), w.row("Base.step", releases=">=2.0,<2.5"))
    assert w.decide("Base.step") == engine.Finding(
        engine.SKIPPED, "unknown release 3.0 for this site (known: >=1.0,<2, >=2.0,<2.5), whose code still has "
        "the buggy call; left untouched", None, "3.0", None)


def test_rule_6_buggy_shape_needs_a_row_with_a_fix(world):
    w = world(release="3.0")
    w.table(w.row("Plain.step", releases=">=3.0,<4"), w.row("Base.step", fix=None))
    assert w.decide("Base.step") == engine.Finding(engine.ABSENT, "", None, "3.0", None)


def test_rule_6_our_own_wrapper_is_not_the_buggy_code(world):
    w = world(release="3.0")
    w.table(w.row("Plain.step", releases=">=3.0,<4"), w.row("Base.step"))
    wrapper = lambda self, optimizer, closure=None: None  # noqa: E731
    setattr(wrapper, engine.MARKER, "v")
    w.monkeypatch.setattr(w.module.Base, "step", wrapper)
    assert engine._has_buggy_shape(w.module.Base, "step", sites.CALL_SITES) is False
    assert engine._has_buggy_shape(w.module.Override, "step", sites.CALL_SITES) is True


def test_rule_6_an_unknown_release_lists_every_range_of_the_package(world):
    w = world(release="3.0")
    w.table(w.row("Base.step", releases=">=1.0,<2"), w.row("Plain.step", releases=">=0.5,<1"),
            w.row("Other.step", releases=">=9.0", package="tcf_rules_elsewhere"))
    assert w.decide("Base.step").reason == (
        "unknown release 3.0 of %s: not verified (known: >=0.5,<1, >=1.0,<2; its code is not identical to a "
        "verified release); left untouched" % w.top)


# --------------------------------------------------------------------------- rule 7: class missing
def test_rule_7_the_rows_class_missing_from_the_module(world):
    w = world()
    (row,) = w.table(w.row("Missing.step"))
    assert w.decide("Missing.step") == engine.Finding(engine.SKIPPED, "%s has no class Missing" % w.mod, row,
                                                      "1.5", None)


def test_rule_7_a_non_class_of_that_name_is_no_class(world):
    w = world()
    w.monkeypatch.setattr(w.module, "NotAClass", object(), raising=False)
    (row,) = w.table(w.row("NotAClass.step"))
    assert w.decide("NotAClass.step").reason == "%s has no class NotAClass" % w.mod


# --------------------------------------------------------------------------- rule 8: inheriting rows
def _inheriting(world, qualname="Legacy.step", inherits="Base.step", release="1.5"):
    w = world(release=release)
    base = w.row("Base.step")
    row = w.row(qualname, inherits=inherits, fix=None)
    w.table(base, row)
    return w, base, row


def test_rule_8_an_inheriting_class_is_patched_through_its_base(world):
    w, base, row = _inheriting(world)
    _enabled(w)
    assert w.decide("Legacy.step") == engine.Finding(engine.PATCHABLE, "via %s.Base.step" % w.mod, base, "1.5",
                                                     (w.module.Base, "step", vars(w.module.Base)["step"]))


def test_rule_8_patched_and_passing_through(world):
    w, base, row = _inheriting(world)
    w.enable()
    assert w.decide("Legacy.step") == engine.Finding(engine.PATCHED, "via %s.Base.step" % w.mod, row, "1.5", None)
    engine._state.switch.on = False
    assert w.decide("Legacy.step").verdict == engine.DISABLED


def test_rule_8_an_override_is_skipped(world):
    w, base, row = _inheriting(world, qualname="Override.step")
    assert w.decide("Override.step") == engine.Finding(
        engine.SKIPPED, "Override overrides step (expected to inherit Base.step)", row, "1.5", None)


def test_rule_8_no_method_at_all(world):
    w, base, row = _inheriting(world, qualname="Empty.step")
    assert w.decide("Empty.step") == engine.Finding(engine.SKIPPED, "Empty has no step", row, "1.5", None)


def test_rule_8_inherited_from_another_class(world):
    w, base, row = _inheriting(world, qualname="FromUnrelated.step")
    assert w.decide("FromUnrelated.step") == engine.Finding(
        engine.SKIPPED, "inherits Unrelated.step, expected Base.step", row, "1.5", None)


def test_rule_8_the_bases_own_verdict_when_it_is_not_patchable(world):
    w, base, row = _inheriting(world)  # not enabled: the base is DISABLED
    assert w.decide("Legacy.step") == engine.Finding(
        engine.DISABLED, "via %s.Base.step: not enabled" % w.mod, row, "1.5", None)
    w.table(base._replace(shape=FIXED), row)  # the base is not its shape: skipped with the base's reason
    finding = w.decide("Legacy.step")
    assert finding.verdict == engine.SKIPPED
    assert finding.reason == "via %s.Base.step: unexpected code shape: code lacks reduce_gradients; left " \
                             "untouched" % w.mod


def test_rule_8_a_base_verdict_without_a_reason_adds_none(world):
    w, base, row = _inheriting(world)
    w.table(base._replace(shape=BUGGY, fix=None), row)  # fixed upstream... by a shape the code has
    assert w.decide("Legacy.step") == engine.Finding(engine.FIXED_UPSTREAM, "via %s.Base.step" % w.mod, row, "1.5",
                                                     None)


def test_rule_8_a_stale_base_class_not_of_the_base_rows_shape(world):
    """The subclass inherits from an old class object (a reload): its code is judged by the base row's shape."""
    w, base, row = _inheriting(world)
    _enabled(w)
    namespace = {}
    exec("class Base(object):\n    def step(self, optimizer, closure=None):\n        return closure()\n", namespace)
    stale = namespace["Base"]
    stale.__module__ = w.mod
    w.monkeypatch.setattr(w.module, "Stale", type("Legacy", (stale,), {"__module__": w.mod}), raising=False)
    w.table(base, row._replace(qualname="Stale.step"))
    finding = w.decide("Stale.step")
    assert (finding.verdict, finding.reason) == (engine.SKIPPED, "via %s.Base.step: the inherited code is not the "
                                                 "base row's shape" % w.mod)
    assert finding.site._replace(qualname="Legacy.step") == row


# --------------------------------------------------------------------------- rule 9: method not defined
def test_rule_9_a_class_that_does_not_define_the_method(world):
    w = world()
    (row,) = w.table(w.row("Legacy.step"))
    assert w.decide("Legacy.step") == engine.Finding(engine.SKIPPED, "Legacy defines no step", row, "1.5", None)


# --------------------------------------------------------------------------- rule 10: ours
class _CaveatFix(RecordingFix):
    caveat = "covers the default hook only"


# The patched verdict's reason is the site's note, then the fix's caveat: each alone, or joined by "; ".
@pytest.mark.parametrize("fix, reason, noted_reason", [
    (RecordingFix, "", "a note"),
    (_CaveatFix, "covers the default hook only", "a note; covers the default hook only"),
], ids=["without-caveat", "with-caveat"])
def test_rule_10_our_wrapper_is_patched_with_its_note_and_fix_caveat(world, fix, reason, noted_reason):
    w = world()
    w.fix = fix()
    (row,) = w.table(w.row("Base.step"))
    w.enable()
    assert w.decide("Base.step") == engine.Finding(engine.PATCHED, reason, row, "1.5", None)
    engine._state.notes[w.key("Base.step")] = "a note"
    assert w.decide("Base.step").reason == noted_reason


def test_rule_10_switched_off_it_passes_through(world):
    w = world()
    (row,) = w.table(w.row("Base.step"))
    w.enable()
    engine._state.switch.on = False
    engine._state.disabled_reason = "why"
    assert w.decide("Base.step") == engine.Finding(
        engine.DISABLED, "why; a wrapper it could not remove passes calls through to the original", row, "1.5", None)


# --------------------------------------------------------------------------- rule 11: upstream fixed
def test_rule_11_upstream_fixed_code_of_the_fix_shape(world):
    w = world()
    (row,) = w.table(w.row("Fixed.step", shape=FIXED, fix=None))
    assert w.decide("Fixed.step") == engine.Finding(engine.FIXED_UPSTREAM, "", row, "1.5", None)


def test_rule_11_twin_expected_the_fix_but_the_code_lacks_it(world):
    w = world()
    (row,) = w.table(w.row("Base.step", shape=FIXED, fix=None))
    assert w.decide("Base.step") == engine.Finding(
        engine.SKIPPED, "expected the upstream fix, but code lacks reduce_gradients", row, "1.5", None)


def test_rule_11_the_helpers_are_read_on_the_class(world):
    w = world()
    shape = Shape(FIXED.params, varkw=False, requires=("reduce_gradients",), helpers=(("flush", ("a", "b")),))
    (row,) = w.table(w.row("Fixed.step", shape=shape, fix=None))
    w.monkeypatch.setattr(w.module.Fixed, "flush", lambda self: (self.b, self.a), raising=False)
    assert w.decide("Fixed.step").reason == "expected the upstream fix, but its helper flush loads b before a"


# --------------------------------------------------------------------------- rule 12: unexpected shape
def test_rule_12_code_not_of_the_buggy_shape_is_never_patched(world):
    w = world()
    (row,) = w.table(w.row("Plain.step"))
    _enabled(w)
    assert w.decide("Plain.step") == engine.Finding(
        engine.SKIPPED, "unexpected code shape: code lacks optimizer_args, optimizer_step; left untouched", row,
        "1.5", None)


# --------------------------------------------------------------------------- rule 13: failed / disabled / patchable
def test_rule_13_a_fix_that_failed(world):
    w = world()
    (row,) = w.table(w.row("Base.step"))
    engine._state.failures[w.key("Base.step")] = "it broke"
    _enabled(w)
    assert w.decide("Base.step") == engine.Finding(engine.FAILED, "it broke", row, "1.5", None)


def test_rule_13_the_shim_off(world):
    w = world()
    (row,) = w.table(w.row("Base.step"))
    engine._state.disabled_reason = "TPU_CLOSURE_FIX=0"
    assert w.decide("Base.step") == engine.Finding(engine.DISABLED, "TPU_CLOSURE_FIX=0", row, "1.5", None)


def test_rule_13_its_integration_switched_off(world):
    w = world()
    (row,) = w.table(w.row("Base.step"))
    _enabled(w)
    engine._state.switched_off = {"accelerate": "TPU_CLOSURE_FIX_DISABLE names accelerate"}
    assert w.decide("Base.step") == engine.Finding(engine.DISABLED, "TPU_CLOSURE_FIX_DISABLE names accelerate",
                                                   row, "1.5", None)
    engine._state.switched_off = {"lightning": "TPU_CLOSURE_FIX_DISABLE names lightning"}
    assert w.decide("Base.step").verdict == engine.PATCHABLE


def test_rule_13_else_patchable_with_the_target(world):
    w = world()
    (row,) = w.table(w.row("Base.step"))
    _enabled(w)
    assert w.decide("Base.step") == engine.Finding(engine.PATCHABLE, "", row, "1.5",
                                                   (w.module.Base, "step", vars(w.module.Base)["step"]))


def test_rule_13_the_row_whose_range_holds_the_release(world):
    w = world(release="2.5")
    first, second = w.table(w.row("Base.step", releases=">=1.0,<2"), w.row("Base.step", releases=">=2.0,<3"))
    _enabled(w)
    assert w.decide("Base.step").site == second


# --------------------------------------------------------------------------- rule 14: the guard
class _GuardWorld(object):
    """A second private package holding a guard function, and a fake guard integration covering sites."""

    def __init__(self, w, covers=None):
        self.w = w
        self.calls = []
        self.row = w.row("optimizer_step", shape=GUARD, integration="guardint", fix=RecordingFix())
        self.integration = types.SimpleNamespace(NAME="guardint", CALL_SITES=(self.row,),
                                                 covers=covers or self._covers)
        plain = types.SimpleNamespace(NAME="plain", CALL_SITES=())  # no covers: never a guard
        w.monkeypatch.setattr(engine._integrations, "load", lambda: [plain, self.integration])

    def _covers(self, function, guards):
        self.calls.append((function, dict(guards)))
        return True


def _guarded_world(world, covers=None, site_shape=FIXED):
    w = world()
    g = _GuardWorld(w, covers)
    guard_module = types.ModuleType(w.top + ".xm")
    namespace = {}
    exec("def optimizer_step(optimizer, optimizer_args):\n    return optimizer.step(**optimizer_args)\n", namespace)
    guard_module.optimizer_step = namespace["optimizer_step"]
    w.monkeypatch.setitem(sys.modules, guard_module.__name__, guard_module)
    g.row = g.row._replace(module=guard_module.__name__)
    g.integration.CALL_SITES = (g.row,)
    site = w.row("Base.step", shape=site_shape)
    w.table(g.row, site)
    return w, g, site, guard_module


def test_rule_14_guarded_when_the_guard_is_patched_and_covers(world):
    w, g, site, xm = _guarded_world(world)
    w.enable()
    finding = w.examine("Base.step")
    assert finding == engine.Finding(engine.GUARDED, "unexpected code shape: code lacks reduce_gradients; left "
                                     "untouched; its call goes through the patched guardint guard", site, "1.5", None)
    (function, guards), = g.calls[-1:]
    assert function is vars(w.module.Base)["step"] and guards == {"optimizer_step": xm.optimizer_step}
    assert engine.is_ours(xm.optimizer_step)


def test_rule_14_a_failed_fix_says_so(world):
    w, g, site, xm = _guarded_world(world, site_shape=BUGGY)
    w.enable()
    engine.disable()
    w.fix.unavailable = "no xla_model"
    engine._state.failures.clear()
    w.enable()
    finding = w.examine("Base.step")
    assert finding.verdict == engine.GUARDED
    assert finding.reason == "its fix failed: fix unavailable: no xla_model; its call goes through the patched " \
                             "guardint guard"


@pytest.mark.parametrize("case", ["guard-not-patched", "covers-false", "covers-raises", "site-patched",
                                  "integration-of-the-module"])
def test_rule_14_twin_not_guarded(world, case):
    def covers(function, guards):
        if case == "covers-raises":
            raise RuntimeError("cannot tell")
        return case != "covers-false"

    w, g, site, xm = _guarded_world(world, covers=covers, site_shape=BUGGY if case == "site-patched" else FIXED)
    if case == "integration-of-the-module":  # an integration with a (patched) site in the site's own module
        own = w.row("Override.step", integration="guardint", fix=RecordingFix())
        g.integration.CALL_SITES = (g.row, own)
        w.table(g.row, site, own)
    w.enable()
    if case == "guard-not-patched":
        engine._state.switch.on = False  # the guard passes through: not PATCHED
        engine._state.enabled = False
    finding = w.examine("Base.step")
    if case == "integration-of-the-module":
        assert w.examine("Override.step").verdict == engine.PATCHED  # the test itself: its guards are patched
    expected = {"guard-not-patched": engine.SKIPPED, "site-patched": engine.PATCHED}.get(case, engine.SKIPPED)
    assert finding.verdict == expected
    assert "guard" not in finding.reason


def test_rule_14_only_skipped_failed_or_disabled_sites_are_guarded(world):
    w, g, site, xm = _guarded_world(world)
    w.table(g.row, site._replace(qualname="Fixed.step", shape=FIXED, fix=None))  # fixed upstream: never "guarded"
    w.enable()
    assert w.examine("Fixed.step").verdict == engine.FIXED_UPSTREAM
    assert engine._covering_guard(w.key("Fixed.step"), None) == "guardint"  # though its call reaches the guard


def test_rule_14_a_disabled_integration_reaching_the_guard(world):
    w, g, site, xm = _guarded_world(world, site_shape=BUGGY)
    w.monkeypatch.setenv("TPU_CLOSURE_FIX_DISABLE", "accelerate")
    settings.reload()
    engine.enable()
    assert w.examine("Base.step") == engine.Finding(
        engine.GUARDED, "TPU_CLOSURE_FIX_DISABLE names accelerate; its call goes through the patched guardint guard",
        site, "1.5", None)


def test_rule_14_inherited_function_is_found(world):
    w, g, site, xm = _guarded_world(world)
    w.table(g.row, site, site._replace(qualname="Legacy.step", variant="legacy"))
    w.enable()
    assert engine._site_function(w.key("Legacy.step"), None) is vars(w.module.Base)["step"]
    assert engine._site_function(w.key("Missing.step"), None) is None
    assert engine._site_function(("tcf_rules_not_imported", "x"), None) is None
    assert w.examine("Legacy.step").verdict == engine.GUARDED


# --------------------------------------------------------------------------- _patch_site
def test_patching_twice_never_stacks_nor_fails(world):
    w = world()
    (row,) = w.table(w.row("Base.step"))
    assert w.enable() == []
    wrapper = vars(w.module.Base)["step"]
    assert engine.is_ours(wrapper) and getattr(wrapper, engine.MARKER) == row.variant
    assert w.enable() == []  # again: the site is PATCHED, left as it is
    assert vars(w.module.Base)["step"] is wrapper and engine._state.failures == {}
    assert len(w.fix.prepared) == 1
    assert w.module.Base().step(types.SimpleNamespace(step=lambda closure: "stepped"), None) == ("fixed", "stepped")


def test_a_fix_unavailable_fails_the_site_with_a_warning(world):
    w = world()
    w.fix.unavailable = "no xla_model"
    (row,) = w.table(w.row("Base.step"))
    messages = w.enable()
    assert messages == ["tpu-closure-fix: %s:Base.step not patched: no xla_model" % w.mod]
    assert w.decide("Base.step") == engine.Finding(engine.FAILED, "fix unavailable: no xla_model", row, "1.5", None)
    assert not engine.is_ours(vars(w.module.Base)["step"])


def test_a_skipped_site_is_warned_about_once(world):
    w = world()
    w.table(w.row("Plain.step"))
    assert w.enable() == ["tpu-closure-fix: %s:Plain.step not patched: unexpected code shape: code lacks "
                          "optimizer_args, optimizer_step; left untouched" % w.mod]
    assert w.enable() == []


def test_an_inheriting_row_of_an_unpatched_base_is_not_warned_about(world):
    w = world()
    w.table(w.row("Plain.step"), w.row("Override.step", inherits="Plain.step", fix=None))
    messages = w.enable()
    assert len(messages) == 1 and ":Plain.step not patched" in messages[0]


def test_an_inheriting_row_of_a_patched_base_is_warned_about(world):
    w = world()
    w.table(w.row("Base.step"), w.row("Override.step", inherits="Base.step", fix=None))
    assert w.enable() == ["tpu-closure-fix: %s:Override.step not patched: Override overrides step (expected to "
                          "inherit Base.step)" % w.mod]


def test_a_switched_off_integrations_skipped_site_is_not_warned_about(world):
    w = world()
    w.table(w.row("Plain.step"))
    w.monkeypatch.setenv("TPU_CLOSURE_FIX_DISABLE", "accelerate")
    settings.reload()
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        engine.enable()
    assert [str(m.message) for m in seen if m.category is TPUClosureFixWarning] == []


def test_a_module_function_site_gets_a_plain_function_wrapper(world):
    w = world()
    (row,) = w.table(w.row("optimizer_step", shape=GUARD))
    w.enable()
    patched = w.module.optimizer_step
    assert engine.is_ours(patched) and isinstance(patched, types.FunctionType)
    assert patched(types.SimpleNamespace(step=lambda **kwargs: kwargs), {"closure": 1}) == ("fixed", {"closure": 1})
    assert engine._state.patches[w.key("optimizer_step")][2] is not patched


def test_the_note_of_an_identical_release_is_kept_once_patched(world):
    w = world(release="3.0")
    w.table(w.row("Base.step", fingerprints=(("1.5", w.fingerprint("Base.step")),)))
    w.enable()
    assert w.decide("Base.step").reason == "3.0 not in the table; code identical to 1.5"


def test_an_error_in_the_shim_is_a_failure_never_an_exception(world, monkeypatch):
    w = world()
    (row,) = w.table(w.row("Base.step"))

    def broken(*args):
        raise ZeroDivisionError("boom")

    monkeypatch.setattr(engine, "_patch_site", broken)
    messages = w.enable()
    assert messages == ["tpu-closure-fix: %s:Base.step not patched, error in the shim: ZeroDivisionError: boom; "
                        "the original code is in place" % w.mod]
    assert engine._state.failures == {w.key("Base.step"): "ZeroDivisionError: boom"}


# --------------------------------------------------------------------------- the edges the rules above leave
def test_identity_is_never_asked_when_another_site_of_the_package_knows_the_release(world):
    """Rule 5 applies only to a release no row of the package names: here Plain's row names 3.0, so Base's
    identical code is still an unknown release for Base (rule 6), never "identical to 1.5"."""
    w = world(release="3.0")
    w.table(w.row("Plain.step", releases=">=3.0,<4"),
            w.row("Base.step", fingerprints=(("1.5", w.fingerprint("Base.step")),)))
    _enabled(w)
    finding = w.decide("Base.step")
    assert (finding.verdict, finding.site) == (engine.SKIPPED, None)
    assert finding.reason.startswith("unknown release 3.0 for this site (known: >=1.0,<2)")


def test_rule_4_a_base_row_left_untouched_for_its_shape_keeps_the_bases_reason(world):
    w, base, legacy = _legacy_world(world, base_shape=FIXED)  # identical code, but not the fix row's shape
    _enabled(w)
    assert w.decide("Legacy.step") == engine.Finding(
        engine.SKIPPED, "via %s.Base.step (3.0 not in the table): unexpected code shape: code lacks "
        "reduce_gradients; left untouched" % w.mod, base, "3.0", None)


def test_rule_4_a_base_whose_module_is_gone_says_not_imported_with_nothing_added(world):
    w = world(release="3.0")
    ghost = type("Ghost", (object,), {"step": vars(w.module.Base)["step"], "__module__": "tcf_rules_ghost_mod"})
    w.monkeypatch.setattr(w.module, "Child", type("Child", (ghost,), {"__module__": w.mod}), raising=False)
    (base, child) = w.table(w.row("Ghost.step", module="tcf_rules_ghost_mod"), w.row("Child.step"))
    assert w.decide("Child.step") == engine.Finding(
        engine.NOT_IMPORTED, "via tcf_rules_ghost_mod.Ghost.step (3.0 not in the table)", child, "3.0", None)


def test_passing_through_findings_keep_their_site_and_release(world):
    reason = "off; a wrapper it could not remove passes calls through to the original"
    w, base, legacy = _legacy_world(world)  # rule 4
    w.enable()
    engine._state.switch.on = False
    engine._state.disabled_reason = "off"
    assert w.decide("Legacy.step") == engine.Finding(engine.DISABLED, reason, legacy, "3.0", None)
    w, base, row = _inheriting(world)  # rule 8
    w.enable()
    engine._state.switch.on = False
    engine._state.disabled_reason = "off"
    assert w.decide("Legacy.step") == engine.Finding(engine.DISABLED, reason, row, "1.5", None)


def test_rule_4_fixed_upstream_base_checked_on_the_class_keeps_the_release(world, monkeypatch):
    w = world(release="3.0")
    helper = Shape(FIXED.params, varkw=False, requires=("reduce_gradients",), helpers=(("flush", ("a", "b")),))
    base, child = w.table(w.row("Fixed.step", shape=helper, fix=None,
                                fingerprints=(("1.5", w.fingerprint("Fixed.step")),)), w.row("FixedChild.step"))
    monkeypatch.setattr(w.module.Fixed, "flush", lambda self: (self.a, self.b), raising=False)
    monkeypatch.setattr(w.module.FixedChild, "flush", lambda self: (self.b, self.a), raising=False)
    finding = w.decide("FixedChild.step")
    assert (finding.verdict, finding.site, finding.release, finding.target) == (engine.SKIPPED, child, "3.0", None)


def test_our_wrapper_around_buggy_code_is_not_the_buggy_code(world):
    import functools

    w = world(release="3.0")
    w.table(w.row("Plain.step", releases=">=3.0,<4"), w.row("Base.step"))
    original = vars(w.module.Base)["step"]
    wrapper = functools.wraps(original)(lambda self, optimizer, closure=None: original(self, optimizer, closure))
    setattr(wrapper, engine.MARKER, "v")
    w.monkeypatch.setattr(w.module.Base, "step", wrapper)
    assert engine._has_buggy_shape(w.module.Base, "step", sites.CALL_SITES) is False
    assert w.decide("Base.step") == engine.Finding(engine.ABSENT, "", None, "3.0", None)
    assert engine._has_buggy_shape(None, "step", sites.CALL_SITES) is False


def test_rule_14_a_missing_class_is_never_guarded(world):
    w, g, site, xm = _guarded_world(world)
    w.table(g.row, site, site._replace(qualname="Missing.step", variant="missing"))
    w.enable()
    assert w.examine("Missing.step").verdict == engine.SKIPPED
    assert w.examine("Base.step").verdict == engine.GUARDED  # the twin: a class that exists


def test_rule_14_the_module_given_is_the_one_judged(world):
    w, g, site, xm = _guarded_world(world)
    w.enable()
    module = sys.modules.pop(w.mod)
    try:
        assert engine.examine(w.key("Base.step"), module).verdict == engine.GUARDED
        assert engine._site_function(w.key("Base.step"), module) is vars(module.Base)["step"]
    finally:
        sys.modules[w.mod] = module


def test_rule_14_integrations_that_cannot_guard_are_passed_over(world):
    """Before the guard that covers: one whose sites are not all patched, one whose covers() raises."""
    w, g, site, xm = _guarded_world(world)
    unpatched = types.SimpleNamespace(NAME="unpatched", covers=lambda f, guards: True,
                                      CALL_SITES=(w.row("gone", shape=GUARD, module="tcf_rules_never_imported"),))
    raising = types.SimpleNamespace(NAME="raising", CALL_SITES=(g.row,),
                                    covers=lambda f, guards: 1 / 0)
    w.monkeypatch.setattr(engine._integrations, "load", lambda: [unpatched, raising, g.integration])
    w.table(g.row, site, unpatched.CALL_SITES[0])
    w.enable()
    assert w.examine("Base.step").reason.endswith("its call goes through the patched guardint guard")


def test_patch_site_returns_the_patched_finding_for_the_module_given(world):
    w = world(release="3.0")
    (row,) = w.table(w.row("Base.step", fingerprints=(("1.5", w.fingerprint("Base.step")),)))
    _enabled(w)
    module = sys.modules.pop(w.mod)
    try:
        finding = engine._patch_site(w.key("Base.step"), module)
        assert finding == engine.Finding(engine.PATCHED, "3.0 not in the table; code identical to 1.5", row, "3.0",
                                         None)
        original = engine._state.patches[w.key("Base.step")][2]
        assert w.fix.prepared == [(row.variant, original)] and original is not vars(module.Base)["step"]
        assert engine._patch_module(module) == []  # already patched: nothing new
    finally:
        sys.modules[w.mod] = module


def test_patch_module_patches_the_module_given_under_the_name_given(world):
    w = world()
    (row,) = w.table(w.row("Base.step", module="tcf_rules_alias"))
    _enabled(w)
    assert engine._patch_module(w.module, "tcf_rules_alias") == [("tcf_rules_alias", "Base.step")]
    assert engine._state.processed == {"tcf_rules_alias": id(w.module)}
    assert engine.is_ours(vars(w.module.Base)["step"])


def test_a_failed_fix_is_judged_on_the_module_given(world):
    w = world()
    w.fix.unavailable = "no xla_model"
    (row,) = w.table(w.row("Base.step"))
    _enabled(w)
    module = sys.modules.pop(w.mod)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            finding = engine._patch_site(w.key("Base.step"), module)
    finally:
        sys.modules[w.mod] = module
    assert finding == engine.Finding(engine.FAILED, "fix unavailable: no xla_model", row, "1.5", None)


def test_each_site_warns_once_for_itself(world, monkeypatch):
    """One warning per site and cause: a second site's failure is warned about too."""
    w = world()
    w.fix.unavailable = "no xla_model"
    w.table(w.row("Base.step"), w.row("Override.step"), w.row("Plain.step"), w.row("Empty.step"))
    messages = w.enable()
    assert sorted(messages) == sorted([
        "tpu-closure-fix: %s:Base.step not patched: no xla_model" % w.mod,
        "tpu-closure-fix: %s:Override.step not patched: no xla_model" % w.mod,
        "tpu-closure-fix: %s:Plain.step not patched: unexpected code shape: code lacks optimizer_args, "
        "optimizer_step; left untouched" % w.mod,
        "tpu-closure-fix: %s:Empty.step not patched: Empty defines no step" % w.mod])


def test_two_shim_errors_are_two_warnings(world, monkeypatch):
    w = world()
    w.table(w.row("Base.step"), w.row("Override.step"))
    monkeypatch.setattr(engine, "_patch_site", lambda key, module: 1 / 0)
    assert len(w.enable()) == 2


def test_the_engine_log(world, caplog):
    """What the engine logs at debug and info level, exactly (TPU_CLOSURE_FIX_LOG shows it)."""
    import logging

    w = world()
    (row, disabled) = w.table(w.row("Base.step"), w.row("Plain.step", integration="optimum_neuron"))
    w.monkeypatch.setenv("TPU_CLOSURE_FIX_DISABLE", "optimum_neuron")
    settings.reload()
    with caplog.at_level(logging.DEBUG, logger="tpu_closure_fix"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        engine.enable()
        engine.disable("stop")
        engine._patch_site(w.key("Base.step"), None)
    messages = [(r.levelname, r.getMessage()) for r in caplog.records if r.name == "tpu_closure_fix"]
    assert messages == [
        ("DEBUG", "tpu-closure-fix: enabled; watching 1 module(s); integrations switched off: optimum_neuron"),
        ("INFO", "tpu-closure-fix: patched %s.Base.step (%s 1.5, variant %s)" % (w.mod, w.top, row.variant)),
        ("DEBUG", "tpu-closure-fix: %s:Plain.step not patched (TPU_CLOSURE_FIX_DISABLE names optimum_neuron): "
                  "unexpected code shape: code lacks optimizer_args, optimizer_step; left untouched" % w.mod),
        ("DEBUG", "tpu-closure-fix: %s:Base.step left alone: stop" % w.mod),
    ]
    caplog.clear()
    with caplog.at_level(logging.DEBUG, logger="tpu_closure_fix"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        w.monkeypatch.delenv("TPU_CLOSURE_FIX_DISABLE")
        settings.reload()
        engine.enable()
    assert caplog.records[0].getMessage() == "tpu-closure-fix: enabled; watching 1 module(s); integrations " \
                                             "switched off: none"


def test_a_warning_is_logged_once_and_warned_outside_the_helper(world, caplog):
    import logging

    w = world()
    w.table(w.row("Plain.step"))
    with caplog.at_level(logging.WARNING, logger="tpu_closure_fix"), warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        engine._warn_once(("test", w.mod), "a message %s")
        engine._warn_once(("test", w.mod), "a message %s")
    assert [r.getMessage() for r in caplog.records] == ["a message %s"]
    (warning,) = seen
    assert str(warning.message) == "a message %s"
    assert warning.filename != engine.__file__  # stacklevel=2: the line that called _warn_once, never its own


def test_split_qualname_and_is_ours():
    assert engine.split_qualname("A.B.method") == ("A.B", "method")
    assert engine.split_qualname("function") == (None, "function")

    class Refusing(object):
        def __getattr__(self, name):
            raise RuntimeError("no attributes here")

    assert engine.is_ours(Refusing()) is False
    marked = types.SimpleNamespace(**{engine.MARKER: "variant"})
    assert engine.is_ours(marked) is True and engine.is_ours(types.SimpleNamespace()) is False
    assert engine.is_ours(types.SimpleNamespace(**{engine.MARKER: None})) is False


def test_a_fresh_state_is_off():
    state = engine._State()
    assert state.enabled is False and state.switch.on is False and engine.Switch().on is False
    assert state.disabled_reason == "not enabled"


def test_resolved_follows_the_mro_and_refuses_non_classes(world):
    w = world()
    assert engine._resolved(w.module.Legacy, "step") == (w.module.Base, vars(w.module.Base)["step"])
    assert engine._resolved(w.module.Empty, "step") is None
    assert engine._resolved(object(), "step") is None


def test_rule_14_a_module_function_site_reaching_the_guard(world):
    w, g, site, xm = _guarded_world(world)
    w.table(g.row, site._replace(qualname="optimizer_step", variant="function"))  # not the row's shape: skipped
    w.enable()
    assert w.examine("optimizer_step").verdict == engine.GUARDED
    assert engine._site_function(w.key("optimizer_step"), None) is w.module.optimizer_step


def test_rule_14_a_class_without_the_method_is_never_guarded(world):
    w, g, site, xm = _guarded_world(world)
    w.table(g.row, site._replace(qualname="Empty.step", variant="empty"))
    w.enable()
    assert w.examine("Empty.step") == engine.Finding(engine.SKIPPED, "Empty defines no step",
                                                     sites.CALL_SITES[1], "1.5", None)


def test_a_base_patched_through_an_inheriting_key_keeps_its_own_note(world):
    """Legacy's key (judged as Base, rule 4) patches Base first: Base's own verdict still carries rule 5's note."""
    w, base, legacy = _legacy_world(world)
    w.table(legacy, base)  # Legacy's key first
    w.enable()
    assert w.decide("Base.step") == engine.Finding(engine.PATCHED, "3.0 not in the table; code identical to 1.5",
                                                   base, "3.0", None)


def test_the_log_names_every_integration_switched_off(world, caplog):
    import logging

    w = world()
    w.table(w.row("Base.step"))
    w.monkeypatch.setenv("TPU_CLOSURE_FIX_DISABLE", "optimum_neuron,accelerate")
    settings.reload()
    with caplog.at_level(logging.DEBUG, logger="tpu_closure_fix"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        engine.enable()
    assert caplog.records[0].getMessage() == "tpu-closure-fix: enabled; watching 1 module(s); integrations " \
                                             "switched off: accelerate, optimum_neuron"


# --------------------------------------------------------------------------- rule 6: a release found not affected
def _not_affected(w, qualname, releases="<1.0", forbids=("optimizer_args",), why="hands no closure to torch_xla"):
    entry = sites.NotAffected(w.top, w.mod, qualname, releases, forbids, why)
    w.monkeypatch.setattr(sites, "NOT_AFFECTED", (entry,))
    return entry


def test_rule_6_a_release_found_not_affected_whose_code_lacks_the_buggy_call_is_absent(world):
    w = world(release="0.9")
    w.table(w.row("Plain.step"))
    _not_affected(w, "Plain.step")
    assert w.decide("Plain.step") == engine.Finding(
        engine.ABSENT, "%s 0.9: hands no closure to torch_xla" % w.top, None, "0.9", None)


def test_rule_6_twin_not_affected_code_that_holds_the_buggy_call_is_an_unknown_release(world):
    w = world(release="0.9")
    w.table(w.row("Base.step"))
    _not_affected(w, "Base.step")  # the entry names the range, but this code passes optimizer_args
    finding = w.decide("Base.step")
    assert finding.verdict == engine.SKIPPED and finding.reason.startswith("unknown release 0.9"), finding


@pytest.mark.parametrize("releases, qualname", [(">=0.9.1,<1.0", "Plain.step"), ("<1.0", "Fixed.step")])
def test_rule_6_twin_an_entry_of_another_range_or_site_does_not_apply(world, releases, qualname):
    w = world(release="0.9")
    w.table(w.row("Plain.step"))
    _not_affected(w, qualname, releases=releases)
    finding = w.decide("Plain.step")
    assert finding.verdict == engine.SKIPPED and finding.reason.startswith("unknown release 0.9"), finding


def test_rule_6_not_affected_reads_the_code_under_a_wrapper(world):
    import functools

    w = world(release="0.9")
    w.table(w.row("Plain.step"))
    _not_affected(w, "Plain.step", forbids=("closure",))  # the original's own names: it has 'closure'
    assert w.decide("Plain.step").verdict == engine.SKIPPED
    original = w.module.Plain.step
    w.monkeypatch.setattr(w.module.Plain, "step", functools.wraps(original)(lambda *a, **k: original(*a, **k)))
    assert w.decide("Plain.step").verdict == engine.SKIPPED  # the wrapper's own code has no 'closure'
    _not_affected(w, "Plain.step", forbids=("no_such_name",))
    assert w.decide("Plain.step").verdict == engine.ABSENT


# --------------------------------------------------------------------------- a fix's caveat
# (a patched verdict with its caveat: test_rule_10_our_wrapper_is_patched_with_its_note_and_fix_caveat)
def test_a_patched_verdict_twin_without_a_caveat_says_only_its_note(world):
    w = world()
    (row,) = w.table(w.row("Base.step"))
    w.enable()
    assert w.decide("Base.step").reason == ""
    engine._state.notes[w.key("Base.step")] = "a note"
    assert w.decide("Base.step").reason == "a note"
