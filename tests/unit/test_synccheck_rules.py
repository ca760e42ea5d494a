"""SyncCheck's verdict rules, one by one, in one process: N ranks as threads exchanging through memory.

``compare.run`` and ``compare.decide`` run exactly as on a pod; only the channel is an in-memory one
(``support.thread_ranks.ThreadChannel``: its all-reduce is the element-wise MAX of the ranks' vectors,
its all-gather their list), so every numbered rule of ``decide`` -- and the history, the layout of replica groups and
who speaks -- is asserted in milliseconds, each with the neighbouring case that must not trigger it.
The same rules over real gloo processes: tests/unit/test_synccheck_replicas.py and test_synccheck_pod.py.
"""
import importlib
import sys
import threading
import types

import pytest

torch = pytest.importorskip("torch", reason="SyncCheck compares torch tensors: no torch here")

from tpu_closure_fix.synccheck import comm, compare, decisions, fingerprint, groups, report  # noqa: E402

from support.said import fresh, said  # noqa: E402
from support.thread_ranks import ThreadChannel, ThreadWorld, fit, run_threads  # noqa: E402

#: The zero-code hook is torch's global optimizer step hook, which torch 2.0 introduced.
needs_step_hooks = pytest.mark.skipif(
    not hasattr(importlib.import_module("torch.optim.optimizer"), "register_optimizer_step_post_hook"),
    reason="the zero-code SyncCheck needs torch >= 2.0 (its global step hooks); torch %s here" % torch.__version__)


def on_ranks(size, build, steps=None, streams=None):
    """Run ``compare.run`` on ``size`` thread-ranks; ``build(rank)`` gives what each rank compares.
    Returns the reports (and the channels) by rank."""
    world = ThreadWorld(size)
    out, channels, errors = [None] * size, [None] * size, []

    def rank_main(rank):
        try:
            channels[rank] = ThreadChannel(world, rank)
            stream = streams[rank] if streams else compare.Stream("test")
            step = steps[rank] if steps else 1
            out[rank] = compare.run(build(rank), step, stream, channel=channels[rank])
        except Exception as exc:  # reported below, with the rank
            errors.append((rank, exc))
            world.barrier.abort()

    run_threads(size, rank_main)
    assert not errors, errors
    return out, channels


def model(seed=0, n=3):
    gen = torch.Generator().manual_seed(seed)
    return [("layer%d.weight" % i, torch.randn(4, 3, generator=gen)) for i in range(n)]


# --------------------------------------------------------------------------- the rules of decide, in order
def test_rule_1_another_format_is_unverified(monkeypatch):
    original = fingerprint._header

    def header(*args, **kwargs):
        values = original(*args, **kwargs)
        if threading.current_thread().name.endswith("-1"):
            values[0] = 99.0
        return values

    monkeypatch.setattr(fingerprint, "_header", header)
    world = ThreadWorld(2)
    out = [None, None]

    def rank_main(rank):
        out[rank] = compare.run(model(), 1, compare.Stream("t"), channel=ThreadChannel(world, rank))

    run_threads(2, rank_main)
    assert [r.outcome for r in out] == ["unverified"] * 2
    assert out[0].reason == "the replicas run different SyncCheck formats"


def test_rule_2_a_replica_that_cannot_list_makes_every_replica_unverified():
    reports, _ = on_ranks(2, lambda r: model() if r == 0 else object())
    assert [r.outcome for r in reports] == ["unverified"] * 2
    assert reports[0].reason == "another replica could not list or fingerprint its parameters"
    assert "object" in reports[1].reason and "not a tensor" not in reports[0].reason


def test_rule_2_twin_listable_on_every_replica_is_compared():
    reports, _ = on_ranks(2, lambda r: model())
    assert [r.outcome for r in reports] == ["identical"] * 2


def test_rule_3_ranks_at_different_steps_are_out_of_step_and_named():
    reports, channels = on_ranks(3, lambda r: model(), steps=[5, 5, 7])
    assert [r.outcome for r in reports] == ["out_of_step"] * 3
    assert reports[0].reason == "ranks 0-1 at step 5; rank 2 at step 7"
    assert not reports[0].diverged and channels[0].gathers == 1


def test_rule_3_twin_same_step_compares():
    reports, channels = on_ranks(3, lambda r: model(), steps=[5, 5, 5])
    assert [r.outcome for r in reports] == ["identical"] * 3 and channels[0].gathers == 0


def test_rule_4_nothing_to_compare_on_some_replica_is_unverified_never_identical():
    reports, _ = on_ranks(2, lambda r: model() if r == 0 else [])
    assert [r.outcome for r in reports] == ["unverified"] * 2
    assert reports[0].reason == "no parameter tensors to compare on some replica"
    exhausted = iter(())
    reports, _ = on_ranks(2, lambda r: exhausted)
    assert reports[0].outcome == "unverified" and reports[0].reason == "no parameter tensors to compare on every replica"


def test_rule_5_structure_count_shape_dtype():
    reports, _ = on_ranks(2, lambda r: model(n=3 if r == 0 else 2))
    assert reports[0].outcome == "structure" and "number of parameter tensors differs (2 on some" in reports[0].structure
    reports, _ = on_ranks(2, lambda r: [("w", torch.zeros(3 if r == 0 else 4))])
    assert reports[0].outcome == "structure" and "'w' has another shape" in reports[0].structure
    reports, _ = on_ranks(2, lambda r: [("w", torch.zeros(3, dtype=torch.float32 if r == 0 else torch.float64))])
    assert reports[0].outcome == "structure" and "dtype" in reports[0].structure
    assert reports[0].diverged


def test_rule_6_differ_names_exactly_the_tensor_and_the_ranks():
    def build(rank):
        named = model()
        if rank == 3:
            named[1][1][0, 0] += 1e-3
        return named

    reports, channels = on_ranks(4, build)
    for r in reports:
        assert r.outcome == "differ" and [r.names[i] for i in r.differing] == ["layer1.weight"]
        assert r.versions == [[0, 1, 2], [3]] and r.diverged
    assert abs(reports[0].spread[1] - 1e-3) < 1e-6 and channels[0].gathers == 1
    assert "ranks 0-2 hold one version; rank 3 holds another" in reports[0].message()


