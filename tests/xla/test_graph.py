"""Real-torch_xla evidence tier: ``tpu-closure-fix check`` and the traced graph of one step per site.

Runs in an environment built by ``scripts/xla_env.sh`` (torch_xla 2.1 + pytorch-lightning 1.8.6, or
torch_xla 2.9 + lightning-fabric / pytorch-lightning / lightning 2.6.6) on CPU
(``PJRT_DEVICE=CPU CPU_NUM_DEVICES=2``, replicas as threads).  For every call site the table
patched or verified there, the graph check builds one training step through that row's class and
method, lazily (every graph cut intercepted, no collective is ever executed: on CPU it would hang
or abort) and analyses the pending graph of the parameters:

* with the shim, every site holds exactly one ``xla::cross_replica_sum`` (HLO ``all-reduce``) fed
  by the backward ops and consumed by the SGD update; patched sites run the shim's wrapper,
  fixed-upstream sites (the 2.6.6 Trainer) run upstream's code, untouched;
* the twin, ``TPU_CLOSURE_FIX=0``: patched sites hold none and update from the local gradient,
  ``check`` exits 1 naming a patched site; fixed-upstream sites keep upstream's one all-reduce;
* the harness self-test: the upstream order written by hand gives the same graph as the shim;
* a graph check broken on purpose (torch_xla without any ordinal API) gives "could not verify",
  exit 3, with the exception line as the reason, in JSON (and in text on the 2.1 tier).
"""
import re

import pytest

from xla_tier import FIXED_UPSTREAM, PATCHED, SITES, TIMEOUT, TORCH_XLA, UNTESTED, XLA_PY, defined_where, \
    run_check, unavailable, xla_env
from tpu_closure_fix import sites as _sites
from tpu_closure_fix.verify import graph as graphcheck

AVAILABLE = TORCH_XLA is not None


@defined_where(not AVAILABLE)
def test_xla_environment_is_available():
    unavailable()


def check_on():
    return run_check("shim on", {"TPU_CLOSURE_FIX": "1"})


def check_off():
    return run_check("TPU_CLOSURE_FIX=0", {"TPU_CLOSURE_FIX": "0"})


_reference = {}


def reference():
    """The graph check in "reference" mode: shim off, upstream order by hand on the patchable sites."""
    if "res" not in _reference:
        # the sites the shim patches (their verdict with the shim off is "disabled")
        _reference["res"] = graphcheck.run_graph_check(TIMEOUT, python=XLA_PY, mode="reference",
                                                       env=xla_env({"TPU_CLOSURE_FIX": "0"}), verdicts=["disabled"])
    return _reference["res"]


def graph_site(out, site):
    sites = (out.get("graph_check") or {}).get("sites") or {}
    assert site in sites, "site %s not traced; graph check: %s" % (site, {k: v for k, v in (
        out.get("graph_check") or {}).items() if k != "sites"})
    return sites[site]


def describe(p):
    lines = ["impl=%s verdict=%s wrapped_by_shim=%s events=%s" % (p.get("impl"), p.get("verdict"),
                                                                   p.get("wrapped_by_shim"), p.get("events")),
             "all_reduce_count=%s hlo=%s operands_from_backward=%s update_consumes_all_reduce=%s error=%s" % (
                 p.get("all_reduce_count"), p.get("hlo_all_reduce_count"), p.get("operands_from_backward"),
                 p.get("update_consumes_all_reduce"), p.get("error")),
             "IR excerpt:"] + ["    " + line for line in p.get("excerpt", [])]
    return "\n".join(lines)


def index_of(events, prefix):
    for i, e in enumerate(events):
        if e.startswith(prefix):
            return i
    raise AssertionError("%r not in %s" % (prefix, events))


def row_of(site):
    module, qualname = site.split(":")
    rows = [r for r in _sites.CALL_SITES if r.module == module and r.qualname == qualname]
    assert rows, site
    return rows[0]


