"""check_sync, compare_replicas, listing and the SyncCheck callback, called in this process.

One process alone (no process group, or one of world size 1) compares nothing: no channel, no vector, no
report. Two replicas are two threads exchanging through memory (``comm.channel`` answers each thread
with its own channel), so the real check -- listing, fingerprint, reduction, verdict, what is said -- runs
in milliseconds; the same over real gloo processes is tests/unit/test_synccheck_replicas.py.
"""
import threading
import types

import pytest

torch = pytest.importorskip("torch", reason="SyncCheck compares torch tensors: no torch here")

from tpu_closure_fix.synccheck import (ReplicaDivergenceError, callback, check_sync, comm, compare,  # noqa: E402
                                       compare_replicas, fingerprint, report)

from support.said import fresh, spoken  # noqa: E402
from support.thread_ranks import ThreadChannel, ThreadWorld, fit, run_threads  # noqa: E402


# --------------------------------------------------------------------------- the channel of this process
def _dist(size, available=True, initialized=True):
    return types.SimpleNamespace(is_available=lambda: available, is_initialized=lambda: initialized,
                                 get_world_size=lambda: size, get_rank=lambda: 0)


@pytest.mark.parametrize("dist,expected", [
    (None, None),
    (_dist(1), None),  # a world of one: nothing to compare
    (_dist(2, available=False), None),
    (_dist(2, initialized=False), None),
    (_dist(2), comm.DistributedChannel),
], ids=["no-torch.distributed", "world-of-one", "not-available", "not-initialized", "world-of-two"])
def test_a_channel_only_with_another_replica(monkeypatch, dist, expected):
    monkeypatch.setitem(__import__("sys").modules, "torch.distributed", dist)
    monkeypatch.delitem(__import__("sys").modules, "torch_xla.core.xla_model", raising=False)
    channel = comm.channel(timeout=5)
    if expected is None:
        assert channel is None
    else:
        assert type(channel) is expected and (channel.rank, channel.size, channel.timeout) == (0, 2, 5)


@pytest.mark.parametrize("size,expected", [(1, None), (2, comm.HostChannel)], ids=["one-device", "two-devices"])
def test_a_host_channel_only_with_another_xla_device(monkeypatch, size, expected):
    """torch_xla without a process group: the check's own host channel (never an XLA collective)."""
    import sys

    monkeypatch.setitem(sys.modules, "torch.distributed", None)
    monkeypatch.setitem(sys.modules, "torch_xla.core.xla_model", types.SimpleNamespace(get_ordinal=lambda: 1))
    monkeypatch.setitem(sys.modules, "torch_xla.runtime", types.SimpleNamespace(world_size=lambda: size,
                                                                                global_ordinal=lambda: 1))
    channel = comm.channel()
    if expected is None:
        assert channel is None
    else:
        assert type(channel) is expected and (channel.rank, channel.size) == (1, 2)


def test_one_process_compares_nothing(monkeypatch):
    """check_sync / compare_replicas / the callback without another replica: no vector is ever made."""
    made = []
    monkeypatch.setattr(fingerprint, "local_vector", lambda *a, **k: made.append(a))
    monkeypatch.setattr(comm, "channel", lambda timeout=None: None)
    net = torch.nn.Linear(2, 2)
    with spoken() as seen:
        assert check_sync(net, 0) is None and check_sync(net, 1) is None and check_sync(net, 100) is None
        assert compare_replicas(net, 3) is None
        cb = _Probe(every=1)
        fit(cb, 3, net)
    assert made == [] and cb.reports == [] and cb.last_report is None
    assert seen == []


def test_one_process_with_a_process_group_of_one_compares_nothing(tmp_path, monkeypatch):
    """A real gloo group of world size 1, in this process."""
    import torch.distributed as dist

    if not dist.is_available() or dist.is_initialized():
        pytest.skip("torch.distributed unavailable, or a group already exists in this process")
    made = []
    monkeypatch.setattr(fingerprint, "local_vector", lambda *a, **k: made.append(a))
    dist.init_process_group("gloo", init_method="file://%s" % (tmp_path / "store"), rank=0, world_size=1)
    try:
        assert comm.channel() is None
        assert check_sync(torch.nn.Linear(2, 2), 1) is None
    finally:
        dist.destroy_process_group()
    assert made == []


