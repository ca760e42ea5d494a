"""Over which replicas each tensor must be equal: the check's layout of lanes and slots.

Data parallelism keeps a parameter bitwise equal on every replica of its data-parallel group, and only
there: a tensor-parallel shard differs from the shard next to it by design. Each tensor therefore gets a
*pattern* (which ranks form its replica groups) and, on this rank, a *coordinate* (which of those groups
this rank is in). Every (pattern, coordinate) pair is a *lane*; the lanes split the fingerprint's slots
(:mod:`.fingerprint`), and a rank writes only the slots of its own lanes, so the MAX all-reduce compares
each tensor over exactly the ranks that must hold it equal, in one collective over the whole world.

The rules, the same in the zero-code hook, the Lightning callback, ``check_sync`` and
``compare_replicas``:

1. ``DTensor``: over the mesh dimensions where its placement is ``Replicate``; a ``Shard`` or
   ``Partial`` dimension is never crossed (its local tensor is compared). A rank outside the tensor's
   mesh holds nothing of it. FSDP2 and HSDP parameters are DTensors and follow this rule.
2. neuronx-distributed / optimum-neuron, when its parallel state is initialised: every parameter over
   its data-parallel replica group (``get_data_parallel_replica_groups``), never across tensor- or
   pipeline-parallel ranks.
3. FSDP1 (its ``FlatParameter`` and, with ``use_orig_params``, the original parameters viewing into it,
   both marked ``_fsdp_flattened``), read from the ``FlatParamHandle`` that owns the tensor (the handles and
   FSDP modules are recorded when they are made, :mod:`.evidence`):
   ``HYBRID_SHARD`` over the ranks holding the same shard index (its inter-node replica group: the ranks
   whose gradients FSDP all-reduces for that shard); ``NO_SHARD`` over the whole world (every rank holds
   it all) -- both only when the FSDP module spans the whole world; ``FULL_SHARD`` / ``SHARD_GRAD_OP``,
   FSDP on a subgroup, torch_xla FSDP shards (``_is_sharded``) and a flat tensor whose handle is not
   found: listed as not compared, with the reason.
4. ``DistributedDataParallel``: the parameters of a live DDP module (recorded when it was made,
   :mod:`.evidence`) over the ranks of its ``process_group`` (``torch.distributed.get_process_group_ranks``):
   DDP on subgroups {0, 1} and {2, 3} is compared within each subgroup, never across them.
5. The user's declaration (``replicas=`` of ``SyncCheck`` / ``check_sync`` / ``compare_replicas``,
   ``TPU_CLOSURE_FIX_SYNC_CHECK_GROUP`` for the zero-code check): ``"world"``, a process group or a list of
   rank lists. Calling ``SyncCheck`` / ``check_sync`` / ``compare_replicas`` is itself a declaration: under
   their default ``"auto"`` the tensors no layout places are compared over the world (the user chose what to
   compare). Only the zero-code check, armed on jobs that asked for nothing, declares nothing under ``"auto"``.
6. The framework's data-parallel layout under ``"auto"``: the replicas of ``xm.optimizer_step`` when the
   check's world is torch_xla's (:func:`step_replicas_declaration`): over the whole world.
7. Nothing declared (the zero-code check under ``"auto"`` on a plain torch.distributed script): over the
   whole world, decided per tensor at its own first look (:mod:`.decisions`, applied in ``compare.decide``) --
   bitwise equal there: a replica for the tensor's whole life; different there: a replica that started
   different or not a replica at all (a rank-local scale, a pipeline stage, an optimizer-state shard), that
   tensor alone said once, named, and not compared again.

A tensor whose replica group holds this rank alone (a DTensor with no ``Replicate`` dimension, as FSDP2's
``fully_shard`` makes, a group of one rank), a sparse tensor and a meta tensor are listed as not compared,
with the reason: a check never calls "identical" what it did not compare.

The layout is computed from the tensors and the environment alone, so ranks holding the same model
compute the same lanes and slots; a rank with another model shows up as a structure difference.
"""
import sys

from . import fingerprint

#: The parallel state of neuronx-distributed (optimum-neuron uses the same).
NEURON_STATE = "neuronx_distributed.parallel_layers.parallel_state"

FLAT_SHARD = ("a flat shard of this rank (FSDP FlatParameter / torch_xla FSDP): it differs per rank by design "
              "and has no replica group to compare over")
