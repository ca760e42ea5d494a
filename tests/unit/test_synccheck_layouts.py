"""SyncCheck on parallel layouts other than plain data parallelism, over real gloo processes: a correct
pipeline or ZeRO job is never broken (under ``raise`` too), DDP on subgroups is compared within each
subgroup, shards with no replica are never called identical, counts are exact at 20,000 tensors, sparse
and meta tensors are listed, and two optimizers over models of the same shapes are told apart.

Each "right" case has its twin showing what the evidence changes (``TPU_CLOSURE_FIX_SYNC_CHECK_GROUP=world``,
the gradients all-reduced). The scenarios are in tests/support/pod_scenarios.py, started by
tests/support/ranks.py; the rules themselves are unit-tested in test_synccheck_placement.py and
test_synccheck_rules.py.
"""
import importlib

import pytest

torch = pytest.importorskip("torch", reason="SyncCheck compares torch tensors: no torch here")

from support import ranks, said  # noqa: E402

MANY_RANKS = pytest.mark.many_ranks
needs_step_hooks = pytest.mark.skipif(
    not hasattr(importlib.import_module("torch.optim.optimizer"), "register_optimizer_step_post_hook"),
    reason="the zero-code SyncCheck needs torch >= 2.0 (its global step hooks); torch %s here" % torch.__version__)
ARMED = {"TPU_CLOSURE_FIX_SYNC_CHECK": "1", "TPU_CLOSURE_FIX_SYNC_CHECK_ON_DIVERGENCE": "raise"}
NOT_REPLICAS = "replicas that started different, or tensors that are not replicas by design (a rank-local value, "


def _by_case(run):
    return {r["case"]: r for r in run.reports}


def _finishes_with_one_note(runs):
    ranks.assert_all_ok(runs)
    for run in runs:
        assert run.result["steps"] == 3
    said = [m for run in runs for m in run.messages]
    assert len(said) <= 1 and all(NOT_REPLICAS in m and "before the first update (" in m for m in said), said
    assert len(runs[0].messages) == 1  # rank 0 says it


# --------------------------------------------------------------------------- pipeline and ZeRO: never broken
@needs_step_hooks
@pytest.mark.parametrize("scenario", ["pipeline", "zero"])
def test_a_correct_sharded_job_under_raise_finishes_on_every_rank(tmp_path, scenario):
    runs = ranks.run_ranks(scenario, 2, tmp_path, env=ARMED, args=["--steps", "3"])
    _finishes_with_one_note(runs)
    for run in runs:  # one check, at step 0; then the stream had nothing left to compare
        assert run.hook["checks"] == 1 and run.hook["last_report"]["rule"] == "apart"


@needs_step_hooks
@pytest.mark.parametrize("scenario", ["pipeline", "zero"])
def test_twin_declared_world_the_same_job_is_a_divergence_raised_on_every_rank(tmp_path, scenario):
    # the verdict comes off the training thread; every rank raises at an optimizer step they agreed on, a few
    # steps on: the job runs long enough to reach it
    runs = ranks.run_ranks(scenario, 2, tmp_path, env=dict(ARMED, TPU_CLOSURE_FIX_SYNC_CHECK_GROUP="world"),
                           args=["--steps", "3000"])
    for run in runs:
        assert run.returncode == 3 and not run.timed_out, run.describe()
        assert run.failure.startswith("ReplicaDivergenceError") and "started different" in run.failure
    said.assert_raised_together([run.failure for run in runs])  # the optimizer step every rank agreed on


# --------------------------------------------------------------------------- DDP on subgroups
@pytest.fixture(scope="module")
def ddp_groups(tmp_path_factory):
    return ranks.run_ranks("ddp-groups", 4, tmp_path_factory.mktemp("ddp"), env=ARMED)


@MANY_RANKS
@needs_step_hooks
def test_ddp_on_subgroups_is_compared_within_each_subgroup(ddp_groups):
    ranks.assert_all_ok(ddp_groups)
    for run in ddp_groups:
        assert run.hook["checks"] == 4 and run.hook["last_report"]["outcome"] == "identical"
        assert _by_case(run)["agree"]["outcome"] == "identical"
        copies = _by_case(run)["copies"]  # the twin: without the DDP module, declared the world: they differ
        assert copies["outcome"] == "differ" and copies["versions"] == [[0, 1], [2, 3]]
        auto = _by_case(run)["copies-auto"]  # no DDP holds them: compare_replicas compares them over the world
        assert auto["outcome"] == "differ" and auto["versions"] == [[0, 1], [2, 3]]
    # the zero-code check at steps 0 to 3: silent; compare_replicas only reports; check_sync raised (not said)
    assert [len(run.messages) for run in ddp_groups] == [0, 0, 0, 0]