# --------------------------------------------------------------------------- two replicas as threads
def _on_threads(monkeypatch, size, body):
    """``body(rank)`` on ``size`` threads, ``comm.channel()`` answering each with its own channel; returns
    (results by rank, the texts each rank said at warning level)."""
    world = ThreadWorld(size)
    local = threading.local()
    monkeypatch.setattr(comm, "channel", lambda timeout=None: getattr(local, "channel", None))
    out, said, errors = [None] * size, [[] for _ in range(size)], []
    monkeypatch.setattr(report, "say", lambda message, where=None, speaker=True, level=None: said[
        local.channel.rank].append(message) if speaker else None)

    def main(rank):
        local.channel = ThreadChannel(world, rank)
        try:
            out[rank] = body(rank)
        except Exception as exc:
            out[rank] = exc
            if not isinstance(exc, ReplicaDivergenceError):
                errors.append((rank, exc))
                world.barrier.abort()

    run_threads(size, main)
    assert not errors, errors
    return out, said


_seeding = threading.Lock()


def _net(seed):
    """A small model whose initial weights depend on ``seed`` only (torch's global generator: one thread at a
    time)."""
    with _seeding:
        torch.manual_seed(seed)
        return torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.Linear(2, 1))


@pytest.fixture(autouse=True)
def _nothing_said_before(monkeypatch):
    """Each test starts with no reason already said (report says each unverified reason once per process)."""
    fresh()


def test_check_sync_on_identical_replicas_says_nothing(monkeypatch):
    out, said = _on_threads(monkeypatch, 2, lambda rank: check_sync(_net(0), 1))
    assert [r.outcome for r in out] == ["identical", "identical"] and said == [[], []]
    assert out[0].names == ["0.weight", "0.bias", "1.weight", "1.bias"]


def test_check_sync_only_at_due_steps(monkeypatch):
    def body(rank):
        net = _net(0)
        return [step for step in range(0, 8) if check_sync(net, step, every=3) is not None]

    out, _ = _on_threads(monkeypatch, 2, body)
    assert out == [[0, 1, 3, 6]] * 2


def test_check_sync_on_differing_declared_replicas_warns_from_rank_0_only(monkeypatch):
    out, said = _on_threads(monkeypatch, 2, lambda rank: check_sync(_net(rank), 1, replicas="world"))
    assert [r.outcome for r in out] == ["differ", "differ"]
    assert len(said[0]) == 1 and said[1] == []
    assert "0.weight" in said[0][0]


def test_check_sync_on_a_bare_model_is_the_users_declaration_a_difference_at_the_first_check_differs(monkeypatch):
    """The default ``auto`` with no layout: calling check_sync declares the replicas, so replicas that started
    different are a divergence (``report.diverged``; ``report.in_sync`` false), said by rank 0 alone."""
    out, said = _on_threads(monkeypatch, 2, lambda rank: check_sync(_net(rank), 1))
    assert [(r.outcome, r.diverged, r.in_sync) for r in out] == [("differ", True, False)] * 2
    assert len(said[0]) == 1 and "0.weight" in said[0][0] and said[1] == []


def test_the_same_divergence_at_every_check_is_said_once_then_one_line_every_10th(monkeypatch):
    def body(rank):
        net = _net(rank)
        return [check_sync(net, step, every=1) for step in range(0, 22)]

    out, said = _on_threads(monkeypatch, 2, body)
    assert all(r.outcome == "differ" for r in out[0]) and len(out[0]) == 22
    assert len(said[0]) == 3 and "4 of 4 parameter tensors" in said[0][0] and said[1] == []
    assert "still differ as said at step 0" in said[0][1] and "(10 checks since)" not in said[0][1]
    assert said[0][1].startswith("SyncCheck: at step 10 ") and said[0][2].startswith("SyncCheck: at step 20 ")


def test_check_sync_raise_raises_on_every_rank_over_declared_replicas(monkeypatch):
    out, _ = _on_threads(monkeypatch, 2, lambda rank: check_sync(_net(rank), 1, on_divergence="raise",
                                                                 replicas="world"))
    assert all(isinstance(r, ReplicaDivergenceError) for r in out)
    assert out[0].report.outcome == "differ"