def test_rule_6_one_of_many_tensors_sharing_a_slot_is_named_alone():
    def build(rank):
        named = [("t%d" % i, torch.full((2,), float(i))) for i in range(3000)]
        if rank == 1:
            named[1476] = ("t1476", torch.full((2,), -1.0))
        return named

    reports, _ = on_ranks(2, build)
    assert [reports[0].names[i] for i in reports[0].differing] == ["t1476"]
    assert "1 of 3000 parameter tensors differ" in reports[0].message()


@pytest.mark.parametrize("position,delta,half", [(5, 2421, "lo"), (1, 3614, "hi")])
def test_rule_6_a_change_seen_in_one_half_of_the_slot_hash_only_is_a_difference(position, delta, half):
    """Changes whose 32-bit hash differs only in its low (or only in its high) 16 bits: each half decides."""
    base = torch.arange(64, dtype=torch.float32) / 7
    changed = base.clone()
    changed.view(torch.int32)[position] += delta
    before, after = (fingerprint.unsigned32(fingerprint.bit_hash(t, 0)) for t in (base, changed))
    same = (before >> 16 == after >> 16) if half == "lo" else (before & 0xFFFF == after & 0xFFFF)
    assert same and before != after, "the planted change no longer hits one half only"
    reports, _ = on_ranks(2, lambda r: [("w", changed if r == 1 else base.clone())])
    assert reports[0].outcome == "differ" and reports[0].differing == [0]


def test_rule_6_nan_on_some_replicas_only_differs_with_no_finite_measure():
    def build(rank):
        w = torch.ones(4)
        if rank == 1:
            w[2] = float("nan")
        return [("w", w)]

    reports, _ = on_ranks(2, build)
    assert reports[0].outcome == "differ" and reports[0].nonfinite == [0]
    assert reports[0].spread[0] == float("inf")


def test_rule_7_the_same_nan_everywhere_is_nonfinite_not_divergence():
    reports, _ = on_ranks(2, lambda r: [("w", torch.tensor([1.0, float("nan")]))])
    assert reports[0].outcome == "nonfinite" and not reports[0].diverged and reports[0].nonfinite == [0]


def test_rule_8_identical():
    reports, channels = on_ranks(2, lambda r: model())
    assert reports[0].outcome == "identical" and not reports[0].diverged and channels[0].gathers == 0


# --------------------------------------------------------------------------- history: started different, diverged between
def test_a_difference_before_the_first_update_is_started_different_later_it_is_diverged_between():
    streams = [compare.Stream("s"), compare.Stream("s")]
    first, _ = on_ranks(2, lambda r: model(seed=r), streams=streams, steps=[0, 0])
    assert first[0].started_different and "before the first optimizer step: the replicas started different" in \
        first[0].message()
    # only its own causes: no update was applied yet, so no gradient reduction is named
    assert "same seed on every replica" in first[0].message()
    assert "did not apply the same update" not in first[0].message() and "tpu-closure-fix" not in first[0].message()
    streams = [compare.Stream("s"), compare.Stream("s")]
    same, _ = on_ranks(2, lambda r: model(), streams=streams, steps=[0, 0])
    assert same[0].outcome == "identical" and streams[0].identical_at == 0
    later, _ = on_ranks(2, lambda r: model(seed=r), streams=streams, steps=[1, 1])
    assert not later[0].started_different and later[0].identical_at == 0
    assert "between the start (identical before the first optimizer step) and step 1" in later[0].message()
    assert "did not apply the same update" in later[0].message() and "same seed" not in later[0].message()
    still, _ = on_ranks(2, lambda r: model(seed=r), streams=streams, steps=[5, 5])
    assert "at step 5, different since step 1; identical before the first optimizer step" in still[0].message()
    assert still[0].different_since == 1 and still[0].identical_at == 0
    again, _ = on_ranks(2, lambda r: model(), streams=streams, steps=[10, 10])
    last, _ = on_ranks(2, lambda r: model(seed=r), streams=streams, steps=[20, 20])
    assert "between step 10 (identical) and step 20" in last[0].message()


def test_a_first_check_after_updates_claims_no_cause():
    first, _ = on_ranks(2, lambda r: model(seed=r), steps=[1, 1])
    assert first[0].first_check and not first[0].started_different
    assert "at step 1, the first check (the replicas started different or diverged by then)" in first[0].message()


def test_no_history_is_kept_for_objects_that_cannot_be_weakly_referenced():
    stream = compare._stream_of([torch.ones(1)])
    assert stream.checks == -1 and compare._stream_of({}) is not stream


def test_a_check_not_every_rank_agreed_to_stands_down_and_enters_no_collective():
    world = ThreadWorld(2)
    channel = ThreadChannel(world, 0, agree=False)
    with pytest.raises(comm.StoodDown) as info:
        compare.run(model(), 1, compare.Stream("probe"), channel=channel)
    assert "not every rank reached this check" in str(info.value) and world.values == [None, None]


# --------------------------------------------------------------------------- replica groups
def test_neuron_parameters_are_compared_within_their_data_parallel_group_only(monkeypatch):
    state = types.ModuleType(groups.NEURON_STATE)
    state.model_parallel_is_initialized = lambda: True
    state.get_data_parallel_replica_groups = lambda: [[0, 2], [1, 3]]
    monkeypatch.setitem(sys.modules, groups.NEURON_STATE, state)

    def build(rank, changed=None):
        shard = torch.full((2, 3), float(rank % 2))  # tensor-parallel shards: rank 0 and 1 differ by design
        if rank == changed:
            shard = shard + 1
        return [("mlp.dense.weight", shard)]

    reports, channels = on_ranks(4, build)
    assert [r.outcome for r in reports] == ["identical"] * 4
    assert [c.gathers for c in channels] == [0] * 4  # each tp shard in slots of its own: nothing to resolve
    reports, _ = on_ranks(4, lambda r: build(r, changed=3))
    assert reports[0].outcome == "differ" and reports[0].versions == [[1], [3]]


def test_neuron_groups_that_are_not_symmetric(monkeypatch):
    state = types.ModuleType(groups.NEURON_STATE)
    state.model_parallel_is_initialized = lambda: True
    state.get_data_parallel_replica_groups = lambda: [[0, 3], [1, 4], [2, 5]]
    monkeypatch.setitem(sys.modules, groups.NEURON_STATE, state)
    reports, _ = on_ranks(6, lambda r: [("w", torch.full((2,), float(r % 3)))])
    assert [r.outcome for r in reports] == ["identical"] * 6


