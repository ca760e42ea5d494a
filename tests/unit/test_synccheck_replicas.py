"""SyncCheck's comparison across real replica processes: the corpus of divergence kinds
(tests/support/synccheck_corpus.py), each with its identical twin, over torch.distributed (gloo) with 2
and 4 replicas and through the XLA host channel (the check's own store and gloo group, no XLA collective)
on the torch_xla stand-in with 2, every case at its first
check; the oracle is the SHA-256 of every tensor's bytes. Then single-process properties of the
fingerprint, of the verdict read from a reduced vector, and of what a report does.

Replicas are subprocesses with a hard timeout: a comparison that crashed or hung (models of different
structure, a replica without parameters) fails the test instead of stalling it.
"""
import json
import os
import sys

import pytest

torch = pytest.importorskip("torch", reason="SyncCheck compares torch tensors: no torch here")

from support import ranks, synccheck_corpus  # noqa: E402  (after the skip: needs torch)
from support.said import fresh, spoken  # noqa: E402
from support.thread_ranks import AgreeThenReduce  # noqa: E402
from tpu_closure_fix import synccheck  # noqa: E402  (after the skip: needs torch)
from tpu_closure_fix.synccheck import comm, compare, fingerprint, groups, report as reports  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
TESTS = os.path.dirname(HERE)
REPO = os.path.dirname(TESTS)
TIMEOUT = 600


def _run(world, backend, tmp_path, kinds=None):
    """Start ``world`` corpus replicas; rank -> {(kind, twin): case}."""
    extra = ["--kinds", ",".join(kinds)] if kinds else []
    env = dict(os.environ, TPU_CLOSURE_FIX="0", OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore",
               PYTHONPATH=os.pathsep.join([REPO, TESTS]))
    from tpu_closure_fix.synccheck import launch

    with launch.handing_over(env):  # as xmp.spawn would: the check's store here, its channel in the ranks' env
        runs = ranks.launch([sys.executable, "-m", "support.synccheck_corpus"], world, tmp_path,
                            ["--backend", backend] + extra, env, TIMEOUT, cwd=TESTS, tag=backend)
    ranks.assert_all_finished(runs)
    for run in runs:  # a process group is initialised: torch.distributed, even with torch_xla
        assert run.payload["default_backend"] == "torch.distributed", (run.rank, backend)
    return {run.rank: {(c["kind"], c["twin"]): c for c in run.payload["cases"]} for run in runs}


#: 4 replicas, not more: the rules that need more than 2 (the ranks of one version named as a range, "ranks 0-2
#: hold one version") hold from 3 on, and each further replica is one more interpreter importing torch.
@pytest.fixture(scope="module",
                params=[(2, "gloo"), pytest.param((4, "gloo"), marks=pytest.mark.many_ranks), (2, "xla-standin")],
                ids=["gloo-2", "gloo-4", "xla-standin-2"])
def corpus(request, tmp_path_factory):
    world, backend = request.param
    return world, backend, _run(world, backend, tmp_path_factory.mktemp("corpus"))


def _cases(corpus):
    world, backend, results = corpus
    for rank, cases in results.items():
        for (kind, twin), case in sorted(cases.items()):
            yield rank, kind, twin, case


def test_the_corpus_is_what_it_says(corpus):
    """The oracle (bytes, shapes, dtypes gathered from every replica) agrees with each case's declared
    outcome: the divergent versions do differ and the twins do not."""
    for rank, kind, twin, case in _cases(corpus):
        assert case["oracle"] == case["expected"], (rank, kind, twin, case["oracle"])


def test_every_kind_is_caught_at_the_first_check_and_every_twin_passes(corpus):
    world, backend, _ = corpus
    for rank, kind, twin, case in _cases(corpus):
        report = case["report"]
        assert report is not None and report["world_size"] == world, (kind, twin, report)
        assert report["backend"] == ("xla host" if backend == "xla-standin" else "torch.distributed")
        assert case["outcome"] == case["oracle"], (rank, kind, twin, case["message"])
        assert case["diverged"] == (case["oracle"] in ("differ", "structure")), (rank, kind, twin)
        if case["oracle"] != "unverified":  # each case is a new model: its own first check
            assert report["first_check"] and report["identical_at"] is None, (rank, kind, twin, report)
        if case["diverged"]:  # checked after step 1, not before any update: no claim on how they started
            assert not report["started_different"]
            assert "at step 1, the first check" in case["message"], case["message"]


def test_the_differing_tensors_are_named(corpus):
    for rank, kind, twin, case in _cases(corpus):
        if case["oracle"] != "differ":
            continue
        named = case["report"]["differing"]
        # exactly the differing tensors, also for 1100 tensors in 1024 slots (t1050 shares its slot with t26)
        assert named == case["oracle_differing"], (kind, named, case["oracle_differing"])
        for name in named[:synccheck.NAMES_IN_MESSAGE]:
            assert repr(name) in case["message"]