#: FSDP1 sharding strategies whose shards have replicas: the ranks with the same shard index.
HYBRID = ("HYBRID_SHARD", "_HYBRID_SHARD_ZERO2")

#: The declarations of the tensors no layout places: decide per tensor at its first look, or the whole world.
AUTO, WORLD = "auto", "world"
ACCEPTED = "'auto', 'world', a torch.distributed process group or a list of rank lists ([[0, 1], [2, 3]])"
#: What a check's first look decided (``SyncReport.rule``): replicas over the world, or some tensors set aside.
RULE_WORLD, RULE_APART = "world", "apart"
SPARSE = "a sparse tensor: its indices and values are not compared (compare its to_dense() to include it)"
META = "a meta tensor: it holds no values to compare"
APART = ("differed at its first check with no declared data-parallel layout (replicas that started "
         "different, or not replicas by design): not compared since")


class Placement(object):
    """Where one tensor is compared: ``pattern`` (hashable, the same on every rank), ``coordinates`` (how
    many replica groups the pattern has), ``coordinate`` (this rank's group, None: holds nothing of it),
    ``local`` (the tensor compared here) and ``description`` (what the structure digest covers)."""

    __slots__ = ("pattern", "coordinates", "coordinate", "local", "description", "declared")

    def __init__(self, pattern, coordinates, coordinate, local, description, declared=True):
        self.pattern = pattern
        self.coordinates = coordinates
        self.coordinate = coordinate
        self.local = local
        self.description = description
        #: False: over the world by default only, to be decided at the stream's first check (rule 7)
        self.declared = declared


def _is_dtensor(tensor):
    return any(cls.__name__ == "DTensor" for cls in type(tensor).__mro__)


def _is_flat_shard(tensor):
    if getattr(tensor, "_is_sharded", False) or getattr(tensor, "_fsdp_flattened", False):
        return True
    # torch 1.x: FlatParameter is a class of its own (torch 2.x's reports type Parameter; only the mark tells)
    return any(cls.__name__ == "FlatParameter" for cls in type(tensor).__mro__)


def shape_on_every_rank(tensor):
    """The tensor's shape as every rank of the job sees it: an FSDP1 original parameter is a view of this
    rank's shard, whose length differs per rank, so it has none (the rest have theirs)."""
    if getattr(tensor, "_fsdp_flattened", False):
        return "FSDP flat"
    return tuple(int(d) for d in tensor.shape)


def fsdp_handles(named):
    """``{id(tensor): (FlatParamHandle, replicas)}`` for the FSDP1 tensors of ``named``: their flat parameter
    or an original parameter viewing into it; ``replicas``: the size of the inter-node replica group of the
    FSDP module holding the handle (``HYBRID_SHARD``), or None. A tensor does not point to its handle: the
    handles and FSDP modules recorded at their construction (:mod:`.evidence`) are read, only when some listed
    tensor carries FSDP's mark."""
    wanted = {id(t) for _, t in named if getattr(t, "_fsdp_flattened", False)}
    if not wanted:
        return {}
    from . import evidence

    found, inter = {}, {}
    for obj in evidence.made("fsdp"):
        state = getattr(obj, "__dict__", {})
        if state.get("_handle") is not None and state.get("_inter_node_pg") is not None:
            inter[id(state["_handle"])] = state["_inter_node_pg"]
    for obj in evidence.made("handle"):
        flat = getattr(obj, "flat_param", None)
        if flat is None:
            continue
        for tensor in [flat] + list(getattr(flat, "_params", None) or ()) + \
                list(getattr(flat, "_shared_params", None) or ()):
            if id(tensor) in wanted:
                found[id(tensor)] = obj
    dist = sys.modules.get("torch.distributed")
    sizes = {}
    for key, group in inter.items():
        try:
            sizes[key] = int(dist.get_world_size(group))
        except Exception:
            pass
    return {key: (handle, sizes.get(id(handle))) for key, handle in found.items()}


def _world_size():
    dist = sys.modules.get("torch.distributed")
    try:
        return int(dist.get_world_size()) if dist is not None and dist.is_initialized() else None
    except Exception:
        return None


