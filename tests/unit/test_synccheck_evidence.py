"""SyncCheck's layout evidence without a scan of the live objects (tpu_closure_fix/synccheck/evidence.py): the DDP
and FSDP modules are recorded when they are made, module paths are read from the modules in reach of the step.

In process, fast: with ``gc.get_objects`` refused (it raises) a first check still fingerprints, places a DDP
module's parameters over its group and names tensors by module path; the first check's work, counted in Python
calls (never timed), is the same with 300,000 more live objects. Each has its twin: a scan of the live objects,
as the check made before, fails under the refusal and grows with the objects; a DDP or a model the check cannot
reach is not known (the documented limit). Over 2 gloo ranks (tests/support/pod_scenarios.py ``ddp-recorded``):
DDP on groups of one rank each is compared over its group, known only from its construction, with every scan
refused; its twin makes the DDP modules before SyncCheck is first imported.
"""
import gc
import sys
import types

import pytest

torch = pytest.importorskip("torch", reason="SyncCheck compares torch tensors: no torch here")

from support import features, ranks  # noqa: E402
from support import handed as handed_checks  # noqa: E402
from support.said import fresh, spoken  # noqa: E402
from tpu_closure_fix import synccheck  # noqa: E402,F401  (SyncCheck imported: the recording has begun)
from tpu_closure_fix.synccheck import comm, evidence, groups  # noqa: E402
from tpu_closure_fix.synccheck import hook as synchook  # noqa: E402

needs_step_hooks = features.needs_step_hooks()
#: Live objects added for the count of the first check's work.
MANY = 300000


@pytest.fixture(autouse=True)
def disarmed():
    synchook.disarm()
    fresh()
    yield
    synchook.disarm()
    fresh()


@pytest.fixture
def refused(monkeypatch):
    """Every scan of the live objects fails while the test runs; returns the list of attempts."""
    attempts = []

    def refuse(*args, **kwargs):
        attempts.append(args)
        raise RuntimeError("gc.get_objects() called: a scan of every live object")

    monkeypatch.setattr(gc, "get_objects", refuse)
    return attempts


@pytest.fixture
def handed(monkeypatch):
    """Every check goes to a list instead of the worker thread (the training thread's part runs as in a job)."""
    return handed_checks.hand_checks_to_a_list(monkeypatch)


def model_and_optimizer():
    model = torch.nn.Sequential(torch.nn.Linear(2, 3), torch.nn.Tanh(), torch.nn.Linear(3, 1))
    return model, torch.optim.SGD(model.parameters(), lr=0.1)


def step(optimizer):
    for group in optimizer.param_groups:
        for p in group["params"]:
            p.grad = torch.ones_like(p)
    optimizer.step()


def scan_for_module_paths(optimizer):
    """What the check did before: one pass over every live object for the modules holding the parameters."""
    wanted = {id(p) for group in optimizer.param_groups for p in group["params"]}
    found = {}
    for obj in gc.get_objects():
        if issubclass(type(obj), torch.nn.Module):
            for name, p in obj.named_parameters():
                if id(p) in wanted:
                    found[id(p)] = name
    return found


# --------------------------------------------------------------------------- no scan, the same decisions
@needs_step_hooks
def test_a_first_check_with_every_scan_refused_fingerprints_and_names_by_module_path(handed, refused):
    synchook.arm(1, "warn")
    model, optimizer = model_and_optimizer()
    with spoken() as seen:
        step(optimizer)  # the first check (before the update) and the one after step 1
    assert [job.pending.step for job in handed] == [0, 1] and seen == [] and refused == []
    assert handed[0].pending.error is None and handed[0].pending.layout.names == [
        "param_groups[0][%d]" % i for i in range(4)]
    stream = synchook._counts[id(optimizer)][0]  # what its reports name the tensors and the optimizer by
    assert stream.label == "SGD over 0.weight, 0.bias, 2.weight, and 1 more (in Sequential)"
    names = stream.naming("differ", ["param_groups[0][0]", "param_groups[0][3]"], [], [])[0]
    assert names == ["0.weight", "2.bias"]


