"""synccheck.compare around the verdict: a stream's history, what one check asks of its channel (the
agreement's name, the keys it forgets, the vector it reduces), the report's fields, compare_replicas and
the options.

The channel is a mirror (:class:`Mirror`): it claims a world of two whose other replica holds exactly
what this one holds, so a check runs in this thread, with no exchange to wait for. The verdict rules
themselves, over replicas that differ: test_synccheck_rules.py.
"""
import itertools
import math
import types

import pytest

torch = pytest.importorskip("torch", reason="SyncCheck compares torch tensors: no torch here")

from tpu_closure_fix.synccheck import comm, compare, fingerprint, report  # noqa: E402

from support.thread_ranks import AgreeThenReduce  # noqa: E402
from test_synccheck_rules import on_ranks  # noqa: E402  (replicas as threads)

_keys = itertools.count()


def _key():
    """A stream key no other test uses (the last check of each key is remembered module-wide)."""
    return "mirror-%d" % next(_keys)


class Mirror(AgreeThenReduce):
    """A channel of rank 0 in a world of two whose other replica mirrors this one (``timeout`` None: a
    channel that has no ``timeout`` attribute)."""
    kind = "mirror"

    def __init__(self, agree=True, timeout=7):
        self.rank, self.size, self._agree = 0, 2, agree
        if timeout is not None:
            self.timeout = timeout
        self.agreed, self.forgotten, self.reduced = [], [], []

    def device(self, tensors):
        return torch.device("cpu")

    def agree(self, key):
        self.agreed.append(key)
        return self._agree

    def forget(self, key):
        self.forgotten.append(key)

    def all_reduce_max(self, vector):
        self.reduced.append(vector.clone())
        return vector.clone()

    def all_gather(self, vector):
        return [vector.clone(), vector.clone()]


def _model():
    return [("w", torch.ones(3)), ("b", torch.zeros(2))]


# --------------------------------------------------------------------------- a stream's history
def _report(step, outcome, stream):
    return report.SyncReport(step, 2, "mirror", ["w"], outcome=outcome,
                             differing=[0] if outcome == "differ" else (), **stream.history(step))


def test_a_stream_reads_each_report_against_what_it_saw_before():
    stream = compare.Stream("history")
    seen = []
    for step, outcome in [(0, "identical"), (3, "differ"), (5, "differ"), (6, "unverified"), (7, "identical"),
                          (9, "structure")]:
        r = _report(step, outcome, stream)  # built complete: read against the history before it
        stream.record(r)
        seen.append((r.step, r.first_check, r.identical_at, r.different_since))
    assert seen == [(0, True, None, None), (3, False, 0, 3), (5, False, 0, 3), (6, False, 0, None),
                    (7, False, 0, None), (9, False, 7, 9)]
    assert (stream.checks, stream.identical_at, stream.different_since) == (6, 7, 9)


# --------------------------------------------------------------------------- one check and its channel
def test_each_check_is_named_by_its_stream_and_count_and_forgets_the_one_before():
    key, channel = _key(), Mirror()
    stream = compare.Stream(key)
    first = compare.run(_model(), 4, stream, channel=channel)
    second = compare.run(_model(), 5, stream, channel=channel)
    assert channel.agreed == ["%s/0" % key, "%s/1" % key]
    assert channel.forgotten == [None, "%s/0" % key]
    assert [r.outcome for r in (first, second)] == ["identical", "identical"]
    assert (first.first_check, second.first_check, second.identical_at, stream.checks) == (True, False, 4, 2)


def test_a_check_named_by_its_caller():
    channel = Mirror()
    compare.run(_model(), 1, compare.Stream(_key()), barrier="given/3", channel=channel)
    assert channel.agreed == ["given/3"]


def test_the_report_carries_the_check_s_step_world_and_tolerance():
    r = compare.run(_model(), 12, compare.Stream(_key()), tolerance=0.5, channel=Mirror())
    assert (r.step, r.world_size, r.backend, r.tolerance, r.names) == (12, 2, "mirror", 0.5, ["w", "b"])
    assert r.outcome == "identical" and r.not_compared == []


