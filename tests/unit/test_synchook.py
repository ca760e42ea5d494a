"""The zero-code SyncCheck (tpu_closure_fix/synccheck/hook.py): parsing, arming, counting, acting, failing safely.

In-process tests use the real torch optimizers and torch's real global hook registry; the comparison
itself (a collective) is replaced only where a test needs a given verdict on one process. The
start-up path runs in fresh ``python -S`` interpreters (as tests/unit/test_startup.py), and one
2-process gloo run shows the whole path: divergent replicas are reported by rank 0 at steps 1 and 10
(identical at step 0, before the first update), reduced ones are not.
"""
import copy
import gc
import importlib
import json
import os
import subprocess
import sys
import sysconfig
import types

import pytest

torch = pytest.importorskip("torch", reason="SyncCheck hooks torch optimizers: no torch here")
if not hasattr(importlib.import_module("torch.optim.optimizer"), "register_optimizer_step_post_hook"):
    pytest.skip("the zero-code SyncCheck needs torch >= 2.0 (its global step post-hook); torch %s here"
                % torch.__version__, allow_module_level=True)

from support import handed as handed_checks, ports  # noqa: E402  (after the skip: needs torch)
from support.said import fresh, spoken  # noqa: E402
from test_startup import standin  # noqa: E402,F401  (the fixture: a folder with an empty torch_xla package)
from tpu_closure_fix import config, settings, synccheck  # noqa: E402  (after the skip: needs torch)
from tpu_closure_fix.synccheck import comm, compare, groups  # noqa: E402
from tpu_closure_fix.synccheck import hook as synchook  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TESTS = os.path.join(REPO, "tests")


@pytest.fixture(autouse=True)
def disarmed():
    """Every test starts and ends with the check disarmed, no warning remembered and no check seen."""
    synchook.disarm()
    fresh()
    synchook.seen.update(checks=0, last_report=None)
    yield
    synchook.disarm()
    fresh()


def sgd(n=2):
    return torch.optim.SGD([torch.nn.Parameter(torch.ones(n))], lr=0.1)


def step(optimizer):
    for group in optimizer.param_groups:
        for p in group["params"]:
            p.grad = torch.ones_like(p)
    optimizer.step()


def diverged_report(step_number):
    return synccheck.SyncReport(step_number, 2, "torch.distributed", ["w"], [0.5], [0.1], 1e-6, outcome="differ",
                                differing=[0], versions=[[0], [1]])


class Channel(object):
    """What ``comm.channel()`` gives in a job of 2 processes, for the tests that replace the comparison."""

    kind, size, timeout = "torch.distributed", 2, 1

    def __init__(self, rank=0):
        self.rank = rank


@pytest.fixture
def verdict(monkeypatch):
    """``verdict(fn, rank=0)``: every check on this process is rank ``rank`` of 2, and ``compare.run`` gives
    ``fn(step)`` instead of comparing."""
    def set_verdict(fn, rank=0):
        channel = Channel(rank)
        monkeypatch.setattr(comm, "channel", lambda timeout=None: channel)
        monkeypatch.setattr(compare, "run", lambda obj, n, stream, **kwargs: _named_by(stream, fn(n)))
    return set_verdict


def _named_by(stream, report):
    """A stand-in's ``report`` as ``compare.run`` builds it: named as ``stream`` names it (its label, module
    paths: :meth:`compare.Stream.naming`)."""
    if report is None:
        return None
    named = copy.copy(report)
    named.names, named.not_compared, named.set_aside, named.stream = stream.naming(
        report.outcome, report.names, report.not_compared, report.set_aside)
    return named


# --------------------------------------------------------------------------- parsing
@pytest.mark.parametrize("raw, every", [(None, 0), ("", 0), ("0", 0), (" 10 ", 10), ("1", 1), ("007", 7),
                                        ("999999999999", 999999999999)])
def test_accepted_step_counts(raw, every):
    assert settings.parse_every(raw) == (every, None)


@pytest.mark.parametrize("raw", ["-1", "+5", "1.5", "ten", "10 steps", "\u0661\u0660", "\uff11\uff10",
                                 "9" * 13, "1e3"])
def test_refused_step_counts_name_the_accepted_values(raw):
    every, problem = settings.parse_every(raw)
    assert every == 0
    flat = " ".join(problem.split())  # wrapped at 120 columns
    assert flat.startswith("TPU_CLOSURE_FIX_SYNC_CHECK=") and "ASCII digits" in flat and "off" in flat
    assert len(problem) < 400


@pytest.mark.parametrize("raw, action", [(None, "warn"), ("", "warn"), ("warn", "warn"), (" RAISE ", "raise")])
def test_accepted_actions(raw, action):
    assert settings.parse_action(raw) == (action, None)


@pytest.mark.parametrize("raw", ["stop", "warn!", "r\u0430ise", "1"])  # \u0430: a Cyrillic a
def test_refused_actions_fall_back_to_warn(raw):
    action, problem = settings.parse_action(raw)
    assert action == "warn" and "accepted: warn (the default) or raise" in " ".join(problem.split())


@pytest.mark.parametrize("raw, group", [(None, "auto"), ("", "auto"), (" World ", "world"), ("AUTO", "auto")])
def test_accepted_groups(raw, group):
    assert settings.parse_group(raw) == (group, None)