def expects_barrier(row):
    """Does the fixed order end with a graph cut?  As the row's fix describes its order (Lite 1.8's
    ``optimizer_step`` has none), or for upstream-fixed code, as its shape requires."""
    if row.fix is not None:
        return "mark_step" in row.fix.describe()
    return "mark_step" in row.shape.requires


def assert_one_all_reduce_from_backward_into_update(p):
    info = describe(p)
    assert not p.get("error"), info
    assert p["all_reduce_count"] == 1, info
    assert p["hlo_all_reduce_count"] == 1, info
    assert p["operands_from_backward"] is True, info
    assert p["update_consumes_all_reduce"] is True, info
    assert p["update_from_backward"] is True, info
    # both parameters (weight, bias) are updated from their own all-reduce output
    used = sorted(o for u in p["update_ops"] for o in u["all_reduce_outputs_used"])
    assert len(used) == 2 and len({o.split(".")[1] for o in used}) == 2, info
    assert all(o["backward_ops"] for o in p["all_reduce_operands"]), info
    assert p["replicas_agree"] is True, p["per_replica"]
    assert len(p["per_replica"]) == 2


# ------------------------------------------------------------------------------------ shim on

@defined_where(AVAILABLE)
def test_tier_has_a_patched_site():
    """Every tier carries at least one site the shim patches (else it would prove nothing about it)."""
    assert PATCHED, SITES


@defined_where(AVAILABLE)
def test_check_is_protected_exit_0():
    code, out, _ = check_on()
    assert (code, out["outcome"], out["exit_code"]) == (0, "protected", 0), out["reason"]
    assert out["ok"] is True
    # the count is of the interpreter's installed sites, as status gives it; the self-tests add what they traced
    assert re.match(r"PROTECTED: every installed affected site is patched, guarded or fixed upstream \((\d+) site\(s\)\); "
                    r"start-up hook [^;]*; self-tests: event order and XLA graph \(%d traced\) right" % len(SITES),
                    out["reason"]), out["reason"]
    assert int(re.search(r"\((\d+) site\(s\)\)", out["reason"]).group(1)) >= len(SITES) + len(UNTESTED), out["reason"]
    # a protected site no driver covers yet (the torch_xla guard) is named, never silently counted as tested
    for site in UNTESTED:
        assert site in out["reason"].split("without a self-test: ")[1], out["reason"]


@defined_where(AVAILABLE)
def test_check_traces_exactly_the_table_rows():
    """The graph check drives the class of the row that matched the loaded release: every installed
    site, each traced at the row's own module and class (no alias, no other class of that name)."""
    code, out, _ = check_on()
    traced = out["graph_check"]["sites"]
    assert sorted(traced) == sorted(SITES), out["graph_check"].get("error")
    assert sorted(u["site"] for u in out["graph_check"]["untested"]) == UNTESTED
    for site, p in traced.items():
        row = row_of(site)
        assert p["variant"] in {r.variant for r in _sites.rows_for(row.module, row.qualname)}, p["variant"]
        assert p["impl"] == "%s.%s" % (row.module, row.qualname.rsplit(".", 1)[0]), (site, p["impl"])
        assert p["verdict"] == SITES[site]


@defined_where(SITES)
@pytest.mark.parametrize("site", sorted(SITES))
def test_shim_one_all_reduce_fed_by_backward_and_feeding_update(site):
    code, out, _ = check_on()
    assert_one_all_reduce_from_backward_into_update(graph_site(out, site))


@defined_where(SITES)
@pytest.mark.parametrize("site", sorted(SITES))
def test_shim_reduces_after_backward_before_the_update(site):
    ev = graph_site(check_on()[1], site)["events"]
    assert index_of(ev, "training_step") < index_of(ev, "zero_grad") < index_of(ev, "backward"), ev
    assert index_of(ev, "backward") < index_of(ev, "xm.reduce_gradients"), ev
    assert "xm.reduce_gradients (2 grads present)" in ev, ev
    # where the fixed order cuts the graph after the step, that is the last event (recorded, never executed)
    if expects_barrier(row_of(site)):
        assert ev[-1].startswith("barrier ") and ev[-1].endswith("(intercepted, not executed)"), ev
    else:
        assert not any(e.startswith("barrier ") for e in ev), ev


