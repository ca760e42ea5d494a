"""Where SyncCheck compares each tensor (synccheck.groups): the placement rules, one case per branch, in
process and fast. The multi-process runs (tests/unit/test_synccheck_pod.py) show the same rules on real
FSDP, DTensor and neuronx-distributed-style groups; these pin each boundary so that a changed comparison or
a swapped branch fails here in milliseconds.
"""
import types

import pytest

torch = pytest.importorskip("torch", reason="SyncCheck compares torch tensors: no torch here")

from tpu_closure_fix.synccheck import groups  # noqa: E402


def handle(strategy, shards, index):
    """A stand-in for FSDP1's FlatParamHandle: the three attributes the rule reads."""
    return types.SimpleNamespace(_sharding_strategy=types.SimpleNamespace(name=strategy) if strategy else None,
                                 world_size=shards, rank=index)


def flat(**marks):
    tensor = torch.zeros(6)
    for name, value in marks.items():
        setattr(tensor, name, value)
    return tensor


# ---- rule 3: FSDP1 by its handle's sharding strategy ------------------------------------------------------

def test_no_shard_over_the_whole_world_is_compared_over_the_world():
    tensor = flat(_fsdp_flattened=True)
    where = groups._fsdp_placement(tensor, handle("NO_SHARD", 4, 2), None, 4)
    assert isinstance(where, groups.Placement)
    assert (where.pattern, where.coordinates, where.coordinate, where.local is tensor) == (("world",), 1, 0, True)


@pytest.mark.parametrize("shards, world", [(2, 4), (4, None), (8, 4)])
def test_no_shard_over_part_of_the_world_is_not_compared(shards, world):
    where = groups._fsdp_placement(flat(), handle("NO_SHARD", shards, 0), None, world)
    assert where == "%s: FSDP NO_SHARD over %s of the %s ranks (its replica group is not known)" % (
        groups.FLAT_SHARD, shards, world)


@pytest.mark.parametrize("strategy", ["HYBRID_SHARD", "_HYBRID_SHARD_ZERO2"])
@pytest.mark.parametrize("index", [0, 1])
def test_hybrid_shards_over_the_whole_world_are_compared_by_shard_index(strategy, index):
    tensor = flat(_fsdp_flattened=True).to(torch.float16)
    where = groups._fsdp_placement(tensor, handle(strategy, 2, index), 2, 4)
    assert isinstance(where, groups.Placement)
    assert (where.pattern, where.coordinates, where.coordinate) == (("fsdp-hybrid", 2), 2, index)
    assert where.local is tensor
    # the shard's length differs per index: the description holds only the strategy and the dtype
    assert where.description == ("FSDP %s shard of 2" % strategy, "float16")


@pytest.mark.parametrize("replicas, world", [(None, 4), (2, None), (3, 4), (1, 4)])
def test_hybrid_shards_whose_replica_groups_are_not_known_are_not_compared(replicas, world):
    where = groups._fsdp_placement(flat(), handle("HYBRID_SHARD", 2, 0), replicas, world)
    assert where == "%s: FSDP HYBRID_SHARD over 2 x %s of the %s ranks (its replica groups are not known)" % (
        groups.FLAT_SHARD, replicas, world)


@pytest.mark.parametrize("shards, index", [(2, 2), (2, -1), (None, 0), (2, None), ("2", 0)])
def test_a_hybrid_handle_without_a_valid_shard_index_is_not_compared(shards, index):
    where = groups._fsdp_placement(flat(), handle("HYBRID_SHARD", shards, index), 2, 4)
    assert where == "%s: FSDP HYBRID_SHARD" % groups.FLAT_SHARD


@pytest.mark.parametrize("strategy, said", [("FULL_SHARD", "FULL_SHARD"), ("SHARD_GRAD_OP", "SHARD_GRAD_OP"),
                                            (None, "(sharding strategy unknown)")])
def test_sharded_strategies_are_not_compared_and_say_which(strategy, said):
    where = groups._fsdp_placement(flat(), handle(strategy, 4, 1), None, 4)
    assert where == "%s: FSDP %s" % (groups.FLAT_SHARD, said)


# ---- placement(): the order of the rules -----------------------------------------------------------------

def test_an_fsdp_handle_decides_before_the_flat_shard_mark():
    tensor = flat(_fsdp_flattened=True)
    where = groups.placement(tensor, 0, fsdp_handle=(handle("NO_SHARD", 2, 0), None), world=2)
    assert isinstance(where, groups.Placement) and where.pattern == ("world",)


@pytest.mark.parametrize("marks", [{"_is_sharded": True}, {"_fsdp_flattened": True}])
def test_a_marked_flat_shard_without_its_handle_is_not_compared(marks):
    assert groups.placement(flat(**marks), 0) == groups.FLAT_SHARD
    assert groups.placement(flat(**marks), 0, neuron_groups=((0, 1), (2, 3))) == groups.FLAT_SHARD


def test_torch_1_flat_parameter_is_known_by_its_class():
    FlatParameter = type("FlatParameter", (torch.nn.Parameter,), {})
    assert groups.placement(FlatParameter(torch.zeros(3)), 0) == groups.FLAT_SHARD


def test_a_false_mark_is_no_mark():
    where = groups.placement(flat(_is_sharded=False, _fsdp_flattened=False), 0)
    assert isinstance(where, groups.Placement) and where.pattern == ("world",)


@pytest.mark.parametrize("rank, coordinate", [(0, 0), (3, 1), (5, None)])
def test_neuron_data_parallel_groups_give_the_rank_its_group(rank, coordinate):
    neuron = ((0, 2), (1, 3))
    where = groups.placement(torch.zeros(2, 3), rank, neuron_groups=neuron)
    assert (where.pattern, where.coordinates, where.coordinate) == (("neuron-dp", neuron), 2, coordinate)
    assert where.description == ("data-parallel over 2 groups", "float32", 2)


@pytest.mark.parametrize("neuron", [None, ()])
def test_a_plain_tensor_is_compared_over_the_world(neuron):
    tensor = torch.zeros(2, 3)
    where = groups.placement(tensor, 7, neuron_groups=neuron)
    assert (where.pattern, where.coordinates, where.coordinate, where.local is tensor) == (("world",), 1, 0, True)


def test_the_shape_every_rank_shares():
    assert groups.shape_on_every_rank(flat(_fsdp_flattened=True)) == "FSDP flat"
    assert groups.shape_on_every_rank(flat(_fsdp_flattened=False)) == (6,)
    assert groups.shape_on_every_rank(torch.zeros(2, 3)) == (2, 3)


def test_fsdp_handles_looks_only_when_a_tensor_carries_the_mark():
    assert groups.fsdp_handles([("w", torch.zeros(2))]) == {}


def test_fsdp_handles_finds_the_handle_of_a_flat_parameter_and_of_a_view_into_it():
    flat_param = flat(_fsdp_flattened=True)
    view = flat(_fsdp_flattened=True)
    flat_param._params = [view]
    FlatParamHandle = type("FlatParamHandle", (object,), {})
    held = FlatParamHandle()
    held.flat_param = flat_param
    found = groups.fsdp_handles([("flat", flat_param), ("view", view), ("other", torch.zeros(1))])
    assert found == {id(flat_param): (held, None), id(view): (held, None)}