@pytest.mark.parametrize("raw", ["all", "0,1", "w\u043erld", "1"])  # \u043e: a Cyrillic o
def test_refused_groups_fall_back_to_auto(raw):
    group, problem = settings.parse_group(raw)
    flat = " ".join(problem.split())  # wrapped at 120 columns
    assert group == "auto" and flat.startswith("TPU_CLOSURE_FIX_SYNC_CHECK_GROUP=")
    assert "accepted: auto (the default: decided at each optimizer's first check) or world" in flat


def test_the_group_variable_arms_the_streams_with_it():
    environ = {"TPU_CLOSURE_FIX_SYNC_CHECK": "4", "TPU_CLOSURE_FIX_SYNC_CHECK_GROUP": "world"}
    try:
        assert synchook.arm_from_environment(environ) == 4 and synchook._armed["replicas"] == "world"
        assert synchook._entry(object.__new__(_Optimizer))[0].replicas == "world"
        synchook.arm_from_environment({"TPU_CLOSURE_FIX_SYNC_CHECK": "4"})
        assert synchook._armed["replicas"] == "auto"
    finally:
        synchook.disarm()


class _Optimizer(object):
    param_groups = []


def test_a_bad_value_warns_once_and_stays_off():
    environ = {"TPU_CLOSURE_FIX_SYNC_CHECK": "ten"}
    with spoken() as seen:
        assert synchook.arm_from_environment(environ) == 0
        assert synchook.arm_from_environment(environ) == 0
    assert len(seen) == 1
    assert synchook.armed_every() == 0


def test_a_bad_action_warns_and_arms_with_warn():
    environ = {"TPU_CLOSURE_FIX_SYNC_CHECK": "4", "TPU_CLOSURE_FIX_SYNC_CHECK_ON_DIVERGENCE": "halt"}
    with spoken() as seen:
        assert synchook.arm_from_environment(environ) == 4
    assert len(seen) == 1 and "ON_DIVERGENCE='halt'" in seen[0].message
    assert synchook.armed_every() == 4 and synchook._armed["action"] == "warn"


def test_startup_module_names_the_same_variable():
    from test_config import load_startup

    assert load_startup().SYNC_CHECK_VAR == config.SYNC_CHECK_VAR == synchook.SYNC_CHECK_VAR


# --------------------------------------------------------------------------- arming
def test_arm_puts_one_hook_in_torchs_registry_and_disarm_takes_it_out():
    from torch.optim.optimizer import _global_optimizer_post_hooks as registry

    before = len(registry)
    synchook.arm(3)
    synchook.arm(3)
    assert synchook.armed_every() == 3 and len(registry) == before + 1
    synchook.disarm()
    assert synchook.armed_every() == 0 and len(registry) == before


def test_torch_without_the_global_hook_gets_one_warning():
    class OldTorchOptim(object):
        pass

    synchook._armed["every"] = 5
    with spoken() as seen:
        synchook._register(OldTorchOptim())
        synchook._register(OldTorchOptim())
    assert len(seen) == 1 and "needs torch >= 2.0" in str(seen[0].message)
    assert synchook._armed["handles"] is None


# --------------------------------------------------------------------------- counting
@pytest.fixture
def checks(monkeypatch):
    """Record (optimizer, step) of every check instead of comparing."""
    seen = []
    def check(optimizer, stream, n):
        stream.checks += 1  # as compare.run does
        seen.append((optimizer, n))

    monkeypatch.setattr(synchook, "_check", check)
    return seen


def test_the_start_the_first_and_every_nth_step_of_each_optimizer_are_checked(checks):
    """Step 0: before the optimizer's first update (how the replicas started); then after step 1 and every N."""
    synchook.arm(3)
    first, second = sgd(), sgd()
    for _ in range(7):
        step(first)
    for _ in range(3):
        step(second)
    assert [(o is first, n) for o, n in checks] == [(True, 0), (True, 1), (True, 3), (True, 6), (False, 0),
                                                    (False, 1), (False, 3)]


def test_optimizers_of_the_same_shapes_are_told_apart_alike_on_every_rank(checks):
    """The stream of an optimizer is named by its parameters' shapes and dtypes and how many such
    optimizers stepped before it: what every rank computes alike."""
    synchook.arm(1)
    first, second, other = sgd(), sgd(), sgd(3)
    for optimizer in (first, second, other):
        step(optimizer)
    keys = [synchook._counts[id(o)][0].key for o in (first, second, other)]
    assert keys[0].endswith("-1") and keys[1] == keys[0][:-1] + "2" and keys[2].endswith("-1")
    assert len(set(k.rsplit("-", 1)[0] for k in keys)) == 2


def test_an_optimizer_of_the_same_shapes_first_stepped_through_other_calls_is_another_stream(monkeypatch):
    """A probe over a copy of the model, stepped on rank 0 alone through the same ``train_step`` helper called
    from another line, must not take the name every rank gives the model's optimizer (its checks would be
    compared with the model's on the other ranks): the user's calls that first step an optimizer are part of
    its name; the same calls on every rank name it alike, wherever the script sits."""
    monkeypatch.setattr(synchook, "_digests", {})
    probe = synchook._stream_key(sgd(), (("/home/a/train.py", 12), ("/home/a/train.py", 40)))
    model = synchook._stream_key(sgd(), (("/home/a/train.py", 12), ("/home/a/train.py", 52)))
    monkeypatch.setattr(synchook, "_digests", {})  # another rank: it never steps the probe
    model_elsewhere = synchook._stream_key(sgd(), (("/srv/b/train.py", 12), ("/srv/b/train.py", 52)))
    assert model == model_elsewhere and probe != model
    assert probe.rsplit("-", 1)[0] != model.rsplit("-", 1)[0]