@defined_where(PATCHED)
@pytest.mark.parametrize("site", PATCHED)
def test_patched_site_runs_the_shims_wrapper(site):
    p = graph_site(check_on()[1], site)
    assert (p["verdict"], p["wrapped_by_shim"]) == ("patched", True), describe(p)


@defined_where(FIXED_UPSTREAM)
@pytest.mark.parametrize("site", FIXED_UPSTREAM)
def test_fixed_upstream_site_is_untouched(site):
    """A release with upstream's fix (pytorch-lightning 2.6.6's Trainer) keeps its own code: not
    wrapped by the shim, and its graph shows upstream's single all-reduce."""
    p = graph_site(check_on()[1], site)
    assert (p["verdict"], p["wrapped_by_shim"]) == ("fixed upstream", False), describe(p)
    assert_one_all_reduce_from_backward_into_update(p)


@defined_where(AVAILABLE)
def test_check_event_self_test_covers_the_same_sites():
    out = check_on()[1]
    assert sorted(s["site"] for s in out["event_check"]["sites"]) == sorted(SITES), out["event_check"]
    assert all(s["ok"] for s in out["event_check"]["sites"]), out["event_check"]


# ------------------------------------------------------------------------ shim off (the twin)

@defined_where(AVAILABLE)
def test_check_without_the_shim_is_unprotected_and_names_the_site():
    code, out, _ = check_off()
    assert (code, out["outcome"], out["exit_code"]) == (1, "unprotected", 1), out["reason"]
    assert out["reason"].startswith("UNPROTECTED: "), out["reason"]
    named = [site for site in PATCHED if site in out["reason"]]
    assert named and "disabled" in out["reason"], out["reason"]


@defined_where(PATCHED)
@pytest.mark.parametrize("site", PATCHED)
def test_disabled_no_all_reduce_update_uses_local_gradient(site):
    p = graph_site(check_off()[1], site)
    info = describe(p)
    assert not p.get("error"), info
    assert p["verdict"] == "disabled" and p["wrapped_by_shim"] is False, info
    assert p["all_reduce_count"] == 0, info
    assert p["hlo_all_reduce_count"] == 0, info
    assert p["update_consumes_all_reduce"] is False, info
    # the update is still this step's backward: the local, unreduced gradient
    assert p["update_from_backward"] is True, info
    assert p["replicas_agree"] is True, p["per_replica"]


@defined_where(PATCHED)
@pytest.mark.parametrize("site", PATCHED)
def test_disabled_reduces_before_the_closure(site):
    ev = graph_site(check_off()[1], site)["events"]
    # the original order: xm.optimizer_step reduces the previous step's gradients, then the
    # closure recomputes them locally
    assert index_of(ev, "xm.reduce_gradients") < index_of(ev, "training_step") < index_of(ev, "backward"), ev
    # a graph cut, where the original has one (xm.optimizer_step(barrier=True)), only comes after the step
    assert all(i > index_of(ev, "backward") for i, e in enumerate(ev) if e.startswith("barrier ")), ev


@defined_where(FIXED_UPSTREAM)
@pytest.mark.parametrize("site", FIXED_UPSTREAM)
def test_disabled_leaves_the_upstream_fix_as_it_is(site):
    p = graph_site(check_off()[1], site)
    assert p["verdict"] == "fixed upstream" and p["wrapped_by_shim"] is False, describe(p)
    assert_one_all_reduce_from_backward_into_update(p)


# --------------------------------------------------------- harness self-test (no shim involved)