def test_check_sync_raise_on_a_bare_model_that_started_different_raises_on_every_rank(monkeypatch):
    out, _ = _on_threads(monkeypatch, 2, lambda rank: check_sync(_net(rank), 1, on_divergence="raise"))
    assert all(isinstance(r, ReplicaDivergenceError) for r in out)


def test_twin_check_sync_raise_on_a_bare_model_in_sync_never_raises(monkeypatch):
    out, said = _on_threads(monkeypatch, 2, lambda rank: check_sync(_net(0), 1, on_divergence="raise"))
    assert [(r.outcome, r.in_sync) for r in out] == [("identical", True)] * 2 and said == [[], []]


def test_check_sync_callable_receives_the_report(monkeypatch):
    seen = [[], []]
    out, said = _on_threads(monkeypatch, 2, lambda rank: check_sync(_net(rank), 1, on_divergence=seen[rank].append,
                                                                    replicas="world"))
    assert [s[0] for s in seen] == out and said == [[], []]


@pytest.mark.parametrize("kwargs", [{"every": 0}, {"every": True}, {"every": 1.5}, {"tolerance": -1.0},
                                    {"on_divergence": "ignore"}])
def test_check_sync_refuses_bad_options_before_anything(monkeypatch, kwargs):
    monkeypatch.setattr(comm, "channel", lambda timeout=None: pytest.fail("no channel may be asked for"))
    with pytest.raises(ValueError):
        check_sync(_net(0), 1, **kwargs)


def test_a_plain_list_of_tensors_is_compared(monkeypatch):
    out, _ = _on_threads(monkeypatch, 2, lambda rank: check_sync([torch.ones(2), torch.full((2,), float(rank))], 1,
                                                                 replicas="world"))
    assert [r.outcome for r in out] == ["differ", "differ"]
    assert out[0].names == ["param0", "param1"]
    assert out[0].differing == [1]  # positions in ``names``: param1 only


def test_an_error_in_named_parameters_is_said_with_its_cause(monkeypatch):
    class Broken(object):
        def named_parameters(self):
            raise RuntimeError("parameters are gone")

    out, said = _on_threads(monkeypatch, 2, lambda rank: compare_replicas(_net(0) if rank == 0 else Broken(), 1))
    assert [r.outcome for r in out] == ["unverified", "unverified"]
    assert out[1].reason == "listing the parameters of Broken failed (RuntimeError: parameters are gone)"
    assert out[1].local_error and not out[0].local_error
    assert out[0].reason == "another replica could not list or fingerprint its parameters"


# --------------------------------------------------------------------------- listing
def test_listing_each_kind_of_argument():
    a, b = torch.ones(1), torch.zeros(2)
    net = torch.nn.Linear(1, 1)
    optimizer = torch.optim.SGD([{"params": [a]}, {"params": [b]}], lr=0.1)
    assert compare.listed([a, b]) == [("param0", a), ("param1", b)]
    assert compare.listed([("x", a), ("y", b)]) == [("x", a), ("y", b)]
    assert compare.listed({"x": a}) == [("x", a)]
    assert compare.listed(a) == [("tensor", a)]
    assert compare.listed(net) == list(net.named_parameters())
    assert compare.listed(optimizer) == [("param_groups[0][0]", a), ("param_groups[1][0]", b)]


def test_listing_refusals_say_why():
    with pytest.raises(compare.Unlisted) as info:
        compare.listed([torch.ones(1), "text"])
    assert str(info.value) == "list holds 'str', not a tensor, under 'param1'"
    with pytest.raises(compare.Unlisted) as info:
        compare.listed(5)
    assert str(info.value) == "listing the parameters of int failed (TypeError: 'int' object is not iterable)"


# --------------------------------------------------------------------------- the callback, really checking
class _Probe(callback.SyncCheck):
    """The callback's own logic without Lightning's base classes."""


def test_the_callback_compares_the_replicas_for_real(monkeypatch):
    out, said = _on_threads(monkeypatch, 2, lambda rank: fit(_Probe(every=2), 3, _net(0)).reports)
    assert [[r.outcome for r in reports] for reports in out] == [["identical"] * 4] * 2
    assert [r.step for r in out[0]] == [0, 1, 2, 3] and out[0][0].first_check and not out[0][1].first_check
    assert said == [[], []]