def test_plain_tensors_are_compared_over_the_whole_world():
    reports, _ = on_ranks(4, lambda r: [("mlp.dense.weight", torch.full((2, 3), float(r % 2)))])
    assert reports[0].outcome == "differ" and reports[0].versions == [[0, 2], [1, 3]]


def test_flat_shards_are_not_compared_and_said_so():
    class FlatParameter(torch.nn.Parameter):
        pass

    def build(rank):
        return [("w", torch.ones(3)), ("_flat_param", FlatParameter(torch.full((4,), float(rank))))]

    reports, _ = on_ranks(2, build)
    assert reports[0].outcome == "identical" and reports[0].not_compared == [("_flat_param", groups.FLAT_SHARD)]


# --------------------------------------------------------------------------- who speaks
def _differ():
    return report.SyncReport(5, 4, "threads", ["w"], outcome="differ", differing=[0], spread=[1.0], divergence=[1.0])


@pytest.mark.parametrize("rank,warned", [(0, 1), (1, 0), (3, 0)])
def test_only_rank_0_warns_about_a_divergence(rank, warned):
    with said() as heard:
        report.act(_differ(), "warn", rank=rank)
    assert len(heard.spoken) == warned
    assert len([m for m in heard.quiet if "hold different parameters" in m]) == 1 - warned  # logged, not said


@pytest.mark.parametrize("rank,warned", [(0, 1), (1, 0)])
def test_only_rank_0_says_the_replicas_agree_on_nonfinite_values(rank, warned):
    agreed = report.SyncReport(5, 4, "threads", ["w"], outcome="nonfinite", nonfinite=[0])
    with said() as heard:
        report.act(agreed, "raise", rank=rank)  # never raised: the replicas agree
    assert len(heard.spoken) == warned


@pytest.mark.parametrize("rank", [0, 1])
def test_every_rank_raises(rank):
    with pytest.raises(report.ReplicaDivergenceError):
        report.act(_differ(), "raise", rank=rank)


def test_rank_ranges_are_compact():
    assert report.rank_ranges([5, 0, 1, 2, 7, 8, 63]) == "0-2, 5, 7-8, 63"
    assert report.rank_ranges([3]) == "3"


def test_checks_run_at_the_first_step_then_every_n():
    assert [s for s in range(0, 31) if compare.due(s, 10)] == [0, 1, 10, 20, 30]
    assert [s for s in range(1, 4) if compare.due(s, 1)] == [1, 2, 3]


# --------------------------------------------------------------------------- one process: counting only
@needs_step_hooks
def test_a_process_without_a_process_group_only_counts(monkeypatch):
    from tpu_closure_fix.synccheck import hook

    calls = []
    monkeypatch.setattr(fingerprint, "local_vector", lambda *a, **k: calls.append(a))
    monkeypatch.setattr(groups, "Layout", lambda *a, **k: calls.append(a))
    net = torch.nn.Linear(3, 2)
    optimizer = torch.optim.SGD(net.parameters(), lr=0.1)
    hook.arm(1)
    try:
        assert hook.armed_every() == 1
        for _ in range(3):
            net(torch.ones(1, 3)).sum().backward()
            optimizer.step()
        stream, steps = hook._counts[id(optimizer)]
        assert steps == [3] and stream.checks == 0 and calls == []
    finally:
        hook.disarm()
    assert hook.armed_every() == 0


@needs_step_hooks
def test_twin_with_a_channel_every_due_step_is_checked(monkeypatch):
    from tpu_closure_fix.synccheck import hook

    checked = []
    monkeypatch.setattr(comm, "channel", lambda timeout=None: types.SimpleNamespace(rank=0, size=2))
    monkeypatch.setattr(compare, "run", lambda obj, step, stream, channel=None: checked.append(step) or
                        report.SyncReport(step, 2, "fake", []))
    net = torch.nn.Linear(3, 2)
    optimizer = torch.optim.SGD(net.parameters(), lr=0.1)
    hook.arm(2)
    try:
        for _ in range(5):
            net(torch.ones(1, 3)).sum().backward()
            optimizer.step()
    finally:
        hook.disarm()
    assert checked == [0, 1, 2, 4]


def test_the_check_runs_on_a_group_of_its_own_never_the_default_one(monkeypatch):
    """One ProcessGroupGloo, built over a prefix of the default group's store (no new_group), carries every
    collective of the check."""
    calls = []

    class Work(object):
        def wait(self):
            return True

    class Own(object):
        def allreduce(self, tensors, options):
            calls.append(("allreduce", options.reduceOp, len(tensors)))
            return Work()

        def allgather(self, out, tensors):
            calls.append(("allgather", len(out[0]), len(tensors)))
            for copy in out[0]:
                copy.copy_(tensors[0])
            return Work()

    class Dist(object):
        class ReduceOp(object):
            MAX = "max"

        class AllreduceOptions(object):
            reduceOp = None

        class distributed_c10d(object):
            _get_default_group = staticmethod(lambda: "default")
            _get_default_store = staticmethod(lambda: "store")

        def get_rank(self):
            return 0

        def get_world_size(self):
            return 2

        def PrefixStore(self, prefix, store):
            calls.append(("prefix", prefix.startswith(comm.KEY_PREFIX + "group/call/"), store))
            return "prefixed"

        def ProcessGroupGloo(self, store, rank, size, timeout):
            calls.append(("gloo", store, rank, size, timeout.total_seconds()))
            return Own()

        def new_group(self, *args, **kwargs):
            calls.append(("new_group",))

        def all_reduce(self, *args, **kwargs):
            calls.append(("all_reduce on the default group",))

    monkeypatch.setattr(comm, "_groups", {})
    channel = comm.DistributedChannel(Dist(), timeout=5)
    channel.all_reduce_max(torch.zeros(3))
    monkeypatch.setattr(comm, "GATHER_RANKS", 1)  # above it: gloo's all-reduce, on the same group
    channel.all_reduce_max(torch.zeros(3))
    assert calls == [("prefix", True, "store"), ("gloo", "prefixed", 0, 2, 5.0), ("allgather", 2, 1),
                     ("allreduce", "max", 1)]


class _GatheringGroup(object):
    """A gloo group's all-gather as seen by one rank of ``rows`` (every rank's vector, in rank order)."""

    def __init__(self, rows):
        self.rows = rows

    def allgather(self, out, tensors):
        for copy, row in zip(out[0], self.rows):
            copy.copy_(row)
        return types.SimpleNamespace(wait=lambda: True)