def test_twin_the_same_calls_and_shapes_are_told_apart_by_their_count_alone(monkeypatch):
    monkeypatch.setattr(synchook, "_digests", {})
    calls = (("train.py", 12), ("train.py", 52))
    first, second = synchook._stream_key(sgd(), calls), synchook._stream_key(sgd(), calls)
    assert first.rsplit("-", 1)[0] == second.rsplit("-", 1)[0] and (first[-2:], second[-2:]) == ("-1", "-2")


def test_the_user_calls_skip_this_package_and_pythons_library():
    """Innermost first: the line in ``helper``, then the line calling it; no frame of this package or of Python's
    own library (``threading`` here: the call runs in a thread)."""
    import sysconfig
    import threading

    def helper():
        return synchook._user_calls()

    found = []
    thread = threading.Thread(target=lambda: found.append(helper()))
    thread.start()
    thread.join(10)
    calls = found[0]
    assert calls[0] == (__file__, helper.__code__.co_firstlineno + 1) and calls[1][0] == __file__, calls
    stdlib = os.path.abspath(sysconfig.get_paths()["stdlib"]) + os.sep
    package = os.path.dirname(os.path.abspath(synchook.__file__)) + os.sep
    assert not [name for name, _ in calls if os.path.abspath(name).startswith((stdlib, package))], calls


def _group_made_with(monkeypatch, channel, ready=None):
    """What ``group_made`` does with ``comm.channel()`` answering ``channel``: (groups readied, warm-ups)."""
    from tpu_closure_fix.synccheck import fingerprint, worker

    readied, warmed = [], []
    monkeypatch.setattr(comm, "channel", lambda timeout=None: channel)
    monkeypatch.setattr(comm, "default_group_id", lambda: "the-group")
    monkeypatch.setattr(worker, "ready", ready or readied.append)
    monkeypatch.setattr(fingerprint, "warm", lambda: warmed.append(True))
    synchook.group_made()
    return readied, warmed


def test_a_process_group_made_while_armed_readies_the_worker_and_the_fingerprint(monkeypatch):
    synchook.arm(5)
    channel = comm.DistributedChannel.__new__(comm.DistributedChannel)
    assert _group_made_with(monkeypatch, channel) == (["the-group"], [True])


@pytest.mark.parametrize("armed,channel", [(False, "process group"), (True, None), (True, "host")],
                         ids=["disarmed", "world-of-one", "host-channel"])
def test_twin_no_worker_is_readied_disarmed_alone_or_on_the_host_channel(monkeypatch, armed, channel):
    if armed:
        synchook.arm(5)
    made = {"process group": comm.DistributedChannel, "host": comm.HostChannel}.get(channel)
    assert _group_made_with(monkeypatch, made.__new__(made) if made else None) == ([], [])


def test_a_failure_while_readying_is_said_once_and_disarms_and_the_group_stands(monkeypatch):
    synchook.arm(5)

    def planted(group):
        raise RuntimeError("planted")
    with spoken() as seen:
        _group_made_with(monkeypatch, comm.DistributedChannel.__new__(comm.DistributedChannel), ready=planted)
    assert not synchook.armed_every()
    assert len(seen) == 1 and "RuntimeError: planted" in seen[0].message and "training goes on" in seen[0].message, seen


def test_init_process_group_tells_the_hook_once_the_group_is_made(monkeypatch, tmp_path):
    """The wrapped ``init_process_group`` (bound under both of its names) makes the group, then tells the hook."""
    import torch.distributed as dist

    from tpu_closure_fix.synccheck import worker

    if not dist.is_available() or dist.is_initialized():
        pytest.skip("torch.distributed unavailable, or a group already exists in this process")
    worker._watch_init()
    assert dist.distributed_c10d.init_process_group is dist.init_process_group
    told = []
    monkeypatch.setattr(synchook, "group_made", lambda: told.append(dist.is_initialized()))
    assert dist.init_process_group("gloo", init_method="file://%s" % (tmp_path / "store"), rank=0,
                                   world_size=1) is None
    try:
        assert told == [True]
    finally:
        dist.destroy_process_group()


def test_arming_reads_the_one_time_facts_before_any_optimizer_steps(monkeypatch):
    """The hash module, Python's library folders and the libraries' names are read when the hooks go in (with
    torch), not inside an optimizer's first step, where they would hold the training thread."""
    from tpu_closure_fix.synccheck import fingerprint

    from tpu_closure_fix.synccheck import report

    monkeypatch.setattr(synchook, "_python_dirs", [])
    monkeypatch.setattr(fingerprint, "_xxhash", [])
    monkeypatch.setattr(report, "_library_names", [])
    synchook.arm(5)
    assert synchook._python_dirs and fingerprint._xxhash and report._library_names


def test_the_library_folders_are_read_again_once_a_framework_is_imported(monkeypatch, tmp_path):
    """The folders a check skips are kept between checks, and read again when a library module appears: a
    framework imported after the first check is still not the user's code."""
    from tpu_closure_fix.sites import top_level_packages
    from tpu_closure_fix.synccheck import report

    name = sorted(top_level_packages())[0]
    monkeypatch.delitem(sys.modules, name, raising=False)
    before = report.library_dirs()
    assert report.library_dirs() is before  # kept while the libraries imported stay the same
    framework = types.ModuleType(name)
    framework.__file__ = str(tmp_path / name / "__init__.py")
    monkeypatch.setitem(sys.modules, name, framework)
    assert str(tmp_path / name) + os.sep in report.library_dirs()
    assert str(tmp_path / name) + os.sep not in before