def test_the_reduced_vector_is_this_replica_s_fingerprint():
    channel = Mirror()
    compare.run(_model(), 3, compare.Stream(_key()), channel=channel)
    (vector,) = channel.reduced
    decoded = fingerprint.decode(vector)
    assert decoded["step"] == (3, 3) and decoded["count"] == (2, 2) and decoded["failed"][0] == 0


@pytest.mark.parametrize("xxh3", [True, False], ids=["xxh3", "elementwise"])
def test_a_check_that_waits_keeps_no_per_tensor_fields_and_the_zero_code_one_keeps_them(monkeypatch, xxh3):
    """compare.run (the caller waits for the verdict) keeps nothing for naming (on a difference each named
    tensor's fields are computed again from the unchanged tensors) and, where CPU tensors are hashed with XXH3,
    computes no sums of |values| (elementwise, the hash's own pass gives them); the zero-code check's prepare
    keeps each tensor's hash and sums, since its worker names a difference after training went on."""
    if xxh3 and fingerprint.xxhash_module() is None:
        pytest.skip("XXH3 needs the xxhash package, not installed here: pip install 'xxhash>=3.0'")
    if not xxh3:
        monkeypatch.setattr(fingerprint, "_xxhash", [None])  # as where xxhash is not installed
    left_out = float("-inf") if xxh3 else 3.0
    waits = compare.prepare(_model(), 1, compare.Stream(_key()), channel=Mirror(), kept=False)
    zero_code = compare.prepare(_model(), 1, compare.Stream(_key()), channel=Mirror())
    assert waits.layout.details == {} and float(fingerprint.decode(waits.vector)["abs_sum"][0]) == left_out
    assert sorted(zero_code.layout.details) == ["hashes", "stats"]
    assert zero_code.layout.details["stats"].tolist() == [[0.0, 3.0, 3.0], [0.0, 0.0, 0.0]]
    channel = Mirror()
    compare.run(_model(), 1, compare.Stream(_key()), channel=channel)
    assert float(fingerprint.decode(channel.reduced[0])["abs_sum"][0]) == left_out


def test_a_stream_without_history_records_nothing():
    stream = compare.Stream(_key())
    stream.checks = -1
    r = compare.run(_model(), 1, stream, channel=Mirror())
    assert stream.checks == -1 and not r.first_check


def test_no_channel_means_no_check(monkeypatch):
    monkeypatch.setattr(comm, "channel", lambda timeout=None: None)
    assert compare.run(_model(), 1, compare.Stream(_key())) is None
    assert compare.compare_replicas(_model(), 1) is None


@pytest.mark.parametrize("timeout, said", [(7, "7"), (None, "?")])
def test_a_check_not_agreed_to_stands_down_naming_the_check_and_the_wait(timeout, said):
    key = _key()
    with pytest.raises(comm.StoodDown) as info:
        compare.run(_model(), 1, compare.Stream(key), channel=Mirror(agree=False, timeout=timeout))
    # the stream's key names the check to the ranks only: the user is told which check of the stream it was
    assert str(info.value) == ("not every rank reached this check (check #0) within %ss: an optimizer stepped on "
                               "some ranks only, ranks out of step, or a rank gone" % said)
    assert key not in str(info.value)


def test_a_check_of_an_object_with_no_history_that_stands_down_says_so():
    stream = compare.Stream(_key())
    stream.checks = -1  # what compare_replicas gives a list or a dict: nothing to remember it by
    with pytest.raises(comm.StoodDown) as info:
        compare.run(_model(), 1, stream, channel=Mirror(agree=False))
    assert "(a check of an object with no history)" in str(info.value)


def test_the_vector_carries_the_number_of_replica_groups(monkeypatch):
    """Neuron data-parallel groups [[0, 2], [1, 3]]: a tensor-parallel weight is laid out over two lanes."""
    import sys
    import types

    from tpu_closure_fix.synccheck import groups

    state = types.ModuleType(groups.NEURON_STATE)
    state.model_parallel_is_initialized = lambda: True
    state.get_data_parallel_replica_groups = lambda: [[0, 2], [1, 3]]
    monkeypatch.setitem(sys.modules, groups.NEURON_STATE, state)
    channel = Mirror()
    compare.run([("mlp.dense.weight", torch.ones(2, 3))], 1, compare.Stream(_key()), channel=channel)
    assert fingerprint.decode(channel.reduced[0])["lanes"] == (2, 2)


