"""The SyncCheck Lightning callback's own logic, without Lightning and without replicas.

Each check the callback starts is answered by a stand-in for ``compare.run`` that records what it was
asked (step, stream, tolerance, channel) and returns the verdict the test chooses; the trainer is a
namespace with ``global_step`` and loggers. What is asserted: when checks run (start, step 1, every N,
end), what each fit starts from, how the outcome is logged and acted on, how the class is made from
the installed Lightning's ``Callback`` and pickled.
"""
import pickle
import types

import pytest

pytest.importorskip("torch", reason="SyncCheck compares torch tensors: no torch here")

from tpu_closure_fix.synccheck import ReplicaDivergenceError, callback, comm, report  # noqa: E402

from support.said import fresh, spoken  # noqa: E402
from support.thread_ranks import fit  # noqa: E402


class Probe(callback.SyncCheck):
    """The callback without Lightning's base classes."""


class Checks(object):
    """Stand-in for ``compare.run``: records each call, answers ``verdicts.get(step, "identical")``."""

    def __init__(self, verdicts=None):
        self.calls = []
        self.verdicts = verdicts or {}

    def __call__(self, obj, step, stream, tolerance=None, channel=None):
        self.calls.append(types.SimpleNamespace(obj=obj, step=step, key=stream.key, tolerance=tolerance,
                                                channel=channel))
        outcome = self.verdicts.get(step, "identical")
        if isinstance(outcome, Exception):
            raise outcome
        return report.SyncReport(step, 2, "fake", ["w"], outcome=outcome,
                                 differing=[0] if outcome == "differ" else ())

    @property
    def steps(self):
        return [call.step for call in self.calls]


@pytest.fixture
def world(monkeypatch):
    """(checks, channel): every check goes to a fresh :class:`Checks`; the channel is rank 0 of 2."""
    checks = Checks()
    channel = types.SimpleNamespace(rank=0, size=2, kind="fake")
    monkeypatch.setattr(callback, "run", checks)
    monkeypatch.setattr(comm, "channel", lambda timeout=None: channel)
    fresh()
    return checks, channel


class Logger(object):
    def __init__(self):
        self.logged = []

    def log_metrics(self, metrics, step=None):
        self.logged.append((step, dict(metrics)))


def _batch_ends(cb, steps, start=0):
    """A fit by hand: fit start, train start at global step ``start`` (None: no train start), one batch
    end at each of ``steps``; no train end."""
    trainer = types.SimpleNamespace(global_step=start or 0, loggers=[])
    cb.on_fit_start(trainer, None)
    if start is not None:
        cb.on_train_start(trainer, None)
    for step in steps:
        trainer.global_step = step
        cb.on_train_batch_end(trainer, None)
    return trainer


# --------------------------------------------------------------------------- options
def test_defaults_and_what_they_read_as():
    cb = Probe()
    assert (cb.every, cb.tolerance, cb.on_divergence, cb.check_at_end) == (100, 1e-6, "warn", True)
    assert repr(cb) == "SyncCheck(every=100, tolerance=1e-06, on_divergence='warn')"
    assert cb.reports == [] and cb.last_report is None


@pytest.mark.parametrize("kwargs", [{"every": 0}, {"every": 2.0}, {"tolerance": -0.1}, {"on_divergence": "log"}])
def test_bad_options_are_refused_at_construction(kwargs):
    with pytest.raises(ValueError):
        Probe(**kwargs)


# --------------------------------------------------------------------------- the class made from Lightning's
class _Callback(object):
    """A stand-in for Lightning's ``Callback``."""