def test_a_relative_code_path_is_read_against_the_working_directory_of_the_moment(monkeypatch, tmp_path):
    from tpu_closure_fix.synccheck import report

    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    monkeypatch.chdir(tmp_path / "a")
    assert report.code_path("train.py") == str(tmp_path / "a" / "train.py")
    monkeypatch.chdir(tmp_path / "b")
    assert report.code_path("train.py") == str(tmp_path / "b" / "train.py")
    assert report.code_path(str(tmp_path / "a" / ".." / "c.py")) == str(tmp_path / "c.py")


def test_unset_no_step_is_counted(checks):
    optimizer = sgd()
    for _ in range(6):
        step(optimizer)
    assert checks == [] and synchook._counts == {}


def test_a_step_inside_another_optimizers_step_is_not_counted(checks):
    class Wrapper(torch.optim.Optimizer):  # like ZeroRedundancyOptimizer: steps an inner optimizer
        def __init__(self, inner):
            self.inner = inner
            super().__init__([p for g in inner.param_groups for p in g["params"]], {})

        def step(self, closure=None):
            self.inner.step(closure)

    synchook.arm(2)
    inner = sgd()
    outer = Wrapper(inner)
    for _ in range(4):
        step(outer)
    assert [(o is outer, n) for o, n in checks] == [(True, 0), (True, 1), (True, 2), (True, 4)]
    assert id(inner) not in synchook._counts


def test_a_step_that_raised_does_not_stop_the_counting(checks):
    synchook.arm(2)
    optimizer = sgd()

    def failing():
        raise ValueError("closure failed")

    with pytest.raises(ValueError):
        optimizer.step(failing)
    step(optimizer)
    step(optimizer)
    assert [n for _, n in checks] == [0, 1, 2]  # the start checked once, before the step that raised


def test_a_collected_optimizer_is_forgotten(checks):
    synchook.arm(5)
    optimizer = sgd()
    step(optimizer)
    key = id(optimizer)
    assert list(synchook._counts) == [key] and synchook._counts[key][1] == [1]
    del optimizer, checks[:]  # the record of its first check held it too
    gc.collect()
    assert key not in synchook._counts


# --------------------------------------------------------------------------- acting
def test_warn_points_at_the_line_that_stepped(verdict):
    verdict(diverged_report)
    synchook.arm(2)
    optimizer = sgd()
    with spoken() as seen:
        step(optimizer)
        step(optimizer)
        step(optimizer)
    assert len(seen) == 1 and "at step 0" in seen[0].message  # steps 1 and 2: the same divergence, said once
    assert seen[0].filename == os.path.abspath(__file__) and "optimizer.step()" in open(__file__).readlines()[
        seen[0].lineno - 1]
    assert synchook.seen["last_report"].step == 2 and synchook.seen["checks"] == 3


def _differing(names):
    """A verdict: the tensors ``names`` (of w, v, u) differ, rank 0 against rank 1."""
    def made(step_number):
        listed = ["w", "v", "u"]
        return synccheck.SyncReport(step_number, 2, "torch.distributed", listed, [0.5] * 3, [0.1] * 3, 1e-6,
                                    outcome="differ", differing=[listed.index(n) for n in names],
                                    versions=[[0], [1]])
    return made


def test_the_same_divergence_again_is_one_short_line_every_10th_check_a_change_is_said_in_full(verdict):
    verdict(_differing(["w"]))
    synchook.arm(1)
    optimizer = sgd()
    with spoken() as seen:
        for _ in range(21):
            step(optimizer)  # checks at steps 0 .. 21: 22 checks of the same divergence
    assert [m.message.split(":")[0] for m in seen] == ["SyncCheck"] * 3
    assert "1 of 3 parameter tensors" in seen[0].message and "Build the model" not in seen[1].message
    assert seen[1].message.startswith("SyncCheck: at step 10 the replicas of SGD over ") and \
        "still differ as said at step 0 (1 of 3 parameter tensors, the same ranks; 10 checks since)" in seen[1].message
    assert "at step 20 " in seen[2].message and "20 checks since" in seen[2].message
    verdict(_differing(["w", "v"]))  # another tensor differs now: said in full at once
    with spoken() as seen:
        step(optimizer)
    assert len(seen) == 1 and "2 of 3 parameter tensors" in seen[0].message


def test_twin_with_the_report_said_every_time_each_divergence_would_be_a_paragraph(verdict, monkeypatch):
    from tpu_closure_fix.synccheck import report

    monkeypatch.setattr(report, "repeat_of", lambda stream, said: None)
    verdict(_differing(["w"]))
    synchook.arm(1)
    optimizer = sgd()
    with spoken() as seen:
        for _ in range(5):
            step(optimizer)
    assert len(seen) == 6


def test_only_rank_0_warns_the_others_log_at_debug_level(verdict, caplog):
    import logging

    verdict(diverged_report, rank=1)
    synchook.arm(1)
    with spoken() as seen, caplog.at_level(logging.DEBUG, "tpu_closure_fix.synccheck"):
        step(sgd())
    assert seen == [] and synchook.seen["last_report"].diverged
    debug = [r.getMessage() for r in caplog.records if r.levelno == logging.DEBUG]
    assert len([m for m in debug if m.startswith("sync check of SGD over ")]) == 2  # each check's info line
    assert len([m for m in debug if "hold different parameters" in m]) == 1  # the report, once (then: the same)
    assert "at step 0" in caplog.text and "at step 1" in caplog.text


