"""One decision for ``status`` and ``check`` (:func:`tpu_closure_fix.outcome.decide.decide`), rule by rule.

Each numbered rule is pinned by a payload it decides (outcome, exit code, rule number, the start of the reason)
and by its twin, the same payload with the rule's condition just false, which another rule decides: a verdict
swapped or a condition negated in a rule fails here. Then the pytorch-lightning 1.8.6 venv as pip resolves it
today (setuptools 84, no ``pkg_resources``): ``status`` and ``check`` give the same count and both name the
import failure. Last, each hop once: one fresh interpreter, its start-up hook inspected once per run.
"""
import argparse
import json

import pytest

from support.outcomes import check_outcome, evidence, status_outcome
from tpu_closure_fix import check, cli, sites
from tpu_closure_fix.outcome import decide, render
from tpu_closure_fix.outcome.records import IMPORT_FAILED, KNOWN_FIX
from tpu_closure_fix.verify import fresh

FABRIC = ("lightning_fabric.plugins.precision.xla", "XLAPrecision.optimizer_step")
TRAINER = ("pytorch_lightning.plugins.precision.tpu", "TPUPrecisionPlugin.optimizer_step")
SITE = "/venv/lib/python3.11/site-packages"
EVENTS_OK = {"ok": True, "error": None, "untested": [],
             "sites": [{"site": "%s:%s" % FABRIC, "verdict": "patched", "ok": True, "error": None,
                        "events": ["forward", "backward", "reduce_gradients", "step"]}]}
UNCOVERED = [{"file": "/x/a.py", "line": 3, "module": "a", "function": "C.step"}]


def facts(**changes):
    base = {"executable": "/venv/bin/python", "version": "3.11.7", "startup_loaded": True, "startup_armed": True,
            "shim_at_start": False, "switch": None, "flags": {}, "site_dirs": [SITE], "pth_in": [SITE],
            "shim_origin": SITE + "/tpu_closure_fix/__init__.py"}
    base.update(changes)
    return base


#: The facts of an interpreter whose start-up hook does not run (tpu_closure_fix installed with --target).
NO_HOOK = dict(startup_armed=False, shim_origin="/opt/deps/tpu_closure_fix/__init__.py", pth_in=[])


def record(verdict, site=FABRIC, reason="", distribution="lightning-fabric", release="2.6.6"):
    return {"distribution": distribution, "release": release, "module": site[0], "method": site[1],
            "verdict": verdict, "reason": reason, "variant": None, "integration": "lightning"}


def payload(*records, uncovered=(), beside=None, **fact_changes):
    return {"facts": facts(**fact_changes), "records": list(records), "uncovered": list(uncovered),
            "beside_script": {"directory": "/work", "found": beside or []}}


# --------------------------------------------------------------------------- each rule and its twin
BESIDE = [{"package": "pytorch_lightning", "path": "/work/pytorch_lightning", "release": "1.0.8"}]
BROKEN = record("failed", TRAINER, IMPORT_FAILED + "ModuleNotFoundError: No module named 'pkg_resources'")
#: rule -> (payload or None, error, the outcome, the start of its reason, its twin, the twin's rule)
RULES = {
    1: (None, "/venv/bin/python could not report: boom", "could not verify", "COULD NOT VERIFY: /venv/bin/python "
        "could not report: boom.", payload(), 3),
    2: (payload(record("patched"), beside=BESIDE), None, "could not verify", "COULD NOT VERIFY: pytorch_lightning "
        "1.0.8 at /work/pytorch_lightning", payload(record("patched")), 9),
    3: (payload(record("not installed")), None, "nothing to protect", "NOTHING TO PROTECT: no framework",
        payload(record("not installed"), uncovered=UNCOVERED), 6),
    4: (payload(record("patched"), **NO_HOOK), None, "unprotected", "UNPROTECTED: the start-up hook does not run in "
        "/venv/bin/python", payload(record("fixed upstream"), **NO_HOOK), 9),
    5: (payload(record("skipped", reason="unknown release 9.9")), None, "unprotected", "UNPROTECTED: 1 of 1 installed "
        "affected site(s) run the buggy code: %s:%s (skipped: unknown release 9.9)" % FABRIC,
        payload(record("guarded")), 9),
    6: (payload(record("patched"), uncovered=UNCOVERED), None, "could not verify", "COULD NOT VERIFY: /x/a.py:3 "
        "(a:C.step) holds an XLA optimizer step", payload(record("patched")), 9),
    7: (payload(record("patched"), BROKEN), None, "could not verify", "COULD NOT VERIFY: %s:%s cannot be imported "
        "(import failed: ModuleNotFoundError: No module named 'pkg_resources')" % TRAINER,
        payload(record("patched"), dict(BROKEN, reason="RuntimeError: boom")), 5),
    9: (payload(record("patched"), record("guarded", TRAINER)), None, "protected", "PROTECTED: every installed "
        "affected site is patched, guarded or fixed upstream (2 site(s)); start-up hook active.",
        payload(record("patched"), record("disabled", TRAINER, "TPU_CLOSURE_FIX=0")), 5),
}