def test_twin_a_scan_of_the_live_objects_fails_under_the_refusal(refused):
    _, optimizer = model_and_optimizer()
    with pytest.raises(RuntimeError, match="a scan of every live object"):
        scan_for_module_paths(optimizer)
    assert len(refused) == 1


def _recorded_ddp(monkeypatch, recorded=True):
    """A stand-in DDP module on the subgroup {2, 3} of a world of 4, made through a class that records its
    instances as SyncCheck's wrapped DistributedDataParallel does (``recorded=False``: one that does not)."""
    cls = type("DistributedDataParallel", (object,), {})
    if recorded:
        evidence.wrap(cls, "ddp")
    ddp = cls()
    ddp.module, ddp.process_group = torch.nn.Linear(2, 2), "subgroup"
    monkeypatch.setitem(sys.modules, "torch.distributed", types.SimpleNamespace(
        get_process_group_ranks=lambda g: [3, 2] if g == "subgroup" else [], get_world_size=lambda: 4))
    return ddp


def _placed(ddp):
    named = [("w", ddp.module.weight), ("free", torch.zeros(3))]
    layout = groups.Layout(named, 2, declared=groups.AUTO, ddp=groups.ddp_groups(named), world=4)
    return [layout.spans[k] for k in range(2)], layout.undecided


def test_a_ddp_module_recorded_at_construction_places_its_parameters_over_its_group(monkeypatch, refused):
    spans, undecided = _placed(_recorded_ddp(monkeypatch))
    # lanes: ("ranks", 4) one per lowest rank of a group, then ("world",); the free tensor decided at first look
    assert spans == [(0, 4), (4, 1)] and undecided == frozenset([1]) and refused == []


def test_twin_a_ddp_module_not_recorded_is_not_known_its_parameters_are_undecided(monkeypatch, refused):
    spans, undecided = _placed(_recorded_ddp(monkeypatch, recorded=False))
    assert spans == [(0, 1), (0, 1)] and undecided == frozenset([0, 1])


def test_the_torch_classes_are_wrapped_with_their_signatures_kept():
    import inspect

    import wrapt
    from torch.distributed.fsdp import FullyShardedDataParallel
    from torch.nn.parallel import DistributedDataParallel

    for cls in (DistributedDataParallel, FullyShardedDataParallel):
        init = cls.__dict__["__init__"]
        assert isinstance(init, wrapt.FunctionWrapper), cls
        assert inspect.signature(init) == inspect.signature(init.__wrapped__)


# --------------------------------------------------------------------------- module paths from the stack
class Loop(object):
    """A training loop as a class: the model is ``self.model``, one level below the stepping method's ``self``."""

    def __init__(self):
        self.model, self.optimizer = model_and_optimizer()

    def paths(self):
        return synchook._search_module_paths(self.optimizer)


def test_a_model_held_by_the_stepping_method_s_object_names_the_parameters(refused):
    by_old, holders = Loop().paths()
    assert by_old == {"param_groups[0][0]": "0.weight", "param_groups[0][1]": "0.bias",
                      "param_groups[0][2]": "2.weight", "param_groups[0][3]": "2.bias"}
    assert holders == {"Sequential"} and refused == []


_KEPT = {}


def test_twin_a_model_out_of_reach_of_the_stack_names_nothing_the_positions_stay():
    _KEPT["model"], optimizer = model_and_optimizer()  # alive, held by this module's globals alone
    try:
        assert synchook._search_module_paths(optimizer) == ({}, set())
        assert len(scan_for_module_paths(optimizer)) == 4  # a scan would have found it
    finally:
        _KEPT.clear()