@pytest.mark.parametrize("rank", [0, 1])
def test_raise_stops_the_step_on_every_rank(verdict, rank):
    verdict(diverged_report, rank=rank)
    synchook.arm(1, "raise")
    optimizer = sgd()
    with pytest.raises(synccheck.ReplicaDivergenceError, match="at step 0"):
        step(optimizer)  # the check before the first update: the step is not taken
    assert optimizer.param_groups[0]["params"][0].tolist() == [1.0, 1.0]


def test_replicas_in_sync_no_warning(verdict):
    verdict(lambda n: synccheck.SyncReport(n, 2, "torch.distributed", ["w"], [0.0], [0.0], 1e-6))
    synchook.arm(1, "raise")
    with spoken() as seen:
        step(sgd())
    assert synchook.seen["last_report"].diverged is False and seen == []


def test_a_stream_that_stood_down_is_not_checked_again_and_training_goes_on(monkeypatch):
    """Not every rank reached the check (a probe optimizer stepped on one rank only): one warning, that
    optimizer's checks stop, the others go on."""
    monkeypatch.setattr(comm, "channel", lambda timeout=None: Channel())
    calls = []

    def stood_down(obj, n, stream, **kwargs):
        calls.append((obj, n))
        if len(calls) == 1:
            raise comm.StoodDown("not every rank reached this check")
        return synccheck.SyncReport(n, 2, "torch.distributed", ["w"], [0.0], [0.0], 1e-6)

    monkeypatch.setattr(compare, "run", stood_down)
    synchook.arm(1)
    probe, model = sgd(), sgd(3)
    with spoken() as seen:
        for _ in range(3):
            step(probe)
        step(model)
    assert len(seen) == 1 and "stands down" in str(seen[0].message) and "Training goes on" in str(seen[0].message)
    assert [(o is probe, n) for o, n in calls] == [(True, 0), (False, 0), (False, 1)]
    assert synchook.armed_every() == 1


def test_two_streams_standing_down_for_the_same_reason_are_each_named(monkeypatch):
    """The reason ("check #0") is the same for both: each optimizer's stand-down is still said."""
    monkeypatch.setattr(comm, "channel", lambda timeout=None: Channel())

    def stood_down(obj, n, stream, **kwargs):
        raise comm.StoodDown("not every rank reached this check (check #0)")

    monkeypatch.setattr(compare, "run", stood_down)
    synchook.arm(1)
    with spoken() as seen:
        step(sgd())
        step(sgd(3))
    assert len(seen) == 2 and all("stands down" in str(w.message) for w in seen)


def test_a_failure_in_the_check_warns_once_disarms_and_training_goes_on(verdict):
    def broken(n):
        raise RuntimeError("collective unavailable")

    verdict(broken)
    synchook.arm(1)
    optimizer = sgd()
    with spoken() as seen:
        for _ in range(3):
            step(optimizer)
    assert len(seen) == 1 and "failed (RuntimeError: collective unavailable) and is now off" in str(seen[0].message)
    assert synchook.armed_every() == 0
    assert optimizer.param_groups[0]["params"][0].tolist() == pytest.approx([0.7, 0.7])  # all 3 steps taken


def test_shards_are_left_out_of_the_comparison():
    shard = torch.nn.Parameter(torch.ones(2))
    shard._is_sharded = True
    whole = torch.nn.Parameter(torch.ones(3, 2))
    optimizer = torch.optim.SGD([shard, whole], lr=0.1)
    layout = groups.Layout(compare.listed(optimizer), 0)
    assert layout.names == ["param_groups[0][1]"] and [t is whole for _, _, t in layout.entries] == [True]
    assert layout.not_compared == [("param_groups[0][0]", groups.FLAT_SHARD)]


# --------------------------------------------------------------------------- start-up and processes
#: What a start-up case prints; torch (slow to import) is imported only where the check's module is loaded.
REPORT = """
import json, sys
synchook = sys.modules.get("tpu_closure_fix.synccheck.hook")
if synchook is not None and synchook._armed["every"]:  # asked for: torch's live registry says whether it is in
    import torch.optim
    from torch.optim.optimizer import _global_optimizer_post_hooks as registry
armed = synchook is not None and synchook._armed["every"] > 0 and any(
    hook is synchook._after_step for hook in registry.values())
print(json.dumps({"activated": "tpu_closure_fix" in sys.modules, "loaded": synchook is not None, "armed": armed}))
"""


def startup_run(standin, **variables):
    path = [standin, os.path.join(REPO, "startup"), REPO, sysconfig.get_paths()["purelib"]]
    env = {k: v for k, v in os.environ.items() if not k.startswith("TPU_CLOSURE_FIX") and k != "PYTHONPATH"}
    env.update(variables, PYTHONPATH=os.pathsep.join(path))
    code = "import _tpu_closure_fix_startup\nimport torch_xla\n" + REPORT
    proc = subprocess.run([sys.executable, "-S", "-c", code], env=env, capture_output=True, text=True, timeout=120,
                          cwd=standin)
    assert proc.returncode == 0, proc.stderr
    ours = []  # each of our reports, its indented lines joined to it
    for line in proc.stderr.splitlines():
        if ours and line.startswith("    "):
            ours[-1] += " " + line.strip()
        elif line.strip():
            ours.append(line)
    ours = [said for said in ours if "TPU_CLOSURE_FIX" in said]
    return json.loads(proc.stdout.strip().splitlines()[-1]), ours