def _ranks_vectors(size):
    """One 64-field vector per rank: random, each rank's own fields absent (-inf), field 7 absent everywhere."""
    torch.manual_seed(size)
    rows = [torch.randn(64) for _ in range(size)]
    for r, row in enumerate(rows):
        row[r::size + 1] = float("-inf")  # absent on this rank only
    for r in range(size):
        rows[r][7] = float("-inf")  # absent everywhere
    return rows


@pytest.mark.parametrize("size", [2, 3, comm.GATHER_RANKS])
def test_the_gathered_max_is_every_fields_maximum_over_the_ranks(monkeypatch, size):
    """Up to GATHER_RANKS ranks the MAX comes from an all-gather: field by field the largest value any rank sent,
    -inf (an absent slot) only where every rank sent it, the same on every rank."""
    rows = _ranks_vectors(size)
    channel = comm.DistributedChannel.__new__(comm.DistributedChannel)
    channel.rank, channel.size, channel.timeout = 0, size, 5.0
    monkeypatch.setattr(channel, "_group", lambda: _GatheringGroup(rows), raising=False)
    reduced = channel.all_reduce_max(rows[0])
    expected = torch.tensor([max(float(row[j]) for row in rows) for j in range(64)])
    assert torch.equal(reduced, expected)
    assert float(reduced[7]) == float("-inf") and bool(torch.isfinite(reduced[:7]).all())
    assert not torch.equal(reduced, rows[0])  # the maximum over the ranks, not this rank's vector back


@needs_step_hooks
def test_counting_goes_on_after_a_step_that_raised(monkeypatch):
    """An LBFGS closure that runs out of data: torch runs no post-hook for that step; the next optimizer
    still counts and is checked."""
    from tpu_closure_fix.synccheck import hook

    checked = []
    monkeypatch.setattr(comm, "channel", lambda timeout=None: types.SimpleNamespace(rank=0, size=2))
    monkeypatch.setattr(compare, "run", lambda obj, step, stream, channel=None: checked.append((stream.key, step)) or
                        report.SyncReport(step, 2, "fake", []))
    net = torch.nn.Linear(3, 2)
    lbfgs = torch.optim.LBFGS(net.parameters(), max_iter=1)
    sgd = torch.optim.SGD(torch.nn.Linear(2, 2).parameters(), lr=0.1)

    def out_of_data():
        raise StopIteration("out of data")

    hook.arm(1)
    try:
        with pytest.raises(StopIteration):
            lbfgs.step(out_of_data)
        for _ in range(2):
            sgd.step()
        keys = [hook._counts[id(o)][0].key for o in (lbfgs, sgd)]
    finally:
        hook.disarm()
    assert checked == [(keys[0], 0), (keys[1], 0), (keys[1], 1), (keys[1], 2)]


# --------------------------------------------------------------------------- the Lightning callback's schedule
def _callback(monkeypatch, every=3):
    """The callback's own logic, without Lightning (its subclass skips the Lightning base classes); each
    check is recorded, answered "identical" except where ``verdicts`` says otherwise."""
    from tpu_closure_fix.synccheck import callback

    class Probe(callback.SyncCheck):
        pass

    checks = []

    def fake_run(obj, step, stream, tolerance=None, channel=None):
        checks.append((stream.key, step, stream.checks))
        stream.checks += 1
        return report.SyncReport(step, 2, "fake", ["w"], outcome="identical", first_check=stream.checks == 1)

    monkeypatch.setattr(callback, "run", fake_run)
    monkeypatch.setattr(comm, "channel", lambda timeout=None: types.SimpleNamespace(rank=0, size=2, kind="fake"))
    return Probe(every=every), checks


class _Logger(object):
    def __init__(self):
        self.logged = []

    def log_metrics(self, metrics, step=None):
        self.logged.append((step, dict(metrics)))


def test_the_callback_checks_at_the_start_after_step_1_every_n_and_at_the_end(monkeypatch):
    cb, checks = _callback(monkeypatch, every=3)
    logger = _Logger()
    fit(cb, 7, loggers=[logger])
    assert [step for _, step, _ in checks] == [0, 1, 3, 6, 7]
    assert len(cb.reports) == 5 and cb.last_report.step == 7
    assert logger.logged[0] == (0, {"sync_check/diverged": 0.0, "sync_check/differing_tensors": 0.0,
                                    "sync_check/unverified": 0.0})


def test_a_callback_reused_for_a_second_fit_starts_afresh(monkeypatch):
    cb, checks = _callback(monkeypatch, every=3)
    fit(cb, 4)
    fit(cb, 4)
    first, second = checks[:4], checks[4:]
    assert [s for _, s, _ in first] == [s for _, s, _ in second] == [0, 1, 3, 4]
    assert first[0][2] == 0 and second[0][2] == 0  # a fresh history: the second fit's first check is first
    assert first[0][0] != second[0][0] and len(cb.reports) == 4


def test_a_callback_whose_peer_is_gone_stands_down_once(monkeypatch):
    from tpu_closure_fix.synccheck import callback

    cb, checks = _callback(monkeypatch, every=1)
    fresh()  # said once per process: a run before this one may have

    def gone(obj, step, stream, tolerance=None, channel=None):
        checks.append(step)
        raise comm.StoodDown("the check's all-reduce did not complete", broken=True)

    monkeypatch.setattr(callback, "run", gone)
    with said() as heard:
        fit(cb, 3)
    assert checks == [0] and [r.outcome for r in cb.reports] == ["unverified"]
    assert len([m for m in heard.spoken if "did not complete" in m]) == 1


def test_a_silent_rank_saying_a_reason_first_never_silences_the_rank_that_speaks(monkeypatch):
    """Replicas that are threads of one process share the set of reasons said: rank 1 (which only logs) may
    reach it first; rank 0 must still warn."""
    fresh()
    unverified = report.SyncReport(0, 2, "threads", [], outcome="unverified", reason="peer gone")
    with said() as heard:
        report.act(unverified, "warn", rank=1)
        report.act(unverified, "warn", rank=0)
        report.act(unverified, "warn", rank=0)  # once per reason for the speaker
    assert [r.levelno for r in heard.records if "peer gone" in heard.text(r)] == [10, 30]