@defined_where(PATCHED)
@pytest.mark.parametrize("site", PATCHED)
def test_reference_order_gives_the_same_graph(site):
    """The upstream order applied by hand yields the same all-reduce placement as the shim."""
    res = reference()
    assert site in res.get("sites", {}), res.get("error")
    r, s = res["sites"][site], graph_site(check_on()[1], site)
    assert r["wrapped_by_shim"] is False, describe(r)
    assert r["all_reduce_count"] == 1 and r["operands_from_backward"] and r["update_consumes_all_reduce"], \
        describe(r)
    assert [u["all_reduce_outputs_used"] for u in r["update_ops"]] == \
        [u["all_reduce_outputs_used"] for u in s["update_ops"]]


# ------------------------------------------------- a graph check that cannot run: "could not verify"

#: Loaded at start-up of every child of the broken check (first on PYTHONPATH): in the graph
#: check's processes (PJRT_DEVICE=CPU) it removes every spelling of the replica-ordinal call, as
#: torch_xla 2.9 removed ``xm.get_ordinal``.
BROKEN_SITECUSTOMIZE = '''
import os
if os.environ.get("PJRT_DEVICE") == "CPU":
    import torch_xla.runtime as _runtime
    import torch_xla.core.xla_model as _xm
    for _owner, _name in ((_runtime, "global_ordinal"), (_xm, "get_ordinal")):
        if hasattr(_owner, _name):
            delattr(_owner, _name)
'''


def broken_check(tmp_path_factory, *args):
    folder = tmp_path_factory.mktemp("broken-torch-xla")
    (folder / "sitecustomize.py").write_text(BROKEN_SITECUSTOMIZE)
    return run_check("broken " + " ".join(args), {"TPU_CLOSURE_FIX": "1"}, args=args, pythonpath=[str(folder)])


REASON = re.compile(r"^COULD NOT VERIFY: the XLA graph check of (\S+): MissingXlaAPI: torch_xla \S+ has no replica "
                    r"ordinal \(looked for torch_xla\.runtime\.global_ordinal, torch_xla\.core\.xla_model\.get_ordinal\)"
                    r".* What you can do: .*--no-graph.*\.$")


@defined_where(AVAILABLE)
def test_broken_graph_check_is_could_not_verify_in_json(tmp_path_factory):
    code, out, _ = broken_check(tmp_path_factory, "--json")
    assert (code, out["outcome"], out["exit_code"], out["ok"]) == (3, "could not verify", 3, False), out["reason"]
    match = REASON.match(out["reason"])
    assert match and match.group(1) in SITES, out["reason"]
    # the self-test part still ran and passed: it is the graph check that could not verify
    assert out["event_check"]["ok"] is True, out["event_check"]


#: The text report is laid out by the same code on every tier: checked on the 2.1 tier only, whose check
#: runs in a third of the 2.9 tier's time (the JSON test above checks the verdict on both).
@defined_where(AVAILABLE and TORCH_XLA.split(".")[:2] == ["2", "1"])
def test_broken_graph_check_is_could_not_verify_in_text(tmp_path_factory):
    code, text, _ = broken_check(tmp_path_factory)
    lines = text.rstrip("\n").splitlines()
    assert code == 3, text[-3000:]
    last = [line for line in text.rstrip("\n").split("\n\n")[-1].splitlines()
            if not line.startswith("zero-code sync check:")]  # the sync check's line ends the text
    outcome = " ".join(" ".join(last).split())  # wrapped at 120 columns: one line again
    assert REASON.match(outcome), outcome
    assert all(len(line) <= 120 for line in lines), max(lines, key=len)
    # every section heading has something under it, here the reason the graph check failed
    for i, line in enumerate(lines):
        if line.endswith(":") and not line.startswith(" "):
            assert i + 1 < len(lines) and lines[i + 1].startswith("  ") and lines[i + 1].strip(), (line, text)
    heading = lines.index("XLA graph check (real torch_xla, collectives traced, never executed):")
    assert "could not trace: MissingXlaAPI" in "\n".join(lines[heading + 1:heading + 3]), text
    assert "UNPROTECTED" not in text