@MANY_RANKS
@needs_step_hooks
def test_ddp_is_a_declared_layout_started_different_is_raised(ddp_groups):
    for run in ddp_groups:
        report = _by_case(run)["ddp-started-different"]
        assert report["outcome"] == "differ" and report["started_different"]
        assert report["differing"] == ["module.0.bias"]
        assert report["versions"] == [[0, 2, 3], [1]] and run.result["ddp-started-different-raised"]


@MANY_RANKS
@needs_step_hooks
def test_a_bare_model_given_to_check_sync_is_declared_too_started_different_is_raised(ddp_groups):
    for run in ddp_groups:
        report = _by_case(run)["bare-started-different"]
        assert (report["outcome"], report["started_different"], report["in_sync"]) == ("differ", True, False)
        assert report["versions"] == [[0, 2, 3], [1]] and run.result["bare-started-different-raised"]


@MANY_RANKS
@needs_step_hooks
def test_ddp_on_subgroups_one_changed_member_is_named_with_its_subgroup(ddp_groups):
    for run in ddp_groups:
        report = _by_case(run)["changed"]
        assert report["outcome"] == "differ" and report["differing"] == ["module.2.weight"]
        assert report["versions"] == [[2], [3]] and report["group"] == [2, 3]
        assert "(in the replica group of ranks 2-3: rank 2 holds one version; rank 3 holds another)" in \
            report["message"]


# --------------------------------------------------------------------------- shards with no replica
@pytest.fixture(scope="module")
def fsdp2(tmp_path_factory):
    try:
        from torch.distributed.fsdp import fully_shard  # noqa: F401
        from torch.distributed.tensor import Shard  # noqa: F401
    except ImportError as exc:
        pytest.skip("no FSDP2 / DTensor in torch %s: %s" % (torch.__version__, exc))
    return ranks.run_ranks("fsdp2", 2, tmp_path_factory.mktemp("fsdp2"))


@pytest.mark.parametrize("case, names", [("fully-shard", ["0.weight", "0.bias", "2.weight", "2.bias"]),
                                         ("shard0", ["w"])])
def test_shards_with_no_replica_are_unverified_and_listed_never_identical(fsdp2, case, names):
    ranks.assert_all_ok(fsdp2)
    for run in fsdp2:
        report = _by_case(run)[case]
        assert report["outcome"] == "unverified" and report["differing"] == []
        assert [name for name, _ in report["not_compared"]] == names
        assert all("no Replicate dimension" in reason for _, reason in report["not_compared"])
    assert fsdp2[0].result["types"] == ["DTensor"]


# --------------------------------------------------------------------------- exact at any size
def test_20000_tensors_all_differing_are_all_counted(tmp_path):
    runs = ranks.run_ranks("scale", 2, tmp_path)
    ranks.assert_all_ok(runs)
    for run in runs:
        report = _by_case(run)["all-differ"]
        assert report["outcome"] == "differ" and report["diverged_count"] == 20000
        assert "20000 of 20000 parameter tensors differ" in report["message"]


@pytest.fixture(scope="module")
def kinds(tmp_path_factory):
    return ranks.run_ranks("kinds", 2, tmp_path_factory.mktemp("kinds"))


def test_a_sparse_tensor_is_listed_and_the_dense_ones_beside_it_compared(kinds):
    ranks.assert_all_ok(kinds)
    for run in kinds:
        agree, changed = _by_case(run)["sparse-agree"], _by_case(run)["sparse-changed"]
        assert agree["outcome"] == "identical" and "all 3 parameter tensors bitwise identical" in agree["message"]
        assert [name for name, _ in agree["not_compared"]] == ["embedding.weight"]
        assert "'embedding.weight': a sparse tensor" in agree["message"]
        assert changed["outcome"] == "differ" and changed["differing"] == ["0.bias"]


def test_a_meta_tensor_is_unverified_not_an_exception(kinds):
    for run in kinds:
        report = _by_case(run)["meta"]
        assert report["outcome"] == "unverified" and report["not_compared"][0][0] == "w"


# --------------------------------------------------------------------------- two optimizers, the same shapes
@needs_step_hooks
def test_two_optimizers_over_equal_shape_models_name_the_right_model(tmp_path):
    runs = ranks.run_ranks("gan", 2, tmp_path, env={"TPU_CLOSURE_FIX_SYNC_CHECK": "1"})
    ranks.assert_all_ok(runs)
    said = runs[0].messages
    assert len(said) == 1, said  # the discriminator's stream at step 1 (at step 2 the same); the generator's: silent
    for message in said:
        assert "2 of 2 parameter tensors of SGD over discriminator.fc.weight, discriminator.fc.bias (in GAN) differ" \
            in message
        assert "'discriminator.fc.weight'" in message and "generator" not in message.replace("discriminator", "")


@needs_step_hooks
def test_twin_both_models_reduced_nothing_is_said(tmp_path):
    runs = ranks.run_ranks("gan", 2, tmp_path, env={"TPU_CLOSURE_FIX_SYNC_CHECK": "1"}, args=["--variant", "twin"])
    ranks.assert_all_ok(runs)
    assert [run.messages for run in runs] == [[], []]