class DDPStrategy(object):
    """A stand-in for Lightning's DDP strategy: its class name and its world size, what the callback reads."""
    world_size = 2


class DeepSpeedStrategy(DDPStrategy):
    """Lightning's DeepSpeed strategy derives from DDP's, yet shards what it holds."""


class DDPPlugin(object):
    """Lightning 1.5's training type plugin for DDP (``trainer.training_type_plugin``, no ``trainer.strategy``)."""
    world_size = 2


@pytest.mark.parametrize("declared", [{"replicas": "world"}, {"strategy": DDPStrategy()},
                                      {"training_type_plugin": DDPPlugin()}],
                         ids=["replicas-world", "ddp-strategy", "ddp-plugin"])
def test_the_callback_on_declared_replicas_that_started_different(monkeypatch, declared):
    declared = dict(declared)
    replicas = declared.pop("replicas", "auto")
    out, said = _on_threads(monkeypatch, 2, lambda rank: fit(_Probe(every=5, replicas=replicas), 1, _net(rank),
                                                             **declared).reports)
    assert [r.outcome for r in out[0]] == ["differ", "differ"] and out[0][0].started_different
    assert len(said[0]) == 1 and said[1] == []  # the check after step 1 finds the same divergence: not said again
    assert "of Sequential" in said[0][0]  # the report names what the callback compared


@pytest.mark.parametrize("strategy", [None, DeepSpeedStrategy()], ids=["no-strategy", "deepspeed"])
def test_the_callback_on_a_bare_model_compares_it_over_the_world_whatever_the_strategy(monkeypatch, strategy):
    """Adding the callback declares the replicas: with no layout, every parameter is compared over the world."""
    out, said = _on_threads(monkeypatch, 2, lambda rank: fit(_Probe(every=5), 1, _net(rank),
                                                             strategy=strategy).reports)
    assert [(r.outcome, r.rule, r.in_sync) for r in out[0]] == [("differ", None, False)] * 2
    assert len(said[0]) == 1 and said[1] == []


@pytest.mark.parametrize("strategy", [None, DeepSpeedStrategy()], ids=["no-strategy", "deepspeed"])
def test_twin_the_callback_on_a_bare_model_in_sync_is_in_sync(monkeypatch, strategy):
    out, said = _on_threads(monkeypatch, 2, lambda rank: fit(_Probe(every=5), 1, _net(0), strategy=strategy).reports)
    assert [(r.outcome, r.in_sync) for r in out[0]] == [("identical", True)] * 2 and said == [[], []]


def test_the_callback_raise_option_raises_at_the_first_check(monkeypatch):
    out, _ = _on_threads(monkeypatch, 2, lambda rank: fit(_Probe(on_divergence="raise"), 1, _net(rank),
                                                          strategy=DDPStrategy()))
    assert all(isinstance(r, ReplicaDivergenceError) and r.report.step == 0 for r in out)


def test_the_callback_raise_option_on_a_bare_model_raises_too(monkeypatch):
    out, _ = _on_threads(monkeypatch, 2, lambda rank: fit(_Probe(on_divergence="raise"), 1, _net(rank)))
    assert all(isinstance(r, ReplicaDivergenceError) and r.report.step == 0 for r in out)


def test_the_callback_stand_down_names_the_module_never_the_stream_key(monkeypatch):
    said = []
    monkeypatch.setattr(comm, "channel", lambda timeout=None: ThreadChannel(ThreadWorld(2), 0, agree=False))
    monkeypatch.setattr(report, "say", lambda message, where=None, speaker=True, level=None: said.append(message))
    cb = fit(_Probe(every=5), 3, _net(0))
    assert [r.outcome for r in cb.reports] == ["unverified"]  # then the callback stands down: no more checks
    assert len(said) == 1 and "callback/" not in said[0], said
    assert said[0].startswith("SyncCheck could not compare the replicas of Sequential at step 0: not every rank "
                              "reached this check (check #0) within 5s")


def test_the_callback_repr_and_pickle_arguments():
    cb = _Probe(every=7, tolerance=0.5, on_divergence="raise", check_at_end=False)
    assert repr(cb) == "SyncCheck(every=7, tolerance=0.5, on_divergence='raise')"
    assert cb.__reduce__() == (callback.SyncCheck, (7, 0.5, "raise", False, "auto"))