# --------------------------------------------------------------------------- the agreement (a real TCPStore)
def _store_channels(size, timeout):
    from datetime import timedelta

    from support import ports

    port = ports.free_port()
    store = torch.distributed.TCPStore("127.0.0.1", port, is_master=True, timeout=timedelta(seconds=30))

    def channel(rank):  # a client of its own per rank, as each process of a job has
        own = torch.distributed.TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=30))
        dist = types.SimpleNamespace(get_rank=lambda: rank, get_world_size=lambda: size,
                                     distributed_c10d=types.SimpleNamespace(_get_default_store=lambda: own))
        return comm.DistributedChannel(dist, timeout=timeout)

    return store, [channel(r) for r in range(size)]


def _agree_on_threads(channels, key, ranks):
    out = {}
    threads = [threading.Thread(target=lambda r=r: out.__setitem__(r, channels[r].agree(key))) for r in ranks]
    [t.start() for t in threads]
    [t.join(60) for t in threads]
    return out


def test_every_rank_at_the_check_agrees_to_go_at_once():
    import time

    _, channels = _store_channels(3, timeout=60)
    start = time.monotonic()
    assert _agree_on_threads(channels, "s/0", [0, 1, 2]) == {0: True, 1: True, 2: True}
    assert time.monotonic() - start < 30  # woken by the last arrival, not by the timeout


def test_a_rank_that_never_comes_makes_every_present_rank_abort_and_a_late_one_too():
    _, channels = _store_channels(3, timeout=1)
    assert _agree_on_threads(channels, "s/0", [0, 1]) == {0: False, 1: False}
    assert _agree_on_threads(channels, "s/0", [2]) == {2: False}  # late: the word already written is "abort"


def test_forgotten_keys_leave_the_store():
    store, channels = _store_channels(2, timeout=60)
    _agree_on_threads(channels, "s/0", [0, 1])
    arrived = comm.KEY_PREFIX + "s/0/arrived"
    channels[1].forget("s/0")
    assert store.add(arrived, 0) == 2  # only rank 0 deletes
    channels[0].forget("s/0")
    assert store.add(arrived, 0) == 0  # gone (adding 0 makes it anew at 0)



def _meet_on_threads(channels, key, rows, ranks):
    out = {}
    threads = [threading.Thread(target=lambda r=r: out.__setitem__(r, channels[r].meet(key, rows[r]))) for r in ranks]
    [t.start() for t in threads]
    [t.join(60) for t in threads]
    return out


def _present(store, key):
    """Whether ``key`` holds a value in ``store``: compare-and-set of "" to "" returns the value, or makes an absent
    key empty and returns "" (torch 1.x stores have no ``check``)."""
    return bool(store.compare_set(key, "", ""))


def _vector_keys(store, key, size):
    return [r for r in range(size) if _present(store, comm.KEY_PREFIX + key + comm.vector_key(r))]


@pytest.mark.parametrize("size", [2, 3, comm.GATHER_RANKS])
def test_the_vectors_ride_with_the_vote_and_each_rank_reads_their_maximum(monkeypatch, size):
    """Up to GATHER_RANKS ranks ``meet`` is one meeting through the store: every rank gets the field-by-field
    maximum of every rank's vector (-inf only where every rank sent it), and no gloo group is made (no
    collective at all); once a later check agreed, forgetting the check takes each rank's vector out."""
    monkeypatch.setattr(comm, "_groups", {})
    store, channels = _store_channels(size, timeout=60)
    rows = _ranks_vectors(size)
    expected = torch.tensor([max(float(row[j]) for row in rows) for j in range(64)])
    out = _meet_on_threads(channels, "m/0", rows, range(size))
    assert sorted(out) == list(range(size))
    for r in range(size):
        assert torch.equal(out[r], expected), r
    assert float(expected[7]) == float("-inf") and not torch.equal(expected, rows[0])
    assert comm._groups == {}
    assert _vector_keys(store, "m/0", size) == list(range(size))
    for channel in channels:
        channel.forget("m/0")
    assert _vector_keys(store, "m/0", size) == []


def test_a_check_some_rank_never_meets_gives_no_maximum_and_leaves_no_vector():
    store, channels = _store_channels(3, timeout=1)
    rows = [torch.full((8,), float(r)) for r in range(3)]
    assert _meet_on_threads(channels, "m/1", rows, [0, 1]) == {0: None, 1: None}
    assert _meet_on_threads(channels, "m/1", rows, [2]) == {2: None}  # late: "abort" already written
    assert _vector_keys(store, "m/1", 3) == []  # nobody reads a vector of a check voted "abort"


def test_above_the_bound_the_ranks_agree_and_then_reduce(monkeypatch):
    """Above GATHER_RANKS every rank would read every other's vector from one store: ``meet`` is the agreement,
    then the collective (all_reduce_max), and writes no vector."""
    store, channels = _store_channels(2, timeout=60)
    monkeypatch.setattr(comm, "GATHER_RANKS", 1)
    for channel in channels:
        monkeypatch.setattr(channel, "all_reduce_max", lambda v, rank=channel.rank: v + 100 * (rank + 1))
    out = _meet_on_threads(channels, "m/2", [torch.zeros(4), torch.ones(4)], [0, 1])
    assert torch.equal(out[0], torch.full((4,), 100.0)) and torch.equal(out[1], torch.full((4,), 201.0))
    assert _vector_keys(store, "m/2", 2) == []


@pytest.mark.parametrize("held", [0, 3, 40, 64])
def test_a_vector_read_back_from_the_store_is_bit_for_bit_the_one_written(held):
    """Sparse (fewer than half the values present: positions and values only) or dense: the same bits, -0.0,
    NaN and inf included; -inf (absent) wherever nothing was sent."""
    torch.manual_seed(held)
    vector = torch.full((64,), float("-inf"))
    places = torch.randperm(64)[:held]
    vector[places] = torch.randn(held)
    special = [float("nan"), -0.0, float("inf"), 3.0e38]
    vector[places[:len(special)]] = torch.tensor(special[:held])
    sent = comm._bytes_of(vector)
    assert len(sent) == 12 + (8 * held if 2 * held < 64 else 4 * 64)
    assert torch.equal(comm._tensor_of(sent, vector).view(torch.int32), vector.view(torch.int32))


@pytest.mark.parametrize("sent, why", [(b"", "0 bytes"), (b"\x01" * 11, "11 bytes"),
                                       ("other length", "holds 4 values"), ("cut", "holds 4 values"),
                                       ("bad position", "position out of range")])