def _fsdp_placement(tensor, handle, replicas=None, world=None):
    """Rule 3: an FSDP1 tensor by its handle's sharding strategy (a string when it is not compared). Only
    an FSDP module spanning the whole world is compared: on a subgroup (FSDP beside tensor parallelism)
    the ranks with the same shard index are not all replicas of each other."""
    strategy = getattr(getattr(handle, "_sharding_strategy", None), "name", None)
    shards, index = getattr(handle, "world_size", None), getattr(handle, "rank", None)
    if strategy == "NO_SHARD":
        if shards == world:
            return Placement(("world",), 1, 0, tensor, fingerprint.describe(tensor))
        return "%s: FSDP NO_SHARD over %s of the %s ranks (its replica group is not known)" % (
            FLAT_SHARD, shards, world)
    if strategy in HYBRID and isinstance(shards, int) and isinstance(index, int) and 0 <= index < shards:
        if replicas is None or world is None or shards * replicas != world:
            return "%s: FSDP %s over %s x %s of the %s ranks (its replica groups are not known)" % (
                FLAT_SHARD, strategy, shards, replicas, world)
        # the local shard's length differs between shard indices: the description holds only what all share
        description = ("FSDP %s shard of %d" % (strategy, shards), str(tensor.dtype).replace("torch.", ""))
        return Placement(("fsdp-hybrid", shards), shards, index, tensor, description)
    return "%s: FSDP %s" % (FLAT_SHARD, strategy or "(sharding strategy unknown)")


def _dtensor_placement(tensor):
    """Rule 1: replica groups along the Replicate dimensions of the tensor's mesh; a string (not compared)
    when it has none: every rank of the mesh holds a shard of its own."""
    mesh = tensor.device_mesh
    sizes = tuple(int(n) for n in mesh.mesh.shape)
    split = tuple(d for d, p in enumerate(tensor.placements) if type(p).__name__ != "Replicate")
    ranks = tuple(int(r) for r in mesh.mesh.reshape(-1).tolist())
    coordinates = 1
    for d in split:
        coordinates *= sizes[d]
    where = mesh.get_coordinate()
    coordinate = None
    if where is not None:
        coordinate = 0
        for d in split:
            coordinate = coordinate * sizes[d] + int(where[d])
    placements = tuple(str(p) for p in tensor.placements)
    if coordinates == len(ranks):
        return ("a DTensor shard with no Replicate dimension (placements %s over %d ranks): no other rank holds "
                "it" % (", ".join(placements), len(ranks)))
    description = (tuple(int(n) for n in tensor.shape), str(tensor.dtype).replace("torch.", ""), placements)
    local = tensor.to_local() if coordinate is not None else None
    return Placement(("dtensor", sizes, ranks, split), coordinates, coordinate, local, description)


def _neuron_groups():
    """The data-parallel replica groups of neuronx-distributed's parallel state, or None when it is not
    imported or not initialised (decided from the imported module alone: nothing is imported here)."""
    state = sys.modules.get(NEURON_STATE)
    if state is None:
        return None
    try:
        if not state.model_parallel_is_initialized():
            return None
        groups = [tuple(int(r) for r in g) for g in state.get_data_parallel_replica_groups()]
    except Exception:
        return None
    return tuple(groups) if len(groups) > 1 else None


def _ranks_placement(tensor, group, rank, world, declared=True):
    """A tensor held equal by the ranks of ``group`` (this rank's replica group): over the whole world when
    it spans it, else one lane per possible lowest rank of a group (the same pattern on every rank, whatever
    the groups are); a string (not compared) when the group is this rank alone."""
    group = tuple(sorted(int(r) for r in group))
    if world is None or set(group) == set(range(world)):
        return Placement(("world",), 1, 0, tensor, fingerprint.describe(tensor), declared)
    if len(group) < 2:
        return "no other rank holds it: its replica group is rank %s alone" % (group[0] if group else rank)
    coordinate = group[0] if rank in group else None
    return Placement(("ranks", world), world, coordinate, tensor, fingerprint.describe(tensor), declared)


def _unplaceable(tensor):
    """Why a tensor cannot be fingerprinted as it is (sparse, meta), or None."""
    if getattr(tensor, "is_meta", False) or getattr(getattr(tensor, "device", None), "type", None) == "meta":
        return META
    if getattr(tensor, "is_sparse", False) or str(getattr(tensor, "layout", "torch.strided")) != "torch.strided":
        return SPARSE
    return None