def test_the_watcher_arms_it_with_the_fix_off(standin):
    assert startup_run(standin, TPU_CLOSURE_FIX="0", TPU_CLOSURE_FIX_SYNC_CHECK="5") == (
        {"activated": True, "loaded": True, "armed": True}, [])


def test_the_watcher_twin_unset_imports_nothing(standin):
    assert startup_run(standin, TPU_CLOSURE_FIX="0") == ({"activated": False, "loaded": False, "armed": False}, [])
    assert startup_run(standin) == ({"activated": True, "loaded": False, "armed": False}, [])


def test_the_watcher_with_a_bad_value_warns_once(standin):
    report, ours = startup_run(standin, TPU_CLOSURE_FIX="0", TPU_CLOSURE_FIX_SYNC_CHECK="often")
    assert report["armed"] is False and len(ours) == 1 and "accepted" in ours[0]


def test_two_replicas_without_reduction_warn_at_steps_1_and_10_and_reduced_ones_do_not(tmp_path):
    """2 gloo processes of support.zero_code's plain torch loop (different data), TPU_CLOSURE_FIX=0, a check
    before the first update, after the first step and every 10 steps: first without the gradient all-reduce, then (a new model and
    optimizer) with it. Rank 0 warns; rank 1 reaches the same verdict and only logs it."""
    from tpu_closure_fix.verify.child import run_children

    port = ports.free_port()
    outs = [str(tmp_path / ("rank%d.json" % rank)) for rank in range(2)]
    scenarios = json.dumps([{"api": "torch", "steps": 12, "reduce": reduce} for reduce in (False, True)])
    env = {k: v for k, v in os.environ.items() if not k.startswith("TPU_CLOSURE_FIX")}
    env.update(TPU_CLOSURE_FIX="0", TPU_CLOSURE_FIX_SYNC_CHECK="10", PYTHONPATH=os.pathsep.join([REPO, TESTS]))
    commands = [[sys.executable, "-m", "support.zero_code", "--rank", str(rank), "--world", "2", "--port",
                 str(port), "--scenarios", scenarios, "--out", out] for rank, out in enumerate(outs)]
    runs = run_children(commands, 120, env=env, cwd=TESTS, result_files=outs)
    assert all(run.ok for run in runs), [run.error + run.stderr_tail() for run in runs]
    for rank, run in enumerate(runs):
        diverging, reduced = run.payload["runs"]
        last = diverging["zero_code"]["last_report"]
        assert last["backend"] == "torch.distributed" and last["diverged"] and last["step"] == 10, last
        assert last["versions"] == [[0], [1]] and last["identical_at"] == 0, last  # the same start, then apart
        if rank == 0:
            (first,) = diverging["warnings"]  # the check at step 10 finds the same divergence: not said again
            assert "step 1" in first["message"], diverging["warnings"]
            assert "rank 0 holds one version; rank 1 holds another" in first["message"], first
            assert first["filename"] == os.path.join(TESTS, "support", "zero_code.py"), first
        else:
            assert diverging["warnings"] == [], diverging
        # checks at steps 0, 1 and 10 of each run: 3 + 3 in the process
        assert reduced["warnings"] == [] and reduced["zero_code"]["checks"] == 6, reduced
        assert reduced["zero_code"]["last_report"]["outcome"] == "identical"
        assert reduced["zero_code"]["last_report"]["identical_at"] == 1
        assert reduced["zero_code"]["last_report"]["max_divergence"] == 0.0


# --------------------------------------------------------------------------- command line
def test_run_sets_the_variables_for_the_command():
    from tpu_closure_fix import cli

    parser = cli.build_parser()
    args = parser.parse_args(["run", "--sync-check", "25", "--sync-check-on-divergence", "raise", "--", "python"])
    from tpu_closure_fix.launcher import sync_check_environment

    assert sync_check_environment(args) == {"TPU_CLOSURE_FIX_SYNC_CHECK": "25",
                                            "TPU_CLOSURE_FIX_SYNC_CHECK_ON_DIVERGENCE": "raise"}
    assert sync_check_environment(parser.parse_args(["run", "--", "python"])) == {}


@pytest.mark.parametrize("argv", [["--sync-check", "ten"], ["--sync-check", "-3"], ["--sync-check", ""],
                                  ["--sync-check-on-divergence", "stop"]])
def test_run_refuses_bad_values_with_the_accepted_ones(argv, capsys):
    from tpu_closure_fix import cli

    with pytest.raises(SystemExit) as info:
        cli.build_parser().parse_args(["run"] + argv + ["--", "python"])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert "whole number of optimizer steps" in err or "choose from 'warn', 'raise'" in err, err


def test_the_status_line_says_what_the_training_process_will_do_not_what_this_one_armed(monkeypatch):
    from tpu_closure_fix.outcome import sync_line

    active = (True, "armed at interpreter start by the start-up module")
    assert sync_line.line({}, active, {}) == "zero-code sync check: off (TPU_CLOSURE_FIX_SYNC_CHECK unset)"
    armed = ("zero-code sync check: armed at the first optimizer step of a process that imports torch: every 30 "
             "steps, on divergence: warn")
    monkeypatch.delitem(sys.modules, "torch.optim.optimizer", raising=False)  # this process: torch.optim unused
    assert sync_line.line({}, active, {"TPU_CLOSURE_FIX_SYNC_CHECK": "30"}) == armed
    synchook.arm_from_environment({"TPU_CLOSURE_FIX_SYNC_CHECK": "7"})  # armed here: says nothing of the training
    assert sync_line.line({}, active, {"TPU_CLOSURE_FIX_SYNC_CHECK": "30"}) == armed