@pytest.mark.parametrize("rule", sorted(RULES))
def test_each_rule_decides_its_payload_and_its_twin_goes_to_another_rule(rule):
    given, error, name, start, twin, twin_rule = RULES[rule]
    out = status_outcome(given, error)
    assert (out.name, out.exit_code, out.rule) == (name, decide.EXIT_CODES[name], rule), out.reason
    assert out.reason.startswith(start), out.reason
    other = status_outcome(twin)
    assert other.rule == twin_rule and other.rule != rule, (other.rule, other.reason)


def test_rule_1_names_a_copy_of_the_shim_that_could_not_list_the_sites():
    out = status_outcome({"facts": facts(error="ImportError: wrapt")})
    assert (out.name, out.rule) == ("could not verify", 1)
    assert out.reason.startswith("COULD NOT VERIFY: /venv/bin/python could not list its sites (ImportError: wrapt).")


def test_rule_2_a_scan_that_failed_is_no_verdict_either():
    given = payload(record("patched"))
    given["beside_script"]["error"] = "the scan of /work failed (PermissionError: denied)"
    out = status_outcome(given)
    assert (out.name, out.rule, out.reason) == ("could not verify", 2, "COULD NOT VERIFY: the scan of /work failed "
                                                                       "(PermissionError: denied).")


def test_rule_4_switched_off_is_the_records_word_not_the_start_up_hook_s():
    off = status_outcome(payload(record("disabled", reason="TPU_CLOSURE_FIX=0"), switch="0", startup_armed=False))
    assert (off.rule, off.name) == (5, "unprotected") and off.reason.endswith("Fix: `unset TPU_CLOSURE_FIX`.")


def test_rule_5_a_buggy_site_wins_over_an_uncovered_step_and_an_import_failure():
    out = status_outcome(payload(record("disabled", reason="TPU_CLOSURE_FIX=0"), BROKEN, uncovered=UNCOVERED))
    assert (out.name, out.rule) == ("unprotected", 5), out.reason


def test_rule_6_an_uncovered_step_wins_over_an_import_failure():
    assert status_outcome(payload(record("patched"), BROKEN, uncovered=UNCOVERED)).rule == 6


def test_rule_5_with_self_tests_a_buggy_order_seen_is_unprotected_and_a_skipped_site_run_right_is_not():
    buggy = dict(EVENTS_OK, sites=[dict(EVENTS_OK["sites"][0], ok=False, events=["reduce_gradients", "forward"])])
    out = check_outcome(payload(record("patched")), buggy)
    assert (out.name, out.rule) == ("unprotected", 5) and "the event-order self-test saw" in out.reason
    judged = check_outcome(payload(record("skipped", reason="unknown release 9.9")),
                           dict(EVENTS_OK, sites=[dict(EVENTS_OK["sites"][0], verdict="skipped")]))
    assert (judged.name, judged.rule) == ("protected", 9), judged.reason


def test_rule_8_a_self_test_that_could_not_run_is_could_not_verify_and_status_never_gets_there():
    given = payload(record("patched"))
    out = check_outcome(given, dict(EVENTS_OK, error="self-test process timed out"))
    assert (out.name, out.rule) == ("could not verify", 8), out.reason
    assert out.reason.startswith("COULD NOT VERIFY: the event-order self-test failed: self-test process timed out.")
    assert check_outcome(given, EVENTS_OK).rule == 9 and status_outcome(given).rule == 9  # the twins


def test_rule_9_protected_in_check_adds_the_self_tests_evidence_to_the_same_words():
    given = payload(record("patched"))
    said = status_outcome(given).reason
    out = check_outcome(given, EVENTS_OK, False)
    assert out.reason == said[:-1] + "; self-tests: event order right, XLA graph not checked (--no-graph).", out.reason


def test_the_rules_that_decide_before_the_self_tests_are_those_about_the_report_alone():
    assert decide.BEFORE_SELF_TESTS == (1, 2, 3, 4)
    for rule in decide.BEFORE_SELF_TESTS:
        given, error = RULES[rule][:2]
        assert status_outcome(given, error).rule == rule
    assert set(check.NOT_RUN) == set(decide.BEFORE_SELF_TESTS)


# --------------------------------------------------------------------------- pytorch-lightning 1.8.6, pip today
NO_PKG_RESOURCES = IMPORT_FAILED + "ModuleNotFoundError: No module named 'pkg_resources'" + KNOWN_FIX + \
    "pip install 'setuptools<81'"