def placement(tensor, rank, neuron_groups=None, fsdp_handle=None, world=None, ddp_group=None, declared=None):
    """The :class:`Placement` of one tensor on ``rank``, or a string: why it is not compared.
    ``fsdp_handle``: ``(FlatParamHandle, replicas)`` of an FSDP1 tensor (:func:`fsdp_handles`);
    ``ddp_group``: the ranks of the DDP module holding it (:func:`ddp_groups`); ``declared``: the user's
    declaration (:func:`declaration`: ``"auto"``, ``"world"`` or this rank's group). Under ``"auto"`` a tensor
    no layout places is over the world by default only (``declared`` False): each tensor's first look decides
    (:mod:`.decisions`), when the check is exchanged, never here -- a layout computed before a decision and one
    computed after it are the same, so every rank builds the same vector whenever it fingerprints."""
    why = _unplaceable(tensor)
    if why is not None:
        return why
    if _is_dtensor(tensor):
        return _dtensor_placement(tensor)
    if fsdp_handle is not None:
        return _fsdp_placement(tensor, fsdp_handle[0], fsdp_handle[1], world)
    if _is_flat_shard(tensor):
        return FLAT_SHARD
    if neuron_groups:
        coordinate = next((i for i, g in enumerate(neuron_groups) if rank in g), None)
        if coordinate is not None and len(neuron_groups[coordinate]) < 2:
            return "no other rank holds it: its data-parallel replica group is rank %d alone" % rank
        description = ("data-parallel over %d groups" % len(neuron_groups), str(tensor.dtype).replace("torch.", ""),
                       tensor.dim())
        return Placement(("neuron-dp", neuron_groups), len(neuron_groups), coordinate, tensor, description)
    if ddp_group is not None:
        return _ranks_placement(tensor, ddp_group, rank, world)
    if isinstance(declared, tuple):
        return _ranks_placement(tensor, declared, rank, world)
    return Placement(("world",), 1, 0, tensor, fingerprint.describe(tensor), declared != AUTO)


# --------------------------------------------------------------------------- the evidence
def check_replicas(replicas):
    """Raise ValueError unless ``replicas`` is an accepted declaration (see :data:`ACCEPTED`)."""
    if replicas in (AUTO, WORLD) or _is_process_group(replicas):
        return
    if isinstance(replicas, (list, tuple)) and replicas and all(
            isinstance(g, (list, tuple, set, frozenset)) and g and all(
                isinstance(r, int) and not isinstance(r, bool) and r >= 0 for r in g) for g in replicas):
        flat = [r for g in replicas for r in g]
        if len(flat) == len(set(flat)):
            return
        raise ValueError("replicas: a rank is in two groups of %r; accepted: %s" % (replicas, ACCEPTED))
    raise ValueError("replicas must be %s; got %r" % (ACCEPTED, replicas))


def _is_process_group(obj):
    return any(cls.__name__ in ("ProcessGroup", "_ProcessGroupWrapper") for cls in type(obj).__mro__)


def group_ranks(dist, group):
    """The sorted global ranks of process group ``group``: ``get_process_group_ranks`` (torch >= 1.13), else the
    table torch 1.12 keeps of each group's ranks."""
    read = getattr(dist, "get_process_group_ranks", None)
    if read is not None:
        return tuple(sorted(int(r) for r in read(group)))
    if group is None or group is getattr(getattr(dist, "GroupMember", None), "WORLD", object()):
        return tuple(range(dist.get_world_size()))
    return tuple(sorted(int(r) for r in dist.distributed_c10d._pg_group_ranks[group]))


def declaration(replicas, rank):
    """``"auto"``, ``"world"`` or this rank's group (a sorted tuple of ranks; empty: in none of the groups)."""
    if replicas in (AUTO, WORLD) or replicas is None:
        return replicas or AUTO
    if _is_process_group(replicas):
        dist = sys.modules.get("torch.distributed")
        return group_ranks(dist, replicas)
    return next((tuple(sorted(g)) for g in replicas if rank in g), ())