def test_the_ranks_holding_each_version_are_named(corpus):
    """Without the gradient all-reduce every replica trains on its own batch: one version per rank; the
    perturbation kinds change the last replica only: all ranks but the last, and the last."""
    world = corpus[0]
    for rank, kind, twin, case in _cases(corpus):
        if case["oracle"] != "differ":
            assert case["report"]["versions"] == [], (kind, twin)
            continue
        trained = kind.startswith("no-allreduce") or kind == "linear-head"
        expected = [[r] for r in range(world)] if trained else [list(range(world - 1)), [world - 1]]
        assert case["report"]["versions"] == expected, (kind, case["report"]["versions"])
        assert "rank %d holds another" % (world - 1) in case["message"], case["message"]
        if not trained and world > 2:
            assert "ranks 0-%d hold one version" % (world - 2) in case["message"], case["message"]


def test_every_replica_reaches_the_same_verdict(corpus):
    _, _, results = corpus
    for key, case in results[0].items():
        for rank in results:
            other = results[rank][key]
            assert ((other["outcome"], other["report"]["differing"], other["report"]["versions"])
                    == (case["outcome"], case["report"]["differing"], case["report"]["versions"]))


# --------------------------------------------------------------------------- the cases of the issue
def _case(corpus, kind, twin=False, rank=0):
    return corpus[2][rank][(kind, twin)]


def test_linear_head_and_sum_preserving_changes_are_caught(corpus):
    """A value-sum fingerprint is blind to them: the linear head's weight sum does not move without the
    gradient all-reduce (softmax cross-entropy gradients sum to 0 over the classes)."""
    head = _case(corpus, "linear-head")
    assert head["outcome"] == "differ" and head["diverged"]
    spread = dict(zip(head["report"]["differing"], [None] * 2))
    assert "weight" in spread and "bias" in spread
    assert head["report"]["max_divergence"] < 1e-5  # the sums agree: only the bits tell
    kept = _case(corpus, "sum-preserving")
    assert kept["diverged"] and kept["report"]["differing"] == ["w"]
    assert kept["report"]["max_divergence"] == 0.0 and "sum-preserving" in kept["message"]


def test_identical_nonfinite_parameters_are_not_divergence(corpus):
    same = _case(corpus, "nonfinite", twin=True)
    assert same["outcome"] == "nonfinite" and not same["diverged"]
    assert "not a divergence" in same["message"] and "'w'" in same["message"]
    assert "gradient" not in same["message"]
    some = _case(corpus, "nonfinite")
    assert some["outcome"] == "differ" and some["diverged"] and some["report"]["nonfinite"] == ["w"]
    assert "some replicas only" in some["message"]


@pytest.mark.parametrize("kind, words", [
    ("structure-count", "number of parameter tensors differs (2 on some replicas, 3 on others"),
    ("structure-shape", "tensor #1 'w' has another shape"),
    ("structure-dtype", "tensor #1 'w' has another dtype"),
])
def test_different_models_give_one_clear_structure_message(corpus, kind, words):
    """The replicas all return (no abort in gloo, no replica left waiting) with one message naming the
    mismatch."""
    for rank in corpus[2]:
        case = _case(corpus, kind, rank=rank)
        assert case["outcome"] == "structure" and case["diverged"]
        assert words in case["message"], case["message"]
        assert "different models" in case["message"]


@pytest.mark.parametrize("twin, where", [(False, "some"), (True, "every")])
def test_a_replica_without_parameters_is_unverified_never_identical(corpus, twin, where):
    """Nothing to compare on some replica (or on all): every replica returns, none says "identical"."""
    for rank in corpus[2]:
        case = _case(corpus, "no-parameters", twin=twin, rank=rank)
        assert case["outcome"] == "unverified" and not case["diverged"], case["message"]
        assert "no parameter tensors to compare on %s replica" % where in case["message"], case["message"]


def test_the_message_does_not_blame_a_framework(corpus):
    message = _case(corpus, "no-allreduce-sgd")["message"]
    assert "missing or misplaced gradient reduction?" in message
    assert "Lightning's TPU closure bug" not in message


# --------------------------------------------------------------------------- fingerprint, in process
def _reference_hash(tensor, position):
    """The bit hash written out in plain Python integers, from the docstring's definition."""
    mask = 0xFFFFFFFF

    def mix(x):
        x ^= x >> 16
        x = (x * 0x7FEB352D) & mask
        x ^= x >> 15
        x = (x * 0x846CA68B) & mask
        return x ^ (x >> 16)

    total = 0
    for i, w in enumerate(fingerprint.words(tensor).tolist()):
        key = (i * 0x9E3779B1 + position * 0x85EBCA77) & mask
        total += mix((w & mask) ^ key) * (((key * 0x2C1B3C6D) & mask) | 1)
    return total & mask


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.float16, torch.int8,
                                   torch.bool, torch.complex64])