def test_the_module_holding_most_parameters_names_each_a_submodule_in_reach_too_does_not(refused):
    model, _ = model_and_optimizer()
    layer = model[0]  # noqa: F841  (in reach of the stack: a candidate holding two of the four)
    found = evidence.holders(list(model.parameters()))
    assert sorted(name for name, _, _ in found.values()) == ["0.bias", "0.weight", "2.bias", "2.weight"]
    assert {held for _, held, _ in found.values()} == {4}


def _candidates_in_a_frame_of(module_name):
    """The candidates seen from a frame of a function defined in a module named ``module_name``, a
    model in its locals."""
    namespace = {"__name__": module_name, "evidence": evidence, "torch": torch, "sys": sys}
    exec("def look():\n    model = torch.nn.Linear(2, 2)\n    return model, evidence.candidates(sys._getframe())",
         namespace)
    model, found = namespace["look"]()
    return any(candidate is model for candidate in found)


def test_the_frames_of_the_shim_s_own_code_are_not_searched():
    assert _candidates_in_a_frame_of("tpu_closure_fix.synccheck.compare") is False


def test_twin_the_frame_of_a_user_s_function_is_searched():
    assert _candidates_in_a_frame_of("train") is True


def _recorded_is_a_candidate(kind):
    model = torch.nn.Linear(2, 2)  # out of reach of the frame searched below but for the record
    if kind is not None:
        evidence.record(kind, model)
    try:
        return any(candidate is model for candidate in evidence.candidates(None))
    finally:
        evidence._made[kind or "ddp"].discard(model)


@pytest.mark.parametrize("kind", ["ddp", "fsdp"])
def test_a_recorded_ddp_or_fsdp_module_is_a_candidate_out_of_reach_of_the_stack(kind):
    assert _recorded_is_a_candidate(kind) is True


def test_twin_the_same_module_not_recorded_is_not_a_candidate():
    assert _recorded_is_a_candidate(None) is False


class FlatParamHandleDouble(object):
    """Stands for FSDP's FlatParamHandle (only its identity is recorded)."""


class FullyShardedDouble(torch.nn.Module):
    """Stands for FSDP's module class: a module whose FSDP submodules each hold their handle in ``_handle``."""

    def __init__(self, inner=None, handle=None):
        super().__init__()
        self.inner = inner if inner is not None else torch.nn.Linear(2, 2)
        self._handle = handle


def _noted(monkeypatch, outer):
    monkeypatch.setattr(evidence, "_class_of", lambda kind: FullyShardedDouble if kind == "fsdp" else None)
    evidence.note(outer)
    return evidence.made("fsdp"), evidence.made("handle")


def test_an_fsdp_module_given_to_a_check_records_every_fsdp_module_inside_and_their_handles(monkeypatch):
    handles = [FlatParamHandleDouble(), FlatParamHandleDouble()]
    inner = FullyShardedDouble(handle=handles[1])
    outer = FullyShardedDouble(inner, handles[0])
    fsdp, recorded = _noted(monkeypatch, outer)
    assert {id(m) for m in fsdp} >= {id(outer), id(inner)} and {id(h) for h in recorded} >= {id(h) for h in handles}


def test_twin_a_plain_module_given_to_a_check_records_nothing(monkeypatch):
    handle = FlatParamHandleDouble()
    plain = torch.nn.Sequential(torch.nn.Linear(2, 2))
    plain._handle = handle
    fsdp, recorded = _noted(monkeypatch, plain)
    assert id(plain) not in {id(m) for m in fsdp} and id(handle) not in {id(h) for h in recorded}


# --------------------------------------------------------------------------- the first check's work
class Leaf(object):
    pass


def _calls_of(fn, live):
    """Python and builtin calls ``fn()`` makes, with ``live`` more live objects held meanwhile (collection off:
    the count holds only what ``fn`` does)."""
    held = [Leaf() for _ in range(live)]
    calls = [0]

    def count(frame, event, arg):
        if event in ("call", "c_call"):
            calls[0] += 1

    gc.collect()
    gc.disable()
    sys.setprofile(count)
    try:
        fn()
    finally:
        sys.setprofile(None)
        gc.enable()
    del held
    return calls[0]