def test_bytes_that_are_not_a_vector_of_this_length_stand_the_check_down_naming_why(sent, why):
    import struct

    if sent == "other length":
        sent = comm._bytes_of(torch.zeros(3))
    elif sent == "cut":
        sent = comm._bytes_of(torch.zeros(4))[:-1]
    elif sent == "bad position":
        sent = struct.pack("<iii", comm.SPARSE, 4, 1) + struct.pack("<i", 9) + struct.pack("<f", 1.0)
    with pytest.raises(comm.StoodDown, match=why):
        comm._tensor_of(sent, torch.zeros(4))


# --------------------------------------------------------------------------- no declared layout: each tensor's first look
def _streams(size, replicas, first_look=True):
    """The zero-code check's streams (``first_look``: tensors no layout places are decided at their first look)."""
    return [compare.Stream("s", replicas, first_look=first_look) for _ in range(size)]


def _held(build, size=2):
    """Each rank's tensors, built once: the first-check rule's decisions belong to the tensors themselves."""
    tensors = [build(rank) for rank in range(size)]
    return lambda rank: tensors[rank]


def test_auto_a_difference_at_the_first_check_is_said_once_never_a_divergence():
    streams, tensors = _streams(2, groups.AUTO), _held(lambda r: model(seed=r))
    first, _ = on_ranks(2, tensors, streams=streams, steps=[0, 0])
    assert first[0].outcome == "unverified" and not first[0].diverged and first[0].rule == groups.RULE_APART
    assert first[0].reason.startswith(
        "3 parameter tensors differ before the first update ('layer0.weight', 'layer1.weight', 'layer2.weight'): "
        "replicas that started different, or tensors that are not replicas by design")
    assert [name for name, _ in first[0].not_compared] == ["layer0.weight", "layer1.weight", "layer2.weight"]
    assert first[0].set_aside == ["layer0.weight", "layer1.weight", "layer2.weight"] and not first[0].in_sync
    assert compare.nothing_left(first[0])
    report.act(first[0], "raise", rank=0)  # never raised
    later, _ = on_ranks(2, tensors, streams=streams, steps=[1, 1])
    assert later[0].outcome == "unverified" and not later[0].diverged and later[0].set_aside == []
    assert later[0].note is None  # said once, at the check that set them aside


def test_auto_one_tensor_apart_is_named_and_every_other_tensor_stays_compared():
    """A rank-local scale differs at the start: it alone is set aside; a later change of another tensor on one
    rank is a divergence (the stream's other tensors were never taken out with it)."""
    tensors = _held(lambda r: [("scale", torch.full((1,), float(r))), ("fc1.weight", torch.ones(3)),
                               ("fc2.weight", torch.zeros(2))])
    streams = _streams(2, groups.AUTO)
    first, _ = on_ranks(2, tensors, streams=streams, steps=[0, 0])
    assert first[0].outcome == "identical" and first[0].set_aside == ["scale"] and not first[0].in_sync
    assert first[0].note.startswith("1 parameter tensor differs before the first update ('scale'): replicas that")
    assert first[0].not_compared == [("scale", groups.APART)] and first[0].compared_count == 2
    tensors(1)[2][1].add_(1.0)  # rank 1 alone changes fc2.weight
    later, _ = on_ranks(2, tensors, streams=streams, steps=[30, 30])
    assert later[0].outcome == "differ" and [later[0].names[k] for k in later[0].differing] == ["fc2.weight"]
    with pytest.raises(report.ReplicaDivergenceError):
        report.act(later[0], "raise", rank=0)


def test_twin_without_the_rank_local_scale_the_same_change_is_a_divergence_and_nothing_is_set_aside():
    tensors = _held(lambda r: [("fc1.weight", torch.ones(3)), ("fc2.weight", torch.zeros(2))])
    streams = _streams(2, groups.AUTO)
    first, _ = on_ranks(2, tensors, streams=streams, steps=[0, 0])
    assert first[0].outcome == "identical" and first[0].set_aside == [] and first[0].in_sync
    tensors(1)[1][1].add_(1.0)
    later, _ = on_ranks(2, tensors, streams=streams, steps=[30, 30])
    assert later[0].outcome == "differ" and [later[0].names[k] for k in later[0].differing] == ["fc2.weight"]


def test_auto_one_of_3000_tensors_apart_at_the_start_is_named_and_counted_exactly():
    def build(rank):
        return [("p.%d" % i, torch.full((2,), float(rank if i == 2500 else 0))) for i in range(3000)]

    first, _ = on_ranks(2, _held(build), streams=_streams(2, groups.AUTO), steps=[0, 0])
    assert first[0].set_aside == ["p.2500"] and first[0].outcome == "identical"
    assert first[0].note.startswith("1 parameter tensor differs before the first update ('p.2500'):")
    assert first[0].compared_count == 2999


def test_a_new_optimizer_over_the_same_parameters_inherits_what_its_tensors_were_seen_as():
    """An optimizer built afresh (a new stream) over tensors once seen equal: a difference at its first check is
    a divergence, never a second first-check note."""
    tensors = _held(lambda r: model())
    first, _ = on_ranks(2, tensors, streams=_streams(2, groups.AUTO), steps=[0, 0])
    assert first[0].outcome == "identical" and first[0].rule == groups.RULE_WORLD
    tensors(1)[0][1].add_(1.0)
    fresh_streams = _streams(2, groups.AUTO)
    again, _ = on_ranks(2, tensors, streams=fresh_streams, steps=[45, 45])
    assert again[0].outcome == "differ" and again[0].first_check and again[0].differing == [0]


def test_twin_a_new_optimizer_over_new_tensors_looks_at_them_first():
    first, _ = on_ranks(2, _held(lambda r: model(seed=r)), streams=_streams(2, groups.AUTO), steps=[45, 45])
    assert first[0].outcome == "unverified" and first[0].rule == groups.RULE_APART


def test_auto_at_a_first_check_after_updates_says_so():
    first, _ = on_ranks(2, _held(lambda r: model(seed=r)), streams=_streams(2, groups.AUTO), steps=[3, 3])
    assert "differ at the first check (step 3) ('layer0.weight'" in first[0].reason


def test_twin_declared_world_a_difference_at_the_first_check_started_different():
    streams = _streams(2, groups.WORLD)
    first, _ = on_ranks(2, lambda r: model(seed=r), streams=streams, steps=[0, 0])
    assert first[0].outcome == "differ" and first[0].started_different and first[0].rule is None
    with pytest.raises(report.ReplicaDivergenceError):
        report.act(first[0], "raise", rank=0)