def test_the_class_is_made_once_from_the_installed_lightning_callback(monkeypatch):
    monkeypatch.setattr(callback, "_classes", {})
    monkeypatch.setattr(callback, "_callback_bases", lambda: (_Callback,))
    first, second = callback.SyncCheck(every=5), callback.SyncCheck()
    assert isinstance(first, _Callback) and isinstance(first, callback.SyncCheck)
    assert type(first) is type(second) and type(first) is not callback.SyncCheck
    made = type(first)
    assert (made.__name__, made.__module__, made.__doc__) == ("SyncCheck", callback.__name__,
                                                              callback.SyncCheck.__doc__)
    assert made.__mro__[1:3] == (callback.SyncCheck, _Callback)
    copy = pickle.loads(pickle.dumps(callback.SyncCheck(every=7, tolerance=0.5, on_divergence="raise",
                                                        check_at_end=False)))
    assert type(copy) is made
    assert (copy.every, copy.tolerance, copy.on_divergence, copy.check_at_end) == (7, 0.5, "raise", False)


def test_a_subclass_is_made_as_itself(monkeypatch):
    monkeypatch.setattr(callback, "_callback_bases", lambda: pytest.fail("a subclass needs no bases"))
    assert type(Probe(every=3)) is Probe


# --------------------------------------------------------------------------- when checks run
def test_checks_at_the_start_after_step_1_every_n_and_at_the_end(world):
    checks, channel = world
    cb = Probe(every=3, tolerance=0.25)
    fit(cb, 7, module="the model")
    assert checks.steps == [0, 1, 3, 6, 7]
    assert all((c.obj, c.tolerance, c.channel) == ("the model", 0.25, channel) for c in checks.calls)
    assert [r.step for r in cb.reports] == [0, 1, 3, 6, 7] and cb.last_report is cb.reports[-1]


def test_every_step_when_every_is_1(world):
    checks, _ = world
    fit(Probe(every=1), 4)
    assert checks.steps == [0, 1, 2, 3, 4]


def test_no_second_check_at_the_end_of_a_step_just_checked(world):
    checks, _ = world
    fit(Probe(every=3), 6)
    assert checks.steps == [0, 1, 3, 6]


def test_no_check_at_the_end_when_asked_not_to(world):
    checks, _ = world
    fit(Probe(every=3, check_at_end=False), 7)
    assert checks.steps == [0, 1, 3, 6]


def test_no_end_check_after_no_optimizer_step(world):
    checks, _ = world
    fit(Probe(every=3), 0)
    assert checks.steps == [0]


def test_several_batches_per_optimizer_step_check_once(world):
    """Gradient accumulation: the global step stays the same over several batch ends."""
    checks, _ = world
    fit(Probe(every=2), 4, batches_per_step=3)
    assert checks.steps == [0, 1, 2, 4]


def test_a_step_that_jumps_over_a_multiple_is_checked_once(world):
    """Steps 1, 4, 5, 7, 9 with every=3: 4 is the first past 3, 5 is not; 7 the first past 6; 9 a multiple."""
    checks, _ = world
    _batch_ends(Probe(every=3, check_at_end=False), (1, 4, 5, 7, 9), start=None)
    assert checks.steps == [1, 4, 7, 9]


def test_each_fit_starts_a_fresh_history(world):
    checks, _ = world
    cb = Probe(every=3)
    assert cb._stream.key == "callback/0"
    fit(cb, 4)
    fit(cb, 4)
    assert checks.steps == [0, 1, 3, 4] * 2
    assert [c.key for c in checks.calls] == ["callback/1"] * 4 + ["callback/2"] * 4
    assert [r.step for r in cb.reports] == [0, 1, 3, 4]


def test_one_device_checks_nothing(world, monkeypatch):
    checks, _ = world
    monkeypatch.setattr(comm, "channel", lambda timeout=None: None)
    cb = Probe(every=1)
    fit(cb, 3)
    assert checks.calls == [] and cb.reports == []


