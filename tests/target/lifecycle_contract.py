"""The lifecycle contract every patched site family must keep, written once.

In the spirit of dd-trace-py's ``PatchTestCase``: the import / enable /
disable / reload orderings, the wrapper depth, a wrapper that disable() cannot
remove, objects held from before a reload, a fix that cannot be prepared and
the TPU_CLOSURE_FIX=0 twin are test methods of :class:`LifecycleContract`; a
site family inherits them with one small subclass (see test_lifecycle.py)::

    @defined_where(TARGET == "some-framework==1.2.3")
    class TestSomeFamily(LifecycleContract):
        family = "some-family"   # a support.families.Family subclass, by name

One child process runs every case of every family collected (support.lifecycle, forking per
case and per branch of the orderings); the tests read its records. What each
step must record -- the fixed, the original and the guarded order -- comes
from the family (support/families.py), written from the history of the code
it drives.

Orders where a reload ran while the shim was off and an enable followed leave
the subclasses that inherit the site (the bf16 precision classes) on the
unpatched class object from before the reload: there, and only there, the
shim says so in exactly one warning.
"""
import os
import sys

import pytest

from conftest import REPO, TESTS, base_purelib, target_dir
from support import lifecycle


def _run_families(names, folder):
    """One ``python -S -m support.lifecycle NAME OUT ...`` child for every family of ``names``, started in
    ``folder`` (nothing in it shadows a module), which holds their OUT files; returns {name: its records}."""
    import subprocess

    env = {k: v for k, v in os.environ.items() if k not in ("TPU_CLOSURE_FIX", "PYTHONWARNINGS")}
    env["PYTHONPATH"] = os.pathsep.join([REPO, target_dir(), base_purelib(), TESTS])
    outs = {name: folder / ("%s.jsonl" % name) for name in sorted(names)}
    args = [str(part) for name, out in outs.items() for part in (name, out)]
    proc = subprocess.run([sys.executable, "-S", "-m", "support.lifecycle"] + args, env=env,
                          capture_output=True, text=True, timeout=900 * len(outs), cwd=str(folder))
    assert proc.returncode == 0, proc.stderr[-4000:]
    import json

    records = {}
    for name, out in outs.items():
        with open(str(out)) as handle:
            records[name] = [json.loads(line) for line in handle]
    return records


#: {family: records}, from the one child that ran every family collected in this session
_RECORDS = {}


def _families_collected(session):
    """The families of the LifecycleContract subclasses among the session's tests."""
    return {item.cls.family for item in session.items
            if getattr(item, "cls", None) is not None and issubclass(item.cls, LifecycleContract)}