# --------------------------------------------------------------------------- TPU_CLOSURE_FIX_LOG=info
def test_each_check_says_its_outcome_in_one_info_line(verdict, caplog):
    """A correct run is not silent at info level: every check logs where, what, over how many, how long."""
    import logging
    import re

    verdict(lambda n: synccheck.SyncReport(n, 2, "torch.distributed", ["w"], [0.0], [0.0], 1e-6))
    synchook.arm(1)
    with caplog.at_level(logging.INFO, "tpu_closure_fix"):
        step(sgd())
    lines = [r.getMessage() for r in caplog.records if r.levelno == logging.INFO]
    assert len(lines) == 2 and all(r.name.startswith("tpu_closure_fix.") for r in caplog.records), lines
    for n, line in zip((0, 1), lines):
        assert re.fullmatch(r"sync check of SGD over param_groups\[0\]\[0\] at step %d: identical over ranks 0-1, "
                            r"\d+\.\d ms" % n, line), line


def test_an_info_line_says_how_many_tensors_it_did_not_compare(verdict, caplog):
    import logging

    verdict(lambda n: synccheck.SyncReport(n, 2, "torch.distributed", ["w"], [0.0], [0.0], 1e-6,
                                           not_compared=[("shard", "sharded over the replicas")]))
    synchook.arm(1)
    with caplog.at_level(logging.INFO, "tpu_closure_fix"):
        step(sgd())
    lines = [r.getMessage() for r in caplog.records if r.levelno == logging.INFO]
    assert lines and all(": identical (1 tensor not compared) over ranks 0-1" in line for line in lines), lines


def test_a_differing_check_says_so_in_its_info_line(verdict, caplog):
    import logging

    verdict(diverged_report)
    synchook.arm(1)
    with caplog.at_level(logging.INFO, "tpu_closure_fix"):
        step(sgd())
    lines = [r.getMessage() for r in caplog.records if r.levelno == logging.INFO]
    assert lines and all(line.startswith("sync check of SGD over ") and ": DIFFERENT (" in line for line in lines), \
        lines


# --------------------------------------------------------------------------- handed to the worker
@pytest.fixture
def handed(monkeypatch):
    """Every check goes to a list instead of the worker thread; returns that list of worker.Job."""
    return handed_checks.hand_checks_to_a_list(monkeypatch)


def test_with_a_process_group_the_training_thread_only_hands_checks_over(handed):
    synchook.arm(1, "warn")
    optimizer = sgd()
    with spoken() as seen:
        step(optimizer)  # the check before the update, and the one after step 1
    assert [job.pending.step for job in handed] == [0, 1] and seen == []
    assert synchook.seen["checks"] == 0  # no verdict yet: nothing was waited for
    with spoken() as seen:
        handed[1].deliver(diverged_report(1), None)
    assert len(seen) == 1 and "step 1" in str(seen[0].message) and seen[0].filename == os.path.abspath(__file__)
    assert "optimizer.step()" in open(__file__).readlines()[seen[0].lineno - 1]  # the line that stepped


def test_raise_comes_at_the_agreed_step_and_the_first_divergence_stands(handed):
    synchook.arm(1, "raise")
    optimizer = sgd()
    step(optimizer)
    with spoken() as seen:  # rank 0 says it at the verdict
        handed[1].deliver(diverged_report(1), 3)
    assert len(seen) == 1 and str(seen[0].message).endswith("Every rank raises ReplicaDivergenceError at its "
                                                            "optimizer step 3.")
    handed[1].deliver(diverged_report(1), 2)  # a later verdict moves nothing
    step(optimizer)  # step 2
    with pytest.raises(synccheck.ReplicaDivergenceError, match="Raised at optimizer step 3, the step every rank"):
        step(optimizer)  # step 3
    step(optimizer)  # raised once


def test_a_rank_that_learns_the_agreed_step_after_passing_it_raises_at_its_next_step_naming_both(handed):
    synchook.arm(1, "raise")
    optimizer = sgd()
    step(optimizer)
    step(optimizer)  # step 2
    step(optimizer)  # step 3: the worker was slow, the ranks agreed on step 2
    with spoken():
        handed[1].deliver(diverged_report(1), 2)
    with pytest.raises(synccheck.ReplicaDivergenceError) as raised:
        step(optimizer)  # step 4
    assert str(raised.value).endswith("Raised at optimizer step 4: the ranks agreed on step 2, which this rank had "
                                      "passed when it learnt it."), str(raised.value)


def test_a_check_that_stands_down_is_said_once_per_optimizer_naming_it(handed):
    synchook.arm(1, "warn")
    optimizer = sgd()
    step(optimizer)
    with spoken() as seen:
        handed[0].stand_down(comm.StoodDown("rank 0 reached it, rank 1 did not within 5s"))
        handed[1].stand_down(comm.StoodDown("another reason"))
    assert len(seen) == 1, [str(w.message) for w in seen]
    assert synchook._counts[id(optimizer)][0].stood_down == "rank 0 reached it, rank 1 did not within 5s"
    said = str(seen[0].message)  # the optimizer as the user knows it, never by the stream's key
    assert said.startswith("tpu-closure-fix: the zero-code sync check stands down for SGD over ") and \
        "optimizer-" not in said, said
    assert "at step 0: rank 0 reached it, rank 1 did not within 5s. Training goes on." in str(seen[0].message)
    step(optimizer)
    assert len(handed) == 2  # the stream stood down: no further check