def step_replicas_declaration(declared, kind, size, xla_size):
    """The declaration once the replicas of ``xm.optimizer_step`` are taken as the data-parallel layout:
    ``"auto"`` becomes ``"world"`` on XLA without a process group (``kind == "xla host"``: the check's world is
    torch_xla's) and where torch_xla's world of ``xla_size`` replicas is the check's world of ``size``
    ranks (torch_xla beside a process group); anything else is kept."""
    if declared != AUTO:
        return declared
    if kind == "xla host" or (xla_size is not None and xla_size > 1 and xla_size == size):
        return WORLD
    return declared


def ddp_groups(named):
    """``{id(tensor): ranks}`` for the tensors of ``named`` that a live ``DistributedDataParallel`` module
    holds: the ranks of its process group. The DDP modules are those recorded at their construction
    (:mod:`.evidence`); nothing when torch.distributed is not loaded."""
    dist = sys.modules.get("torch.distributed")
    if dist is None or not named:
        return {}
    from . import evidence

    wanted = {id(t) for _, t in named}
    found = {}
    for obj in evidence.made("ddp"):
        try:
            group = getattr(obj, "process_group", None)
            ranks = group_ranks(dist, group) if group is not None else tuple(range(dist.get_world_size()))
            params = list(obj.module.parameters())
        except Exception:  # a DDP whose group cannot be read gives no evidence
            continue
        for p in params:
            if id(p) in wanted:
                found[id(p)] = ranks
    return found


class Layout(object):
    """The check's layout for a list of named tensors on this rank.

    ``names``/``structures``: every tensor's name and description, in order (the same on every rank with
    the same model); ``spans[k]``: the first lane of tensor ``k``'s pattern and how many lanes it has;
    ``entries``: ``(position, slot, local tensor)`` of the tensors this rank holds; ``not_compared``:
    ``(name, reason)``; ``undecided``: the positions compared over the world by default only (rule 7: each
    decided at its own first look, :mod:`.decisions`). ``declared``, ``ddp``: see :func:`placement`; ``world``:
    the world size (default: torch.distributed's, read only when a rule needs it). Lane ``l`` owns slots
    ``[l * width, (l + 1) * width)``; tensor ``k`` in lane ``l`` goes to slot ``l * width + k % width``.
    """

    def __init__(self, named, rank, slots=fingerprint.SLOTS, declared=WORLD, ddp=None, world=None):
        self.slots = slots
        named = list(named)
        neuron = _neuron_groups()
        handles = fsdp_handles(named)
        ddp = {} if ddp is None else ddp
        if world is None and (handles or ddp or isinstance(declared, tuple)):
            world = _world_size()
        found = []
        self.not_compared = []
        #: the listed tensor at each compared position (its identity keys the first-check rule's decision)
        self.tensors = []
        for name, tensor in named:
            where = placement(tensor, rank, neuron, handles.get(id(tensor)), world, ddp.get(id(tensor)),
                              declared)
            if isinstance(where, str):
                self.not_compared.append((name, where))
            else:
                found.append((name, where))
                self.tensors.append(tensor)
        #: positions of the tensors compared over the world by default only (rule 7: decided per tensor)
        self.undecided = frozenset(k for k, (_, where) in enumerate(found) if not where.declared)
        patterns = {}
        for _, where in found:
            patterns.setdefault(where.pattern, where.coordinates)
        offsets, lanes = {}, 0
        for pattern in sorted(patterns, key=repr):  # the same order on every rank
            offsets[pattern] = lanes
            lanes += patterns[pattern]
        self.lanes = max(1, lanes)
        if self.lanes > slots:
            raise ValueError("%d replica groups need more than the %d slots of the fingerprint" % (self.lanes, slots))
        self.width = slots // self.lanes
        self.names = [name for name, _ in found]
        self.structures = tuple(where.description for _, where in found)
        self.spans = [(offsets[where.pattern], where.coordinates) for _, where in found]
        self.entries = []
        self.lane_of = {}
        for k, (_, where) in enumerate(found):
            if where.coordinate is None:
                continue
            lane = offsets[where.pattern] + where.coordinate
            self.lane_of[k] = lane
            self.entries.append((k, self.slot(k, lane), where.local))

    def slot(self, position, lane):
        return lane * self.width + position % self.width

    def positions_in(self, slot):
        """The tensors that some rank writes to ``slot`` (the same list on every rank)."""
        lane, column = divmod(slot, self.width)
        return [k for k, (first, count) in enumerate(self.spans)
                if first <= lane < first + count and k % self.width == column]

    @property
    def plain(self):
        return self.lanes == 1