class LifecycleContract(object):
    """Inherit and set ``family`` (a name in support.families.FAMILIES)."""

    family = None

    @pytest.fixture(scope="class")
    @classmethod
    def family_obj(cls):
        from support import families

        return families.FAMILIES[cls.family]()

    @pytest.fixture(scope="class")
    @classmethod
    def records(cls, tmp_path_factory, request):
        if cls.family not in _RECORDS:  # the first family asked for runs them all, in one child
            names = _families_collected(request.session) | {cls.family}
            _RECORDS.update(_run_families(names, tmp_path_factory.mktemp("lifecycle")))
        records = _RECORDS[cls.family]
        errors = [r for r in records if "error" in r]
        assert not errors, errors
        return records

    @pytest.fixture(scope="class")
    @classmethod
    def cases(cls, records):
        return {r["case"]: r for r in records if r["case"] != "order"}

    # ------------------------------------------------------------------ helpers
    @staticmethod
    def events(family, kind, held=False, extra=()):
        return list(extra) + list(family.expected(kind, held))

    @staticmethod
    def patched(record):
        assert record["status"]["verdict"] == "patched", record["status"]

    # ------------------------------------------------------------------ orderings
    def test_every_ordering_was_walked(self, records):
        walked = sorted(r["order"] for r in records if r["case"] == "order")
        assert len(walked) == 45
        assert walked == sorted(list(o) for o in lifecycle.orders())

    def test_every_ordering_one_layer_and_the_right_order(self, records, family_obj):
        for r in (r for r in records if r["case"] == "order"):
            depth = lifecycle.expected_depth(r["order"])
            assert r["depth"] == depth, r
            if depth:
                assert r["events"] == self.events(family_obj, "fixed"), r
                assert r["status"]["verdict"] == "patched", r
            else:
                assert r["events"] == self.events(family_obj, "original"), r
                assert r["status"]["verdict"] == "disabled", r

    def test_orderings_never_warn(self, records, family_obj):
        """No ordering warns: a subclass left on a class object from before a reload (reloaded while the
        shim was off, then enabled) is patched at the method it really resolves, so there is nothing to
        warn about."""
        for r in (r for r in records if r["case"] == "order"):
            assert r["warnings"] == [], r

    # ------------------------------------------------------------------ depth and exact restore
    def test_enable_twice_one_layer_disable_restores_the_exact_original(self, cases, family_obj):
        case = cases["enable-disable"]
        assert case["enable_twice"] == {"depth": 1, "is_original": False, "wraps_original": True}
        for stage in ("disable", "disable_twice"):
            assert case[stage] == {"depth": 0, "is_original": True, "wraps_original": True}, stage
        assert case["enable_again"] == {"depth": 1, "is_original": False, "wraps_original": True}
        assert case["events"] == self.events(family_obj, "fixed")
        assert case["warnings"] == []

    # ------------------------------------------------------------------ the switch
    def test_switch_off_twin(self, cases, family_obj):
        """TPU_CLOSURE_FIX=0: nothing wrapped, the release's own order, reported as disabled."""
        case = cases["switch-off"]
        assert case["enabled"] is False and case["depth"] == 0
        assert case["events"] == self.events(family_obj, "original")
        assert case["status"]["verdict"] == "disabled" and "TPU_CLOSURE_FIX=0" in case["status"]["reason"]
        assert case["warnings"] == []

    def test_wrapper_under_another_library_becomes_a_pass_through(self, cases, family_obj):
        """disable() cannot take our wrapper out from under another library's: it must pass calls
        through (the release's order), be reported disabled, and work again after enable()."""
        case = cases["wrapped-on-top"]
        other = ("other-library",)
        assert case["ours_patched"]
        assert case["enabled"]["depth"] == 2  # the other library's layer over ours, no third one
        assert case["enabled"]["events"] == self.events(family_obj, "fixed", extra=other)
        self.patched(case["enabled"])
        disabled = case["disabled"]
        assert disabled["ours_still_inside"] and disabled["depth"] == 2
        assert disabled["events"] == self.events(family_obj, "original", extra=other)
        assert disabled["status"]["verdict"] == "disabled", disabled["status"]
        assert case["enabled_again"]["depth"] == 2
        assert case["enabled_again"]["events"] == self.events(family_obj, "fixed", extra=other)
        self.patched(case["enabled_again"])
        assert case["warnings"] == []

    def test_object_held_from_before_a_reload_follows_the_switch(self, cases, family_obj):
        """A reload replaces the site; objects built before it keep our old wrapper, which disable()
        cannot reach: off, it passes through to the original; on again, it fixes."""
        case = cases["held-across-reload"]
        fixed_held = self.events(family_obj, "fixed", held=True)
        original_held = self.events(family_obj, "original", held=True)
        assert case["held"] == fixed_held and case["replaced"]
        reloaded = case["reloaded"]
        assert reloaded["new"]["depth"] == 1 and reloaded["new"]["events"] == self.events(family_obj, "fixed")
        self.patched(reloaded["new"])
        assert reloaded["held"] == fixed_held
        disabled = case["disabled"]
        assert disabled["new"]["depth"] == 0
        assert disabled["new"]["events"] == self.events(family_obj, "original")
        assert disabled["new"]["status"]["verdict"] == "disabled"
        assert disabled["held"] == original_held
        again = case["enabled_again"]
        assert again["new"]["depth"] == 1 and again["new"]["events"] == self.events(family_obj, "fixed")
        self.patched(again["new"])
        assert again["held"] == fixed_held
        if family_obj.warns_when_enabled_late:  # steps ran unfixed while it was off: said once, on enable()
            assert len(case["warnings"]) == 1 and "already taken" in case["warnings"][0], case["warnings"]
        else:
            assert case["warnings"] == []

    # ------------------------------------------------------------------ faults
    def test_fix_that_cannot_be_prepared_leaves_the_original(self, cases, family_obj):
        """Its site keeps the release's function (depth 0), status says failed and why, one warning.
        Its calls still go through the torch_xla guard where the family has one."""
        case = cases["fix-unavailable"]
        assert case["depth"] == 0
        kind = "guarded" if family_obj.guarded is not None else "original"
        assert case["events"] == self.events(family_obj, kind)
        # Under the patched guard the site is protected and reported so (guarded, naming its failed fix);
        # without one it is reported failed.
        assert case["status"]["verdict"] == ("guarded" if family_obj.guarded is not None else "failed"), case["status"]
        assert "RuntimeError: injected fault in prepare()" in case["status"]["reason"]
        assert len(case["warnings"]) == 1 and "injected fault" in case["warnings"][0], case["warnings"]