#: The site modules pytorch-lightning 1.8.6 (and the lightning-lite 1.8.6 it pulls) install: every one fails to
#: import where setuptools 81 or later is installed (both import pkg_resources at start).
IN_1_8_6 = ("pytorch_lightning.core.lightning", "pytorch_lightning.core.optimizer",
            "pytorch_lightning.accelerators.tpu", "pytorch_lightning.plugins.precision.tpu",
            "pytorch_lightning.plugins.precision.tpu_bf16",
            "lightning_lite.plugins.precision.tpu", "lightning_lite.plugins.precision.tpu_bf16")


def _lightning_1_8_6_today():
    """The payload of that venv: its 7 site modules installed but failing to import, every other site absent."""
    records = []
    for module, method in sites.site_keys():
        if module in IN_1_8_6:
            owner = "lightning-lite" if module.startswith("lightning_lite") else "pytorch-lightning"
            records.append(record("failed", (module, method), NO_PKG_RESOURCES, distribution=owner, release=None))
        else:
            records.append(record("not installed", (module, method), release=None))
    return payload(*records)


def test_lightning_1_8_6_as_pip_resolves_it_today_status_and_check_say_the_same_count_and_name_the_failure():
    given = _lightning_1_8_6_today()
    # what the event-order child finds there: nothing it can import, so nothing it drives
    nothing_driven = {"ok": False, "error": None, "sites": [], "untested": []}
    said, checked = status_outcome(given), check_outcome(given, nothing_driven, False)
    assert said == checked, (said.reason, checked.reason)
    assert (said.name, said.exit_code, said.rule) == ("could not verify", 3, 7)
    assert "cannot be imported (import failed: ModuleNotFoundError: No module named 'pkg_resources') (and 6 more, " \
           "of 7 installed call site(s))" in said.reason, said.reason
    assert said.reason.endswith("Fix: `/venv/bin/python -m pip install 'setuptools<81'`."), said.reason
    # the texts: the same outcome, and check's self-test section names the import failure, never "no installed site"
    tests = decide.SelfTests(nothing_driven, False, None)
    status_text = " ".join(render.text(evidence(given), said, width=120).split())
    check_text = " ".join(render.text(evidence(given), checked, width=120,
                                      sections=check.self_test_sections(tests, given["records"])).split())
    assert " ".join(said.reason.split()) in status_text and " ".join(said.reason.split()) in check_text
    assert "nothing to test: 7 of 7 installed call site(s) cannot be imported (see the outcome)" in check_text
    assert "no installed call site" not in check_text
    assert status_text.count("failed (import failed: ModuleNotFoundError: No module named 'pkg_resources'") == 7


# --------------------------------------------------------------------------- each hop once
@pytest.fixture
def hook_calls(monkeypatch):
    calls = []
    real = fresh.startup_hook
    monkeypatch.setattr(fresh, "startup_hook", lambda given: calls.append(1) or real(given))
    return calls


def test_status_here_inspects_the_start_up_hook_once(hook_calls, capsys):
    assert cli.main(["status", "--here", "--json"]) in (0, 1, 3)
    out = json.loads(capsys.readouterr().out)
    assert out["startup_hook"]["active"] is None and len(hook_calls) == 1, hook_calls


@pytest.mark.parametrize("with_hook", [True, False])
def test_status_starts_one_interpreter_and_inspects_its_start_up_hook_once(monkeypatch, hook_calls, capsys, with_hook):
    """The child's answer is used as it came (its own inspection, in the child); a payload without one (another
    release of the shim) has it inspected here, once."""
    from types import SimpleNamespace

    from tpu_closure_fix.verify import child

    given = payload(record("patched"))
    if with_hook:
        given["startup_hook"] = {"active": True, "reason": "armed at interpreter start by the start-up module"}
    started = []
    monkeypatch.setattr(child, "run_child", lambda *a, **k: started.append(a) or SimpleNamespace(
        payload=json.loads(json.dumps(given)), error=None, timed_out=False))
    assert cli.main(["status", "--json"]) == 0
    assert len(started) == 1 and len(hook_calls) == (0 if with_hook else 1), (started, hook_calls)
    assert json.loads(capsys.readouterr().out)["outcome"] == "protected"


def test_check_starts_one_status_interpreter_and_inspects_the_hook_once(monkeypatch, hook_calls, capsys):
    from tpu_closure_fix.verify import events

    given = payload(record("patched"))
    runs = []
    monkeypatch.setattr(fresh, "run_status", lambda **kwargs: runs.append(kwargs) or (given, None))
    monkeypatch.setattr(events, "run_event_check", lambda **kwargs: EVENTS_OK)
    args = argparse.Namespace(python=None, timeout=10, script=None, json=True, no_graph=True, xla_python=None)
    assert check.run(args) == 0
    assert len(runs) == 1 and len(hook_calls) == 1
    out = json.loads(capsys.readouterr().out)
    assert out["reason"].startswith(status_outcome(given).reason[:-1]) and out["command"] == "check"