def test_the_hash_is_the_documented_function_in_chunks_or_whole(dtype):
    t = (torch.randn(53) * 4).to(dtype) if dtype != torch.complex64 else torch.randn(53, dtype=dtype)
    expected = _reference_hash(t, 7)
    assert fingerprint.unsigned32(fingerprint.bit_hash(t, 7)) == expected
    assert fingerprint.unsigned32(fingerprint.bit_hash(t, 7, chunk=8)) == expected


def test_one_word_changed_always_changes_the_hash():
    t = torch.randn(257)
    base = fingerprint.unsigned32(fingerprint.bit_hash(t, 0))
    for index in range(t.numel()):
        for bits in (1, 1 << 31, 1 << 22):  # last mantissa bit, sign, an exponent bit
            changed = t.clone()
            changed.view(torch.int32)[index] ^= bits
            assert fingerprint.unsigned32(fingerprint.bit_hash(changed, 0)) != base, (index, bits)


def test_position_in_the_model_and_element_order_matter():
    t = torch.randn(4, 6)
    assert fingerprint.unsigned32(fingerprint.bit_hash(t, 0)) != fingerprint.unsigned32(fingerprint.bit_hash(t, 1))
    assert (fingerprint.unsigned32(fingerprint.bit_hash(t, 0))
            != fingerprint.unsigned32(fingerprint.bit_hash(t[[1, 0, 2, 3]], 0)))


def test_the_vector_has_one_length_whatever_the_model():
    lengths = {fingerprint.local_vector(tensors).numel() for tensors in
               ([], [torch.zeros(3)], [torch.zeros(2)] * 3000)}
    assert lengths == {fingerprint.vector_length()}


class Loopback(AgreeThenReduce):
    """A channel of ``size`` replicas that all hold what this process holds: the MAX all-reduce and the
    all-gather give back this replica's own numbers (what identical replicas give)."""

    kind = "test"
    timeout = 1

    def __init__(self, size=2, rank=0):
        self.size, self.rank = size, rank
        self.barriers = []

    def device(self, tensors):
        return torch.device("cpu")

    def agree(self, key):
        self.barriers.append(key)
        return True

    def forget(self, key):
        pass

    def all_reduce_max(self, vector):
        return vector.detach().clone()

    def all_gather(self, vector):
        return [vector.detach().clone() for _ in range(self.size)]


@pytest.fixture
def loopback(monkeypatch):
    channel = Loopback()
    monkeypatch.setattr(comm, "channel", lambda timeout=None: channel)
    return channel


def _decided(named, vector, error=None, step=5):
    layout = groups.Layout(named, 0)
    return compare.decide(fingerprint.decode(vector), layout, error, Loopback(), step, 0.0)


def test_an_unreduced_vector_reads_as_identical_replicas():
    """One replica's vector is what a MAX all-reduce of identical replicas gives: every pair agrees."""
    named = [("a", torch.randn(3)), ("b", torch.randn(2, 2))]
    layout = groups.Layout(named, 0)
    vector = fingerprint.local_vector(layout.entries, layout.structures, step=5, lanes=layout.lanes)
    assert fingerprint.decode(vector)["step"] == (5, 5)
    report = _decided(named, vector)
    assert report.outcome == "identical" and not report.diverged and report.max_divergence == 0.0
    failed = _decided(named, fingerprint.failed_vector(step=5))
    assert failed.outcome == "unverified" and "another replica could not list or fingerprint" in failed.message()


def test_absent_slots_never_differ():
    """A plain list of tensors fills slots 0..n-1; the others are absent (-inf in every copy) and
    compare as nothing, not as a difference."""
    vector = fingerprint.local_vector([torch.randn(3), torch.randn(2)])
    decoded = fingerprint.decode(vector)
    assert decoded["compared"].nonzero().flatten().tolist() == [0, 1]
    assert not bool(fingerprint.slots_differing(decoded, "bits_hi", "bits_lo", "nonfinite").any())
    assert decoded["format"] == (fingerprint.vector_format(), fingerprint.vector_format())


def test_check_sync_checks_before_the_first_update_at_the_first_step_then_every_n(loopback):
    model = torch.nn.Linear(3, 2)
    checked = [step for step in range(0, 13) if synccheck.check_sync(model, step, every=5) is not None]
    assert checked == [0, 1, 5, 10]


