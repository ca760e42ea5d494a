"""Where SyncCheck compares each tensor (synccheck.groups): the placement rules, one case per branch, in
process and fast. The multi-process runs (tests/unit/test_synccheck_pod.py) show the same rules on real
FSDP, DTensor and neuronx-distributed-style groups; these pin each boundary so that a changed comparison or
a swapped branch fails here in milliseconds.
"""
import types

import pytest

torch = pytest.importorskip("torch", reason="SyncCheck compares torch tensors: no torch here")

from tpu_closure_fix.synccheck import evidence, groups  # noqa: E402


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


def _recording(name, kind):
    """A stand-in class ``name`` whose instances are recorded at construction as SyncCheck records FSDP's and
    DDP's (:func:`evidence.wrap`)."""
    cls = type(name, (object,), {})
    evidence.wrap(cls, kind)
    return cls


def test_fsdp_handles_finds_the_handle_of_a_flat_parameter_and_of_a_view_into_it():
    flat_param = flat(_fsdp_flattened=True)
    view = flat(_fsdp_flattened=True)
    flat_param._params = [view]
    held = _recording("FlatParamHandle", "handle")()
    held.flat_param = flat_param
    found = groups.fsdp_handles([("flat", flat_param), ("view", view), ("other", torch.zeros(1))])
    assert found == {id(flat_param): (held, None), id(view): (held, None)}


def test_twin_a_handle_made_before_the_recording_is_not_found():
    flat_param = flat(_fsdp_flattened=True)
    held = type("FlatParamHandle", (object,), {})()  # alive, but never recorded: no walk of the live objects
    held.flat_param = flat_param
    assert groups.fsdp_handles([("flat", flat_param)]) == {}


# ---- what cannot be fingerprinted: listed, never an exception ---------------------------------------------

def test_a_meta_tensor_is_not_compared():
    assert groups.placement(torch.zeros(3, device="meta"), 0) == groups.META


def test_a_sparse_tensor_is_not_compared_and_its_dense_twin_is():
    dense = torch.eye(3)
    assert groups.placement(dense.to_sparse(), 0) == groups.SPARSE
    assert isinstance(groups.placement(dense, 0), groups.Placement)


# ---- rule 1: a DTensor with no Replicate dimension has no replica ------------------------------------------

def dtensor(placements, mesh_shape, coordinate):
    """A stand-in DTensor: the class name, mesh and placements the rule reads."""
    mesh = types.SimpleNamespace(mesh=torch.arange(int(torch.tensor(mesh_shape).prod())).reshape(mesh_shape),
                                 get_coordinate=lambda: coordinate)
    kinds = [type(p, (object,), {"__str__": lambda self, p=p: p + "()"})() for p in placements]
    local = torch.zeros(2)
    DTensor = type("DTensor", (object,), {"shape": (4,), "dtype": torch.float32, "device_mesh": mesh,
                                          "placements": kinds, "to_local": lambda self: local})
    return DTensor()


@pytest.mark.parametrize("placements, shape", [(["Shard"], (2,)), (["Shard", "Shard"], (2, 2)),
                                               (["Partial"], (4,))])
def test_a_dtensor_with_no_replicate_dimension_is_not_compared(placements, shape):
    where = groups.placement(dtensor(placements, shape, [0] * len(shape)), 0)
    assert isinstance(where, str) and where.startswith("a DTensor shard with no Replicate dimension")


def test_twin_a_dtensor_replicated_over_one_dimension_is_compared_over_it():
    where = groups.placement(dtensor(["Replicate", "Shard"], (2, 2), [1, 0]), 2)
    assert isinstance(where, groups.Placement)
    assert (where.coordinates, where.coordinate) == (2, 0)


# ---- a group known by its ranks (DDP's process group, the user's declaration) -----------------------------

def test_a_group_spanning_the_world_is_the_world():
    where = groups._ranks_placement(torch.zeros(2), (3, 1, 0, 2), 1, 4)
    assert (where.pattern, where.coordinates, where.coordinate, where.declared) == (("world",), 1, 0, True)


@pytest.mark.parametrize("group, rank, coordinate", [((2, 3), 3, 2), ((1, 0), 0, 0), ((0, 1), 3, None)])
def test_a_subgroup_gets_the_lane_of_its_lowest_rank(group, rank, coordinate):
    where = groups._ranks_placement(torch.zeros(2), group, rank, 4)
    assert (where.pattern, where.coordinates, where.coordinate) == (("ranks", 4), 4, coordinate)


def test_a_group_of_one_rank_is_not_compared():
    assert groups._ranks_placement(torch.zeros(2), (3,), 3, 4) == \
        "no other rank holds it: its replica group is rank 3 alone"


def test_a_neuron_group_of_one_rank_is_not_compared():
    where = groups.placement(torch.zeros(2), 1, neuron_groups=((0,), (1,)))
    assert where == "no other rank holds it: its data-parallel replica group is rank 1 alone"


# ---- placement(): the order of the evidence -----------------------------------------------------------------

def test_a_ddp_group_decides_before_the_users_declaration():
    where = groups.placement(torch.zeros(2), 2, world=4, ddp_group=(2, 3), declared=(0, 1, 2, 3))
    assert (where.pattern, where.coordinate) == (("ranks", 4), 2)