def test_an_explicit_call_is_a_declaration_a_difference_at_its_first_check_is_a_divergence():
    """``compare_replicas`` / ``check_sync`` / the callback: the user chose what to compare (no first-check rule)."""
    first, _ = on_ranks(2, lambda r: model(seed=r), streams=_streams(2, groups.AUTO, first_look=False), steps=[1, 1])
    assert first[0].outcome == "differ" and first[0].differing == [0, 1, 2] and not first[0].in_sync
    assert first[0].set_aside == [] and first[0].note is None


def test_twin_an_explicit_call_on_equal_replicas_is_in_sync():
    first, _ = on_ranks(2, lambda r: model(), streams=_streams(2, groups.AUTO, first_look=False), steps=[1, 1])
    assert first[0].outcome == "identical" and first[0].in_sync


def test_auto_equal_at_the_first_check_is_compared_over_the_world_from_then_on():
    streams, tensors = _streams(2, groups.AUTO), _held(lambda r: model())
    first, _ = on_ranks(2, tensors, streams=streams, steps=[0, 0])
    assert first[0].outcome == "identical" and first[0].rule == groups.RULE_WORLD
    for _, tensor in tensors(1):
        tensor.add_(1.0)
    later, _ = on_ranks(2, tensors, streams=streams, steps=[1, 1])
    assert later[0].outcome == "differ" and later[0].differing == [0, 1, 2] and later[0].rule is None


def test_auto_only_the_undeclared_tensors_leave_a_declared_divergence_is_one():
    class FlatParameter(torch.nn.Parameter):  # no replica: not compared, whatever the rule
        pass

    def build(rank):
        return [("w", torch.full((2,), float(rank))), ("flat", FlatParameter(torch.full((2,), float(rank))))]

    reports, _ = on_ranks(2, build, streams=_streams(2, groups.AUTO), steps=[0, 0])
    assert reports[0].outcome == "unverified"
    assert reports[0].not_compared == [("flat", groups.FLAT_SHARD), ("w", groups.APART)]


@pytest.mark.parametrize("outcome, not_compared, in_sync", [
    ("identical", [], True), ("nonfinite", [], True), ("identical", [("w", groups.SPARSE)], True),
    ("identical", [("w", groups.APART)], False), ("differ", [], False), ("unverified", [], False),
    ("structure", [], False), ("out_of_step", [], False)])
def test_in_sync_is_true_only_when_every_compared_tensor_matched_and_nothing_was_set_aside(
        outcome, not_compared, in_sync):
    said = report.SyncReport(1, 2, "threads", ["w", "v"], outcome=outcome, not_compared=not_compared,
                             differing=[1] if outcome == "differ" else ())
    assert said.in_sync is in_sync and said.as_dict()["in_sync"] is in_sync


def test_in_sync_is_false_when_nothing_was_compared():
    assert not report.SyncReport(1, 2, "threads", [], outcome="identical").in_sync