def test_a_stream_remembers_its_last_identical_check(loopback):
    model = torch.nn.Linear(3, 2)
    first = synccheck.compare_replicas(model, step=0)
    second = synccheck.compare_replicas(model, step=7)
    assert (first.outcome, first.first_check, first.identical_at) == ("identical", True, None)
    assert (second.outcome, second.first_check, second.identical_at) == ("identical", False, 0)
    assert "all 2 parameter tensors bitwise identical on all 2 replicas at step 7" in second.message()


def test_a_new_object_at_a_reused_address_never_inherits_a_history(loopback):
    """A list (not weakly referenceable, often built anew at every call) gets no history: never "first",
    never "identical at" a step of another list that happened to live at the same address."""
    model = torch.nn.Linear(3, 2)
    for step in (0, 1, 2):
        report = synccheck.compare_replicas(list(model.parameters()), step=step)
        assert (report.outcome, report.first_check, report.identical_at) == ("identical", False, None), step
    assert not synccheck.compare_replicas(model, step=3).identical_at  # the module's own history: new


@pytest.mark.parametrize("obj, reason", [(torch.nn.ReLU(), "no parameter tensors to compare on every replica"),
                                         ([], "no parameter tensors to compare on every replica"),
                                         (object(), "object"), ({"w": 3}, "not a tensor")])
def test_nothing_to_compare_is_unverified_never_identical(loopback, obj, reason):
    report = synccheck.compare_replicas(obj, step=1)
    assert report.outcome == "unverified" and not report.diverged, report
    assert reason in report.message(), report.message()


def _report(outcome, **fields):
    names = ["a.weight", "b.bias"]
    return synccheck.SyncReport(9, 2, "test", names, [0.0, 0.0], [0.0, 0.0], 1e-6, outcome=outcome, **fields)


def test_only_rank_0_warns_of_a_divergence_the_others_log_and_raise_is_everywhere(caplog):
    import logging

    report = _report("differ", differing=[1], versions=[[0], [1]], identical_at=4)
    assert "between step 4 (identical) and step 9" in report.message()
    assert "rank 0 holds one version; rank 1 holds another" in report.message()
    for rank, warned in ((0, 1), (1, 0)):
        fresh()
        with spoken() as seen, caplog.at_level(logging.DEBUG, "tpu_closure_fix.synccheck"):
            caplog.clear()
            reports.act(report, "warn", rank=rank)
        reported = [r for r in caplog.records if "hold different parameters" in r.getMessage()]
        assert len(seen) == warned and len(reported) == 1 and reported[0].levelno == (30 if warned else 10), rank
        with pytest.raises(synccheck.ReplicaDivergenceError):
            reports.act(report, "raise", rank=rank)


def test_agreeing_nonfinite_replicas_warn_but_never_raise_nor_call_back():
    called = []
    report = _report("nonfinite", differing=[], nonfinite=[0])
    assert not report.diverged
    for mode in ("raise", called.append):
        with spoken() as seen:
            reports.act(report, mode)
        assert len(seen) == 1 and "not a divergence" in str(seen[0].message)
    assert called == []


@pytest.mark.parametrize("rank, local_error, said", [(0, False, 1), (1, False, 0), (1, True, 1)])
def test_an_unverified_check_is_said_once_per_reason_by_rank_0_or_the_failing_rank_and_never_raises(
        rank, local_error, said):
    import logging
    import uuid

    # a reason never said before in this process (warned once per reason: id() of a temporary repeats)
    report = _report("unverified", differing=[], reason="test reason %s" % uuid.uuid4())
    report.local_error = local_error
    logged = []
    handler = logging.Handler()
    handler.emit = logged.append
    logger = logging.getLogger("tpu_closure_fix.synccheck")
    logger.addHandler(handler)
    old_level = logger.level
    logger.setLevel(logging.DEBUG)
    try:
        with spoken() as seen:
            reports.act(report, "raise", rank=rank)
            reports.act(report, "raise", rank=rank)
    finally:
        logger.removeHandler(handler)
        logger.setLevel(old_level)
    assert len(seen) == said and all("could not compare" in str(w.message) for w in seen)
    quiet = [r for r in logged if r.levelno == logging.DEBUG and "could not compare" in r.getMessage()]
    assert len(quiet) == 1 - said  # the others log it once at debug level


def test_a_structure_mismatch_raises_with_raise():
    report = _report("structure", differing=[], structure="the number of parameter tensors differs")
    assert report.diverged
    with pytest.raises(synccheck.ReplicaDivergenceError, match="different models") as info:
        reports.act(report, "raise")
    assert info.value.report is report


def test_an_unknown_outcome_is_refused():
    with pytest.raises(ValueError, match="outcome must be one of identical, differ"):
        _report("diverged")