def test_a_check_that_stands_down_ends_the_checks_of_this_fit(world):
    checks, _ = world
    checks.verdicts[1] = comm.StoodDown("peer gone")
    cb = Probe(every=1)
    with spoken():
        fit(cb, 4)
        assert checks.steps == [0, 1]
        stood = cb.reports[-1]
        assert (stood.outcome, stood.reason, stood.step, stood.world_size, stood.backend, stood.tolerance) == (
            "unverified", "peer gone", 1, 2, "fake", 1e-6)
        del checks.verdicts[1]
        fit(cb, 2)  # a new fit checks again
    assert checks.steps == [0, 1, 0, 1, 2]


# --------------------------------------------------------------------------- what is logged and done
def test_each_check_is_logged_at_its_step_through_every_logger(world):
    checks, _ = world
    checks.verdicts[1] = "differ"
    first, second = Logger(), Logger()
    with spoken():
        fit(Probe(every=5), 1, loggers=[first, second])
    assert first.logged == second.logged
    assert first.logged == [
        (0, {"sync_check/diverged": 0.0, "sync_check/differing_tensors": 0.0, "sync_check/unverified": 0.0}),
        (1, {"sync_check/diverged": 1.0, "sync_check/differing_tensors": 1.0, "sync_check/unverified": 0.0}),
    ]


def test_the_single_logger_is_used_when_there_is_no_list(world):
    single = Logger()
    fit(Probe(every=5), 0, loggers=(), logger=single)
    assert [step for step, _ in single.logged] == [0]


def test_the_end_check_is_logged_too(world):
    logger = Logger()
    fit(Probe(every=5), 3, loggers=[logger])
    assert [step for step, _ in logger.logged] == [0, 1, 3]


def test_a_trainer_with_a_logger_attribute_only(world):
    """No ``loggers`` attribute at all (an older trainer): its ``logger`` is used."""
    single = Logger()
    trainer = types.SimpleNamespace(global_step=0, logger=single)
    cb = Probe(every=5)
    cb.on_fit_start(trainer, None)
    cb.on_train_start(trainer, None)
    assert [step for step, _ in single.logged] == [0]


def test_a_resumed_fit_checks_at_its_start_its_first_step_then_every_n(world):
    """Resumed at global step 4 with every=3: 4 (start), 5 (the first step of this run), 6, 9."""
    checks, _ = world
    _batch_ends(Probe(every=3, check_at_end=False), range(4, 10), start=4)
    assert checks.steps == [4, 5, 6, 9]


def test_the_end_checks_a_last_step_no_batch_end_saw(world):
    """The step counter moved after the last batch end (step 1 reached at the end): checked at the end."""
    checks, _ = world
    cb = Probe(every=5)
    trainer = _batch_ends(cb, (0,))
    trainer.global_step = 1
    cb.on_train_end(trainer, None)
    assert checks.steps == [0, 1]


def test_a_logger_that_refuses_does_not_stop_the_others(world):
    class Refusing(object):
        def log_metrics(self, metrics, step=None):
            raise RuntimeError("disk full")

    after = Logger()
    fit(Probe(every=5), 0, loggers=[Refusing(), after])
    assert len(after.logged) == 1


def test_no_logger_at_all(world):
    cb = Probe(every=5)
    fit(cb, 1, loggers=(), logger=None)
    assert len(cb.reports) == 2


def test_a_divergence_is_said_by_rank_0_only(world):
    checks, channel = world
    checks.verdicts[1] = "differ"
    for rank, said in ((0, 1), (1, 0)):
        channel.rank = rank
        with spoken() as seen:
            fit(Probe(every=5), 1)
        assert len(seen) == said, rank


def test_raise_and_a_callable_act_on_a_divergence(world):
    checks, _ = world
    checks.verdicts[1] = "differ"
    with pytest.raises(ReplicaDivergenceError) as info:
        fit(Probe(every=5, on_divergence="raise"), 1)
    assert info.value.report.step == 1
    received = []
    cb = Probe(every=5, on_divergence=received.append)
    fit(cb, 1)
    assert received == [cb.reports[1]]