def test_checks_handed_over_before_a_first_check_that_left_nothing_to_compare_say_nothing_more(handed):
    """A pipeline stage's optimizer: its first check finds no tensor to be a replica (said once); the check
    fingerprinted after step 1, before that verdict came back, adds no second note."""
    from tpu_closure_fix.synccheck import compare, groups

    def apart(step_number):
        return synccheck.SyncReport(step_number, 2, "torch.distributed", ["param_groups[0][0]"], outcome="unverified",
                                    not_compared=[("param_groups[0][0]", groups.APART)], rule=groups.RULE_APART,
                                    set_aside=["param_groups[0][0]"] if step_number == 0 else ())

    synchook.arm(1, "raise")
    optimizer = sgd()
    step(optimizer)  # the check before the update, and the one after step 1
    with spoken() as seen:
        handed[0].deliver(apart(0), None)
        handed[1].deliver(apart(1), None)
    assert len(seen) == 1 and "before the first update" in str(seen[0].message), [str(w.message) for w in seen]
    step(optimizer)
    assert len(handed) == 2  # the stream stood down: no further check


class HostChannel(comm.HostChannel):
    """torch_xla's channel without a process group (rank ``rank`` of 2), no store: the worker is replaced."""

    def __init__(self, rank=0):
        self.rank, self.size, self.timeout = rank, 2, 5
        self.worker_scope = ("xla replica", rank)


@pytest.mark.parametrize("made", [handed_checks.DistributedChannel, HostChannel], ids=["process-group", "xla-host"])
def test_every_store_channel_hands_the_check_to_the_worker(handed, monkeypatch, made):
    """With a process group or on torch_xla without one, the training thread only fingerprints: the
    fingerprint and each tensor's details reach the host in one transfer, so the worker never reads a device
    (an XLA) tensor."""
    channel = made()
    monkeypatch.setattr(comm, "channel", lambda timeout=None: channel)
    synchook.arm(1, "warn")
    step(sgd())
    assert [(job.pending.step, job.pending.channel) for job in handed] == [(0, channel), (1, channel)]
    assert all(job.group == (1 if made is handed_checks.DistributedChannel else None) for job in handed)


def test_twin_a_channel_of_another_kind_is_checked_on_the_training_thread(handed, monkeypatch):
    """A channel that is not one of the check's store channels (a caller's own) keeps the whole check here."""
    ran = []
    monkeypatch.setattr(comm, "channel", lambda timeout=None: types.SimpleNamespace(rank=0, size=2))
    monkeypatch.setattr(synchook.compare, "run", lambda *args, **kwargs: ran.append(args[1]) or None)
    monkeypatch.setattr(synchook, "_delivered", lambda *args, **kwargs: None)
    synchook.arm(1, "warn")
    step(sgd())
    assert handed == [] and ran == [0, 1]


# --------------------------------------------------------------------------- raise: the job's end
def _agreed_to_raise(monkeypatch, rank=0):
    """A divergence the ranks agreed to raise at step 9, not reached yet."""
    error = synccheck.ReplicaDivergenceError("SyncCheck: replicas differ", diverged_report(1))
    monkeypatch.setattr(synchook, "_unraised", {1: (error, rank, diverged_report(1), 9)})
    return error


def test_a_job_that_destroys_its_group_before_the_agreed_step_raises_there(monkeypatch):
    error = _agreed_to_raise(monkeypatch)
    with pytest.raises(synccheck.ReplicaDivergenceError) as info:
        synchook.end_of_job("destroy")
    assert info.value is error and synchook._unraised == {}


@pytest.mark.parametrize("rank, said", [(0, 1), (1, 0)])
def test_a_job_that_exits_before_the_agreed_step_ends_with_status_1_said_by_rank_0(monkeypatch, rank, said):
    _agreed_to_raise(monkeypatch, rank)
    ended = []
    monkeypatch.setattr(synchook.os, "_exit", ended.append)
    with spoken() as seen:
        synchook.end_of_job("exit")
    assert ended == [1] and len(seen) == said
    assert all("this process exits with status 1" in w.message and "step 9" in w.message for w in seen)


@pytest.mark.parametrize("how", ["destroy", "exit", "fork-exit"])
def test_twin_a_job_with_nothing_to_raise_ends_as_it_would(monkeypatch, how):
    monkeypatch.setattr(synchook, "_unraised", {})
    ended = []
    monkeypatch.setattr(synchook.os, "_exit", ended.append)
    synchook.end_of_job(how)
    assert ended == []


def test_a_divergence_raised_at_its_step_leaves_nothing_for_the_end(handed, monkeypatch):
    monkeypatch.setattr(synchook, "_unraised", {})
    synchook.arm(1, "raise")
    optimizer = sgd()
    step(optimizer)
    handed[1].deliver(diverged_report(1), 2)
    assert len(synchook._unraised) == 1
    with pytest.raises(synccheck.ReplicaDivergenceError):
        step(optimizer)  # step 2: raised here
    assert synchook._unraised == {}