# --------------------------------------------------------------------------- declared groups
def _pairs(changed=None):
    """Two replica groups {0, 1} and {2, 3} holding different models; ``changed``: a rank off its group."""
    def build(rank):
        tensor = torch.full((2, 3), float(rank // 2))
        return [("fc.weight", tensor + 1 if rank == changed else tensor)]
    return build


def test_declared_groups_compare_within_each_group_only():
    reports, _ = on_ranks(4, _pairs(), streams=_streams(4, [[0, 1], [2, 3]]))
    assert [r.outcome for r in reports] == ["identical"] * 4
    changed, _ = on_ranks(4, _pairs(changed=3), streams=_streams(4, [[0, 1], [2, 3]]))
    assert changed[0].outcome == "differ" and changed[0].versions == [[2], [3]] and changed[0].group == [2, 3]
    assert "(in the replica group of ranks 2-3: rank 2 holds one version; rank 3 holds another)" in \
        changed[0].message()


def test_twin_the_same_tensors_over_the_world_differ_across_the_groups():
    reports, _ = on_ranks(4, _pairs(), streams=_streams(4, groups.WORLD))
    assert reports[0].outcome == "differ" and reports[0].versions == [[0, 1], [2, 3]]
    assert "replica group of" not in reports[0].message()


# --------------------------------------------------------------------------- exact at any size
def test_every_differing_tensor_is_counted_past_one_all_gather(monkeypatch):
    monkeypatch.setattr(compare, "MAX_NAMED", 7)
    reports, channels = on_ranks(2, lambda r: model(seed=r, n=20))
    assert reports[0].diverged_count == 20 and channels[0].gathers == 3
    assert "20 of 20 parameter tensors differ" in reports[0].message()


def test_a_sparse_tensor_is_listed_and_the_dense_ones_are_compared():
    def build(rank, changed=None):
        dense = model(n=3)
        if rank == changed:
            dense[1] = (dense[1][0], dense[1][1] + 1)
        return [("embedding.weight", torch.eye(3).to_sparse())] + dense

    reports, _ = on_ranks(2, build)
    assert reports[0].outcome == "identical" and len(reports[0].names) == 3
    assert reports[0].not_compared == [("embedding.weight", groups.SPARSE)]
    changed, _ = on_ranks(2, lambda r: build(r, changed=1))
    assert changed[0].outcome == "differ" and [changed[0].names[k] for k in changed[0].differing] == ["layer1.weight"]


def test_a_meta_tensor_alone_is_unverified_never_an_exception():
    reports, _ = on_ranks(2, lambda r: [("w", torch.zeros(3, device="meta"))])
    assert reports[0].outcome == "unverified" and reports[0].not_compared == [("w", groups.META)]


# --------------------------------------------------------------------------- threads
@needs_step_hooks
def test_a_step_ending_in_another_thread_during_a_step_loses_no_count():
    """Thread A's step is held open while thread B takes three whole steps: every step of both counts (a
    flag shared by the threads would have B's steps end A's, and A's would be lost)."""
    from tpu_closure_fix.synccheck import hook

    entered, release = threading.Event(), threading.Event()

    class Held(torch.optim.Optimizer):  # no optimizer step inside its own: one step, one count
        def step(self, closure=None):
            entered.set()
            assert release.wait(10)

    held = Held(torch.nn.Linear(2, 2).parameters(), {})
    free = torch.optim.SGD(torch.nn.Linear(2, 2).parameters(), lr=0.1)
    hook.arm(1000)
    try:
        thread = threading.Thread(target=held.step)
        thread.start()
        assert entered.wait(10)
        for _ in range(3):
            free.step()
        release.set()
        thread.join(10)
        counts = [hook._counts[id(o)][1][0] for o in (held, free)]
    finally:
        hook.disarm()
    assert counts == [1, 3]


@needs_step_hooks
def test_3000_steps_from_each_of_two_threads_are_all_counted():
    from tpu_closure_fix.synccheck import hook

    optimizers = [torch.optim.SGD(torch.nn.Linear(2, 2).parameters(), lr=0.1) for _ in range(2)]
    start = threading.Barrier(2)

    def steps(optimizer):
        start.wait()
        for _ in range(3000):
            optimizer.step()

    hook.arm(1000)
    try:
        threads = [threading.Thread(target=steps, args=(o,)) for o in optimizers]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        counts = [hook._counts[id(o)][1][0] for o in optimizers]
    finally:
        hook.disarm()
    assert counts == [3000, 3000]


@pytest.mark.parametrize("names, left", [(["w"], False), (["w", "d"], True), ([], True)])
def test_a_stream_stops_only_when_the_first_check_rule_set_every_tensor_aside(names, left):
    said = report.SyncReport(0, 2, "threads", names, outcome="unverified", reason="r",
                             not_compared=[("w", groups.APART)])
    assert compare.nothing_left(said) is (not left)


@pytest.mark.parametrize("kind, undecided", [("xla host", set()), ("threads", {0}), ("torch.distributed", {0})])
def test_on_xla_without_a_process_group_the_replicas_of_the_step_are_the_layout(kind, undecided, monkeypatch):
    monkeypatch.setattr(groups, "ddp_groups", lambda named: {})
    channel = types.SimpleNamespace(kind=kind, rank=0, size=2)
    layout = compare.Stream("s", groups.AUTO, first_look=True).layout([("w", torch.zeros(2))], channel)
    assert layout.undecided == undecided


@pytest.mark.parametrize("kind", ["xla host", "threads", "torch.distributed"])
def test_twin_an_explicit_call_leaves_nothing_undecided(kind, monkeypatch):
    monkeypatch.setattr(groups, "ddp_groups", lambda named: {})
    channel = types.SimpleNamespace(kind=kind, rank=0, size=2)
    layout = compare.Stream("s", groups.AUTO).layout([("w", torch.zeros(2))], channel)
    assert layout.undecided == frozenset()


@pytest.mark.parametrize("xla_size, undecided", [(2, set()), (4, {0}), (1, {0})])
def test_torch_xla_beside_a_process_group_its_replicas_are_the_layout_when_they_are_the_world(
        xla_size, undecided, monkeypatch):
    monkeypatch.setattr(groups, "ddp_groups", lambda named: {})
    monkeypatch.setattr(comm, "xla_world_size", lambda: xla_size)
    channel = types.SimpleNamespace(kind="torch.distributed", rank=0, size=2)
    layout = compare.Stream("s", groups.AUTO, first_look=True).layout([("w", torch.zeros(2))], channel)
    assert layout.undecided == undecided


@pytest.mark.parametrize("call", [lambda: compare.compare_replicas(model(), replicas="all"),
                                  lambda: compare.check_sync(model(), 3, replicas=[[0, 1], [1]])])
def test_a_bad_declaration_is_refused_by_the_api_with_the_accepted_values(call):
    with pytest.raises(ValueError, match="accepted|must be"):
        call()


def test_the_api_hands_its_declaration_to_the_stream():
    tensors = torch.nn.Linear(2, 2)
    assert compare._stream_of(tensors, [[0, 1]]).replicas == [[0, 1]]
    stream = compare._stream_of(tensors)
    assert stream.replicas == groups.AUTO and not stream.first_look  # the call itself declares


@pytest.mark.parametrize("function", [compare.compare_replicas, compare.check_sync])
def test_the_api_decides_from_evidence_by_default(function):
    import inspect

    assert inspect.signature(function).parameters["replicas"].default == groups.AUTO


# --------------------------------------------------------------------------- a check exchanged after a first look
def _prepared_then_exchanged(decision):
    """Two thread-ranks whose tensors differ (no layout declared) prepare a check, as the zero-code hook's
    training thread does; an earlier check's first look then decides ``decision`` for those tensors (None:
    nothing yet) before the worker exchanges this one. The reports, by rank."""
    world = ThreadWorld(2)
    out, errors = [None, None], []

    def rank_main(rank):
        try:
            tensors = model(seed=rank)
            stream = compare.Stream("settle", replicas=groups.AUTO, first_look=True)
            pending = compare.prepare(tensors, 1, stream, channel=ThreadChannel(world, rank))
            if decision is not None:
                for _, tensor in tensors:  # the earlier check's verdict, recorded meanwhile by the worker
                    decisions.record(tensor, decision)
            out[rank] = compare.exchange(pending)
        except Exception as exc:  # reported below, with the rank
            errors.append((rank, exc))
            world.barrier.abort()

    run_threads(2, rank_main)
    assert not errors, errors
    return out


def test_a_check_prepared_before_a_first_look_is_a_divergence_once_that_look_said_replica():
    """The first look found the tensors equal over the world: a later difference is a divergence (the closure
    bug's signature: equal before the first update, different after it), never a second first-check note."""
    assert [r.outcome for r in _prepared_then_exchanged(decisions.REPLICA)] == ["differ", "differ"]


@pytest.mark.parametrize("decision", [None, decisions.APART])
def test_twin_undecided_or_apart_a_difference_is_never_a_divergence(decision):
    reports = _prepared_then_exchanged(decision)
    assert [r.outcome for r in reports] == ["unverified", "unverified"] and not any(r.diverged for r in reports)
    assert [bool(r.set_aside) for r in reports] == [decision is None] * 2  # set aside once, at its first look


def test_a_decision_belongs_to_the_tensor_and_the_first_one_stands():
    tensor, other = torch.zeros(2), torch.zeros(2)
    assert decisions.of(tensor) is None
    decisions.record(tensor, decisions.REPLICA)
    decisions.record(tensor, decisions.APART)
    assert decisions.of(tensor) == decisions.REPLICA and decisions.of(other) is None
    with pytest.raises(ValueError, match="decision must be"):
        decisions.record(other, "maybe")


def test_a_decision_dies_with_its_tensor():
    import gc

    tensor = torch.zeros(2)
    decisions.record(tensor, decisions.APART)
    key = id(tensor)
    del tensor
    gc.collect()
    assert key not in decisions._decided