def test_a_replica_that_cannot_fingerprint_says_its_error(monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("no memory")

    monkeypatch.setattr(fingerprint, "local_vector", broken)
    r = compare.run(_model(), 1, compare.Stream(_key()), channel=Mirror())
    assert (r.outcome, r.reason, r.local_error) == ("unverified", "RuntimeError: no memory", True)


def test_a_replica_that_cannot_list_says_why_without_the_exception_s_name():
    r = compare.run([torch.ones(1), 3], 1, compare.Stream(_key()), channel=Mirror())
    assert (r.outcome, r.reason, r.local_error) == ("unverified", "list holds 'int', not a tensor, under 'param1'",
                                                    True)


# --------------------------------------------------------------------------- compare_replicas
def test_compare_replicas_names_each_call_in_turn(monkeypatch):
    channel = Mirror()
    monkeypatch.setattr(comm, "channel", lambda timeout=None: channel)
    monkeypatch.setattr(compare, "_api_checks", {0: 41})
    model = torch.nn.Linear(2, 1)
    first = compare.compare_replicas(model, 3, tolerance=0.25)
    second = compare.compare_replicas(model, 4)
    assert channel.agreed == ["api/42", "api/43"]
    assert (first.step, first.tolerance, first.outcome, first.first_check) == (3, 0.25, "identical", True)
    assert (second.tolerance, second.first_check, second.identical_at) == (compare.DEFAULT_TOLERANCE, False, 3)


def test_compare_replicas_that_cannot_complete_is_unverified(monkeypatch):
    monkeypatch.setattr(comm, "channel", lambda timeout=None: Mirror(agree=False))
    r = compare.compare_replicas(_model(), 8, tolerance=0.125)
    assert (r.outcome, r.step, r.world_size, r.backend, r.tolerance, r.names) == (
        "unverified", 8, 2, "mirror", 0.125, [])
    assert "not every rank reached this check" in r.reason


# --------------------------------------------------------------------------- options
@pytest.mark.parametrize("kwargs, message", [
    ({"every": 0}, "every must be a positive int (optimizer steps); got 0"),
    ({"every": False}, "every must be a positive int (optimizer steps); got False"),
    ({"every": "5"}, "every must be a positive int (optimizer steps); got '5'"),
    ({"tolerance": -1e-9}, "tolerance must be >= 0; got -1e-09"),
    ({"tolerance": math.nan}, "tolerance must be >= 0; got nan"),
    ({"on_divergence": "stop"}, "on_divergence must be 'warn', 'raise' or a callable(report); got 'stop'"),
])
def test_bad_options_say_what_is_wanted(kwargs, message):
    options = dict({"every": 1, "tolerance": 0.0, "on_divergence": "warn"}, **kwargs)
    with pytest.raises(ValueError) as info:
        compare.check_options(**options)
    assert str(info.value) == message


@pytest.mark.parametrize("every, tolerance, on_divergence", [(1, 0.0, "warn"), (100, 1e-6, "raise"),
                                                             (3, 0, print)])
def test_good_options_pass(every, tolerance, on_divergence):
    assert compare.check_options(every, tolerance, on_divergence) is None


def test_defaults():
    assert (compare.DEFAULT_EVERY, compare.DEFAULT_TOLERANCE, compare.ON_DIVERGENCE) == (100, 1e-6, ("warn", "raise"))


# --------------------------------------------------------------------------- replicas as threads: what is named
def test_ranks_out_of_step_are_listed_by_their_first_rank_with_exact_steps():
    """Steps past 16 bits travel as two halves; ``None`` (compare_replicas' default) is step 0."""
    reports, _ = on_ranks(2, lambda r: _model(), steps=[7, 5])
    assert reports[0].reason == "rank 0 at step 7; rank 1 at step 5"
    reports, _ = on_ranks(2, lambda r: _model(), steps=[70000, 70001])
    assert reports[0].reason == "rank 0 at step 70000; rank 1 at step 70001"
    reports, _ = on_ranks(2, lambda r: _model(), steps=[None, 5])
    assert reports[1].reason == "rank 0 at step 0; rank 1 at step 5"


@pytest.mark.parametrize("here, there, spread, divergence", [
    ([0.1, 0.1], [0.1, 0.3], 0.2, 0.2 / 0.4),  # relative to the largest sum of |values| (0.4 < 1)
    ([3.0, 1.0], [3.0, 2.0], 1.0, 1.0 / 5.0),
    ([0.0, 0.0], [-0.0, 0.0], 0.0, 0.0),  # bits differ, values do not: no scale to divide by
])
def test_a_difference_is_measured_by_its_spread_relative_to_its_scale(here, there, spread, divergence):
    def build(rank):
        return [("same", torch.ones(2)), ("w", torch.tensor(there if rank else here)), ("also", torch.zeros(3))]

    reports, _ = on_ranks(2, build)
    r = reports[0]
    assert r.outcome == "differ" and r.differing == [1]
    assert r.spread[1] == pytest.approx(spread, rel=1e-6) and r.divergence[1] == pytest.approx(divergence, rel=1e-6)
    assert (r.spread[0], r.divergence[0], r.spread[2], r.divergence[2]) == (0.0, 0.0, 0.0, 0.0)


def test_check_sync_reports_its_step_and_tolerance(monkeypatch):
    monkeypatch.setattr(comm, "channel", lambda timeout=None: Mirror())
    r = compare.check_sync(_model(), 6, every=3, tolerance=0.75)
    assert (r.step, r.tolerance, r.outcome) == (6, 0.75, "identical")


def test_each_object_has_its_own_history_while_it_lives(monkeypatch):
    import gc

    monkeypatch.setattr(comm, "channel", lambda timeout=None: Mirror())
    first, second = torch.nn.Linear(2, 1), torch.nn.Linear(2, 1)
    assert compare.compare_replicas(first, 1).first_check
    assert compare.compare_replicas(second, 1).first_check  # not the history of ``first``
    assert not compare.compare_replicas(first, 2).first_check
    key = id(first)
    assert key in compare._streams
    del first
    gc.collect()
    assert key not in compare._streams  # forgotten with the object: a later object with its id starts afresh


def test_versions_are_listed_largest_group_first():
    reports, _ = on_ranks(3, lambda r: [("w", torch.tensor([1.0 if r else 2.0]))])
    assert reports[0].versions == [[1, 2], [0]]


def test_a_different_number_of_tensors_is_said_with_both_counts_and_this_replica_s():
    reports, _ = on_ranks(2, lambda r: _model() + [("extra", torch.ones(1))] * r)
    assert [r.structure for r in reports] == [
        "the number of parameter tensors differs (2 on some replicas, 3 on others; %d here)" % n for n in (2, 3)]


def test_replicas_that_lay_out_different_replica_groups_differ_in_structure():
    """One replica sees one group (the whole world), another two: the MAX-reduced vector shows both counts."""
    from tpu_closure_fix.synccheck import groups

    layout = groups.Layout(_model(), 0)

    def vector(lanes):
        return fingerprint.local_vector(layout.entries, layout.structures, torch.device("cpu"), step=1, lanes=lanes)

    r = _decided(vector(1), vector(2), layout)
    assert (r.outcome, r.structure) == ("structure", "the replica groups differ (1 lanes on some replicas, 2 on others)")
    bigger = groups.Layout(_model() + [("extra", torch.ones(1))], 0)
    theirs = fingerprint.local_vector(bigger.entries, bigger.structures, torch.device("cpu"), step=1, lanes=2)
    assert _decided(vector(1), theirs, layout).structure == (
        "the number of parameter tensors differs (2 on some replicas, 3 on others; 2 here); "
        "the replica groups differ (1 lanes on some replicas, 2 on others)")


@pytest.mark.parametrize("size, half", [(42303, "low"), (33285, "high")])
def test_a_shape_difference_seen_in_one_half_of_its_hash_only_is_named(size, half):
    """Shapes (3,) and (``size``,) at position 0 hash alike in one 16-bit half: the other half names it."""
    before, after = fingerprint.shape_hash(0, (3,)), fingerprint.shape_hash(0, (size,))
    differs = (before & 0xFFFF != after & 0xFFFF) if half == "low" else (before >> 16 != after >> 16)
    assert differs and ((before >> 16 == after >> 16) if half == "low" else (before & 0xFFFF == after & 0xFFFF))
    reports, _ = on_ranks(2, lambda r: [("w", torch.zeros(size if r else 3))])
    assert reports[0].structure == ("parameter tensor #0 'w' has another shape on some replica "
                                    "(here: shape (3,), float32)")


def test_shape_and_dtype_both_named():
    reports, _ = on_ranks(2, lambda r: [("w", torch.zeros(4, dtype=torch.float64) if r else torch.zeros(3))])
    assert reports[0].structure == ("parameter tensor #0 'w' has another shape and dtype on some replica "
                                    "(here: shape (3,), float32)")


def _decided(mine, theirs, layout):
    """compare.decide of the MAX of two replicas' vectors, read by the replica with ``layout``."""
    return compare.decide(fingerprint.decode(torch.maximum(mine, theirs)), layout, None, Mirror(), 1, 0.0)


def test_a_replica_holding_no_tensor_of_the_differing_slot_names_what_differs_only():
    from tpu_closure_fix.synccheck import groups

    here, there = groups.Layout([("w", torch.zeros(3))], 0), groups.Layout([("w", torch.zeros(4))], 0)
    theirs = fingerprint.local_vector(there.entries, there.structures, torch.device("cpu"), step=1)
    mine = fingerprint.local_vector(here.entries, here.structures, torch.device("cpu"), step=1)
    here.entries = []  # this replica holds none of the slot's tensors (another replica group's lane)
    assert _decided(mine, theirs, here).structure == "a parameter tensor differs in shape between replicas"


def test_the_same_tensors_described_in_another_order_differ_in_structure():
    """Every slot agrees; only the digest of the ordered shapes and dtypes differs."""
    from tpu_closure_fix.synccheck import groups

    layout = groups.Layout(_model(), 0)
    vectors = [fingerprint.local_vector(layout.entries, structures, torch.device("cpu"), step=1)
               for structures in (layout.structures, tuple(reversed(layout.structures)))]
    r = _decided(vectors[0], vectors[1], layout)
    assert (r.outcome, r.structure) == ("structure", "the order of shapes/dtypes of the parameter tensors differs")


def test_a_dtype_difference_seen_in_the_high_half_of_its_hash_only_is_named():
    """At position 697 float32's and bool's 32-bit hashes share their low 16 bits: the high half shows it."""
    position, here, there = 697, torch.float32, torch.bool
    a, b = fingerprint.dtype_hash(position, "float32"), fingerprint.dtype_hash(position, "bool")
    assert a >> 16 != b >> 16 and a & 0xFFFF == b & 0xFFFF

    def build(rank):
        named = [("t%d" % i, torch.zeros(1)) for i in range(position + 1)]
        named[position] = ("t%d" % position, torch.zeros(1, dtype=there if rank else here))
        return named

    reports, _ = on_ranks(2, build)
    assert reports[0].structure == ("parameter tensor #697 't697' has another dtype on some replica "
                                    "(here: shape (1,), float32)")


def test_a_structure_difference_in_a_shared_slot_names_every_candidate_not_the_first_one():
    """With more tensors than slots, #108 and #1132 are compared together: when #1132's shape differs, the
    report cannot single one out, and says so, naming both."""
    position = fingerprint.SLOTS + 108

    def build(rank):
        named = [("t%d" % i, torch.zeros(1)) for i in range(position + 1)]
        named[position] = ("t%d" % position, torch.zeros(2 if rank else 1))
        return named

    reports, _ = on_ranks(2, build)
    assert reports[0].structure == ("one of the 2 parameter tensors compared together (#108 't108', #1132 't1132') "
                                    "has another shape on some replica")


def test_some_names_lists_three_then_counts_the_rest():
    layout = types.SimpleNamespace(names=["a", "b", "c", "d", "e"])
    assert compare._some_names(layout, [0, 1]) == "#0 'a', #1 'b'"
    assert compare._some_names(layout, [0, 1, 2, 3, 4]) == "#0 'a', #1 'b', #2 'c', and 2 more"


# --------------------------------------------------------------------------- a report is built complete
def _named_stream():
    stream = compare.Stream(_key(), label="SGD over fc.weight, fc.bias (in Net)")
    stream.module_paths = ({"w": "fc.weight", "b": "fc.bias"}, {"Net"})
    return stream


def test_a_report_is_built_named_and_read_against_its_history():
    """What a report says is in it when it is made: the stream's label, the module paths of a difference, its
    place in the history. Nothing sets a field of it later."""
    streams = [_named_stream(), _named_stream()]
    for stream in streams:
        stream.key = "named"
    identical, _ = on_ranks(2, lambda r: _model(), steps=[1, 1], streams=streams)
    assert (identical[0].stream, identical[0].names, identical[0].first_check) == (streams[0].label, ["w", "b"],
                                                                                    True)
    differ, _ = on_ranks(2, lambda r: [("w", torch.ones(3) * (r + 1)), ("b", torch.zeros(2))], steps=[4, 4],
                         streams=streams)
    assert differ[0].outcome == "differ" and differ[0].names == ["fc.weight", "fc.bias"]
    assert (differ[0].stream, differ[0].first_check, differ[0].identical_at, differ[0].different_since) == (
        streams[0].label, False, 1, 4)


def test_twin_without_a_stream_the_report_names_the_listed_tensors():
    from tpu_closure_fix.synccheck import groups

    layout = groups.Layout(_model(), 0)
    vector = fingerprint.local_vector(layout.entries, layout.structures, torch.device("cpu"), step=1)
    r = compare.decide(fingerprint.decode(vector), layout, None, Mirror(), 1, 0.0)
    assert (r.stream, r.names, r.first_check) == (None, ["w", "b"], False)


def test_a_module_path_two_tensors_share_keeps_their_positions_everywhere_in_the_report():
    stream = _named_stream()
    stream.module_paths = ({"param_groups[0][0]": "weight", "param_groups[0][1]": "weight"}, set())
    names, left_out, aside, label = stream.naming(
        "differ", ["param_groups[0][0]", "param_groups[0][1]"], [("param_groups[0][1]", "set aside")],
        ["param_groups[0][1]"])
    assert names == ["weight (param_groups[0][0])", "weight (param_groups[0][1])"]
    assert left_out == [("weight (param_groups[0][1])", "set aside")] and aside == ["weight (param_groups[0][1])"]


# --------------------------------------------------------------------------- the schedule, written once
@pytest.mark.parametrize("every", [1, 2, 3, 5, 10])
def test_the_schedule_is_step_1_then_each_multiple_of_every(every):
    assert [s for s in range(0, 31) if compare.due(s, every)] == sorted({0, 1} | set(range(every, 31, every)))


@pytest.mark.parametrize("every", [2, 3, 5])
def test_steps_seen_with_gaps_check_at_the_first_step_past_each_multiple(every):
    """A caller that sees every other step (two optimizers per batch in Lightning's global step): one check per
    multiple of ``every`` passed, at the first step seen past it."""
    last, checked = 0, []
    for step in range(1, 40, 2):
        if compare.due(step, every, last):
            last = step
            checked.append(step)
    expected = [1] + [min(s for s in range(1, 40, 2) if s >= m) for m in range(every, 40, every)
                      if any(s >= m for s in range(3, 40, 2))]
    assert checked == sorted(set(expected))


def test_twin_without_the_last_step_a_gap_passes_a_multiple_unchecked():
    assert [s for s in range(1, 12, 2) if compare.due(s, 4)] == [1]