def _first_check():
    _, optimizer = model_and_optimizer()
    return lambda: step(optimizer)  # its first check and the check after step 1


@needs_step_hooks
def test_the_first_check_s_work_does_not_grow_with_the_live_objects(handed):
    synchook.arm(1, "warn")
    _calls_of(_first_check(), 0)  # the first optimizer of the process imports what the checks use
    few, many = _calls_of(_first_check(), 0), _calls_of(_first_check(), MANY)
    assert len(handed) == 6 and all(job.pending.error is None for job in handed)
    assert many == few, (few, many)


def test_twin_a_scan_of_the_live_objects_grows_with_them():
    _, optimizer = model_and_optimizer()
    few, many = (_calls_of(lambda: scan_for_module_paths(optimizer), live) for live in (0, MANY))
    assert many - few >= MANY * 0.9, (few, many)  # about one call per live object


# --------------------------------------------------------------------------- 2 gloo ranks, every scan refused
@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    return ranks.run_ranks("ddp-recorded", 2, tmp_path_factory.mktemp("recorded"),
                           env={"TPU_CLOSURE_FIX_SYNC_CHECK": "1"})


@pytest.fixture(scope="module")
def late(tmp_path_factory):
    return ranks.run_ranks("ddp-recorded", 2, tmp_path_factory.mktemp("late"), args=["--variant", "late"])


def _by_case(run):
    return {r["case"]: r for r in run.reports}


ALONE = "no other rank holds it: its replica group is rank %d alone"


@needs_step_hooks
def test_a_ddp_job_is_checked_with_every_scan_refused_each_layout_decided(recorded):
    ranks.assert_all_ok(recorded)
    for run in recorded:
        assert run.result["walks"] == 0 and run.result["imported_before_ddp"]
        for case in ("alone", "world", "bare"):  # every zero-code check ran: none failed, none stood down
            assert run.result[case + "-stream"]["checks"] == 4 and run.result[case + "-stream"]["stood_down"] is None
        assert run.result["bare-stream"]["paths"]["param_groups[0][0]"] == "0.weight"
        assert run.result["alone-stream"]["paths"]["param_groups[0][0]"] == "module.0.weight"
    said = recorded[0].messages
    assert len(said) == 2 and [run.messages for run in recorded[1:]] == [[]], said
    assert "could not compare the replicas of SGD over module.0.weight" in said[0]
    assert "(in DistributedDataParallel)" in said[0] and ALONE % 0 in said[0]
    assert "SGD over 0.weight, 0.bias, 2.weight, and 1 more (in Sequential) differ bitwise" in said[1]


def test_a_ddp_recorded_at_construction_is_compared_over_its_group(recorded):
    for run in recorded:
        cases = _by_case(run)
        alone = cases["alone"]  # the inner module given: the DDP is known from its construction alone
        assert alone["outcome"] == "unverified" and alone["differing"] == []
        assert alone["not_compared"] == [[name, ALONE % run.rank] for name in ("0.weight", "0.bias", "2.weight",
                                                                                "2.bias")]
        assert cases["world"]["outcome"] == "identical"  # DDP over the world: its gradients all-reduced
        assert cases["bare"]["outcome"] == "differ"  # no DDP: compared over the world


def test_twin_a_ddp_made_before_synccheck_was_imported_is_not_known_unless_given(late):
    ranks.assert_all_ok(late)
    for run in late:
        cases = _by_case(run)
        assert not run.result["imported_before_ddp"] and run.result["walks"] == 0
        assert cases["alone"]["outcome"] == "differ"  # compared over the world: a false difference (the limit)
        given = cases["alone-given"]  # the DDP itself given to the check: recorded then
        assert given["outcome"] == "unverified" and all(reason == ALONE % run.rank
                                                         for _, reason in given["not_compared"])