def test_a_declared_group_places_a_plain_tensor():
    where = groups.placement(torch.zeros(2), 1, world=4, declared=(0, 1))
    assert (where.pattern, where.coordinate, where.declared) == (("ranks", 4), 0, True)


@pytest.mark.parametrize("declared, placed", [(groups.WORLD, True), (groups.AUTO, False), ((0, 1), True)])
def test_the_world_is_declared_unless_auto_leaves_it_to_the_tensors_first_look(declared, placed):
    where = groups.placement(torch.zeros(2), 0, world=2, declared=declared)
    assert (where.pattern, where.declared) == (("world",), placed)


def test_a_tensor_set_aside_is_still_placed_the_same_the_decision_is_applied_at_the_exchange():
    """A layout computed before a first look and one computed after it are the same on every rank."""
    from tpu_closure_fix.synccheck import decisions

    tensor = torch.zeros(2)
    before = groups.placement(tensor, 0, declared=groups.AUTO)
    decisions.record(tensor, decisions.APART)
    after = groups.placement(tensor, 0, declared=groups.AUTO)
    assert (before.pattern, before.declared) == (after.pattern, after.declared) == (("world",), False)


def test_the_layout_lists_the_undecided_tensors():
    named = [("w", torch.zeros(2)), ("d", dtensor(["Replicate"], (2,), [0]))]
    assert groups.Layout(named, 0, declared=groups.AUTO, world=2).undecided == {0}
    assert groups.Layout(named, 0, declared=groups.WORLD, world=2).undecided == set()


# ---- the user's declaration ---------------------------------------------------------------------------------

@pytest.mark.parametrize("replicas", ["auto", "world", [[0, 1], [2, 3]], ((0,), (1, 2))])
def test_accepted_declarations(replicas):
    groups.check_replicas(replicas)


@pytest.mark.parametrize("replicas, said", [("all", "replicas must be"), ([], "replicas must be"),
                                            ([[0, 1], [1, 2]], "a rank is in two groups"),
                                            ([[0, True]], "replicas must be"), ([[0, -1]], "replicas must be"),
                                            ([0, 1], "replicas must be")])
def test_refused_declarations_name_the_accepted_values(replicas, said):
    with pytest.raises(ValueError) as info:
        groups.check_replicas(replicas)
    assert said in str(info.value) and groups.ACCEPTED in str(info.value)


@pytest.mark.parametrize("replicas, rank, declared", [(None, 0, "auto"), ("world", 2, "world"),
                                                      ([[0, 1], [3, 2]], 2, (2, 3)), ([[0, 1]], 3, ())])
def test_the_declaration_of_this_rank(replicas, rank, declared):
    assert groups.declaration(replicas, rank) == declared


def _subgroup_ddp(cls, monkeypatch):
    """An instance of ``cls`` standing for a DDP module on the subgroup of ranks {2, 3} of a world of 4."""
    import sys

    ddp = cls()
    ddp.module, ddp.process_group = torch.nn.Linear(2, 2), "subgroup"
    dist = types.SimpleNamespace(get_process_group_ranks=lambda g: [3, 2] if g == "subgroup" else [],
                                 get_world_size=lambda: 4)
    monkeypatch.setitem(sys.modules, "torch.distributed", dist)
    return ddp


def test_ddp_groups_finds_the_parameters_of_a_ddp_module_recorded_at_its_construction(monkeypatch):
    ddp = _subgroup_ddp(_recording("DistributedDataParallel", "ddp"), monkeypatch)
    other = torch.zeros(1)
    found = groups.ddp_groups([("w", ddp.module.weight), ("o", other)])
    assert found == {id(ddp.module.weight): (2, 3)}


def test_twin_a_ddp_module_made_before_the_recording_is_not_found(monkeypatch):
    ddp = _subgroup_ddp(type("DistributedDataParallel", (object,), {}), monkeypatch)
    assert groups.ddp_groups([("w", ddp.module.weight)]) == {}


# ---- the replicas of xm.optimizer_step ----------------------------------------------------------------------

@pytest.mark.parametrize("declared, kind, size, xla_size, expected", [
    (groups.AUTO, "xla host", 2, 2, groups.WORLD),  # XLA without a process group: the check's world is torch_xla's
    (groups.AUTO, "torch.distributed", 2, 2, groups.WORLD),  # torch_xla beside a process group of its size
    (groups.AUTO, "torch.distributed", 4, 2, groups.AUTO),  # torch_xla's world is not the check's
    (groups.AUTO, "torch.distributed", 2, 1, groups.AUTO),  # torch_xla not imported
    (groups.AUTO, "torch.distributed", 1, 1, groups.AUTO),
    (groups.AUTO, "threads", 2, None, groups.AUTO),
    ((0, 1), "xla host", 4, 4, (0, 1)),  # the user's declaration stands
    (groups.WORLD, "torch.distributed", 2, 1, groups.WORLD),
])
def test_the_replicas_of_the_xla_step_are_a_declared_layout(declared, kind, size, xla_size, expected):
    assert groups.step_replicas_declaration(declared, kind, size, xla_size) == expected


