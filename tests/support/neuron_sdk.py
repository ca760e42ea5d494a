"""Stand-ins for the Neuron SDK that optimum-neuron's optimizer module imports, and how it is loaded.

torch-neuronx and neuronx-distributed are not on the public package index (the
index's ``neuronx-distributed`` 0.1 and ``torch-neuronx`` 1.0 are placeholders),
so the tests replace them -- and only them -- on top of the torch_xla stand-in
(:mod:`support.accelerate_xla` over :mod:`support.xla_standin`). What the
optimizer's ``step`` calls follows neuronx-distributed's published source
(``parallel_layers/parallel_state.py``, ``grads.py``, ``mappings.py``) for
a world of N replica processes with tensor/pipeline/expert parallel size 1,
i.e. data-parallel size N:

* ``parallel_state``: ``get_data_parallel_size()`` = N, tensor-parallel size 1,
  the data-parallel / expert-data-parallel replica groups ``[[0..N-1]]`` and the
  expert-model-parallel groups ``[[0], [1], ...]``;
* ``grads.bucket_allreduce_gradients(grads_list, reduce_over_ep_group=False)``:
  per dtype, in reverse order, each gradient divided by the data-parallel size
  (1.0 over the expert-parallel group), then ``xm.all_reduce("sum", bucket,
  groups=...)`` in 512 MB buckets -- over gloo here: a group spanning every
  replica is reduced, a group of one is left alone (the only groups this
  world has);
* ``grads.clip_grad_norm(parameters, max_norm, norm_type=2)``: the total norm
  (its all-reduce over the tensor-parallel group of size 1 is the identity),
  gradients scaled by ``max_norm / (norm + 1e-6)`` when that is < 1;
* ``mappings.reduce_from_tensor_model_parallel_region``: identity at
  tensor-parallel size 1;
* ``NeuronZero1Optimizer`` (neuronx_distributed.optimizer) and torch_xla's
  ``ZeroRedundancyOptimizer``: classes the release tests with ``isinstance``;
  the scenarios never build one (instantiating raises).

Every other name and ``neuronx_distributed`` module optimum-neuron imports at
module level is import-only: an unsimulated class that raises when called,
so no scenario silently depends on it.

``optimum.neuron.accelerate``'s package ``__init__`` imports
``NeuronAccelerator``, which needs the whole SDK (compiler, pipeline
parallelism, model classes); :func:`install` therefore also puts a finder in
front of ``sys.meta_path`` that imports that one package without running its
``__init__`` (its ``__path__`` is the installed folder). ``import
optimum.neuron.accelerate.optimizer`` then runs as on a Trainium host:
``optimum.neuron`` first, then the released optimizer file, through the normal
import system, so the start-up watcher and post-import hooks see every step.

Events (in :mod:`support.xla_standin`'s log): ``("bucket_allreduce",
{"tensors": n, "group": "data_parallel" | "expert_parallel"})`` per call,
``("sequence_parallel_reduce", {})``, ``("clip_grad_norm", {})``.
"""
import importlib
import importlib.machinery
import os
import sys
import types

from support import accelerate_xla, xla_standin

_ALLREDUCE_BUCKET_CAP_MB = 512


def _module(name, package=False, cls=types.ModuleType):
    """A stand-in module registered under ``name`` (with a spec, as ``importlib.util.find_spec`` needs)."""
    module = sys.modules.get(name)
    if module is None:
        module = cls(name)
        module.__spec__ = importlib.machinery.ModuleSpec(name, None, is_package=package)
        if package:
            module.__path__ = []
        sys.modules[name] = module
        parent, _, leaf = name.rpartition(".")
        if parent in sys.modules:
            setattr(sys.modules[parent], leaf, module)
    return module


def _unsimulated_class(qualified):
    """A class (optimum-neuron subclasses some of the SDK's at import time) that raises when called."""
    def __init__(self, *args, **kwargs):
        raise RuntimeError("%s is not simulated (imported by optimum-neuron; the scenarios never call it)"
                           % qualified)

    return type(qualified.rsplit(".", 1)[1], (object,), {"__init__": __init__})


class _ImportOnly(types.ModuleType):
    """A module whose every missing name is an unsimulated class (import-time names only)."""

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        value = _unsimulated_class("%s.%s" % (self.__name__, name))
        setattr(self, name, value)
        return value


class _ImportOnlyFinder(object):
    """Every other ``neuronx_distributed.*`` module optimum-neuron imports (0.0.x's ``optimum.neuron``
    imports many at import time) is an import-only package."""

    PREFIX = "neuronx_distributed."

    @classmethod
    def find_spec(cls, fullname, path=None, target=None):
        if not fullname.startswith(cls.PREFIX):
            return None
        return importlib.machinery.ModuleSpec(fullname, cls, is_package=True)

    @staticmethod
    def create_module(spec):
        module = _ImportOnly(spec.name)
        module.__path__ = []
        return module

    @staticmethod
    def exec_module(module):
        return None


# --------------------------------------------------------------------------- parallel_state
def _world():
    return xla_standin.xrt_world_size()


def get_data_parallel_size():
    return _world()


def get_data_parallel_rank():
    return xla_standin.get_ordinal()


def get_tensor_model_parallel_size():
    return 1


def get_tensor_model_parallel_rank():
    return 0


def get_pipeline_model_parallel_size():
    return 1


def get_data_parallel_replica_groups():
    return [list(range(_world()))]


def get_expert_data_parallel_replica_groups():
    return [list(range(_world()))]


def get_expert_model_parallel_replica_groups():
    return [[rank] for rank in range(_world())]


def model_parallel_is_initialized():
    return True


# --------------------------------------------------------------------------- grads
def _all_reduce_over(groups, tensors):
    """``xm.all_reduce("sum", tensors, groups=groups)`` for the groups this world has: every replica, or one."""
    size = len(groups[0])
    if size == 1:
        return
    if size != _world() or len(groups) != 1:
        raise NotImplementedError("replica groups %r are not simulated" % (groups,))
    import torch_xla.core.xla_model as xm

    xm.all_reduce("sum", tensors, groups=groups)


def bucket_allreduce_gradients(grads_list, reduce_over_ep_group=False):
    """neuronx-distributed's bucketed gradient all-reduce (see the module docstring)."""
    xla_standin.record("bucket_allreduce", tensors=len(grads_list),
                       group="expert_parallel" if reduce_over_ep_group else "data_parallel")
    bucket_cap = int(os.getenv("ALLREDUCE_BUCKET_CAP_MB", _ALLREDUCE_BUCKET_CAP_MB)) * 1024 * 1024
    dtype_groups = {}
    for grad in grads_list:
        dtype_groups.setdefault(grad.dtype, []).append(grad)
    groups = get_expert_model_parallel_replica_groups() if reduce_over_ep_group \
        else get_expert_data_parallel_replica_groups()
    size = get_data_parallel_size() if not reduce_over_ep_group else 1.0
    for grads in dtype_groups.values():
        total, bucket = 0, []
        for grad in reversed(grads):
            grad.data /= size
            grad_bytes = grad.numel() * grad.element_size()
            if grad_bytes > bucket_cap:
                if bucket:
                    _all_reduce_over(groups, bucket)
                    total, bucket = 0, []
                _all_reduce_over(groups, [grad])
                continue
            total += grad_bytes
            if total > bucket_cap:
                _all_reduce_over(groups, bucket)
                total, bucket = grad_bytes, []
            bucket.append(grad)
        if bucket:
            _all_reduce_over(groups, bucket)


def clip_grad_norm(parameters, max_norm, norm_type=2):
    """neuronx-distributed's clip_grad_norm at tensor-parallel size 1 (the norm's all-reduce is the identity)."""
    import torch

    xla_standin.record("clip_grad_norm")
    if isinstance(parameters, torch.Tensor):
        parameters = [parameters]
    grads = [p.grad.detach() for p in parameters if p.grad is not None]
    total_norm = torch.zeros([], dtype=torch.float32)
    for grad in grads:
        total_norm += torch.norm(grad, norm_type) ** norm_type
    total_norm = torch.pow(total_norm, 1.0 / norm_type)
    clip_coeff = max_norm / (total_norm + 1.0e-6)
    for grad in grads:
        grad.data.mul_(torch.where(clip_coeff < 1, clip_coeff, torch.tensor(1.0)))
    return total_norm


def reduce_from_tensor_model_parallel_region(input_):
    xla_standin.record("sequence_parallel_reduce")
    return input_  # tensor-parallel size 1


# --------------------------------------------------------------------------- install
def install(world_size, ordinal):
    """The torch_xla stand-in (with what accelerate calls) plus the Neuron SDK stand-ins; returns xm."""
    xm = accelerate_xla.install(world_size, ordinal)
    torch_xla = sys.modules["torch_xla"]
    if getattr(torch_xla, "__spec__", None) is None:
        torch_xla.__spec__ = importlib.machinery.ModuleSpec("torch_xla", None, is_package=True)
    zero = _module("torch_xla.distributed.zero_redundancy_optimizer")
    zero.ZeroRedundancyOptimizer = _unsimulated_class("torch_xla.distributed.zero_redundancy_optimizer."
                                                      "ZeroRedundancyOptimizer")
    _module("torch_xla.utils", package=True)
    _module("torch_xla.utils.checkpoint", cls=_ImportOnly)

    nxd = _module("neuronx_distributed", package=True)
    nxd.__version__ = "stand-in"
    layers = _module("neuronx_distributed.parallel_layers", package=True)
    state = _module("neuronx_distributed.parallel_layers.parallel_state", cls=_ImportOnly)
    for function in (get_data_parallel_size, get_data_parallel_rank, get_tensor_model_parallel_size,
                     get_tensor_model_parallel_rank, get_pipeline_model_parallel_size,
                     get_data_parallel_replica_groups, get_expert_data_parallel_replica_groups,
                     get_expert_model_parallel_replica_groups, model_parallel_is_initialized):
        setattr(state, function.__name__, function)
    grads = _module("neuronx_distributed.parallel_layers.grads")
    grads.bucket_allreduce_gradients = bucket_allreduce_gradients
    grads.clip_grad_norm = clip_grad_norm
    mappings = _module("neuronx_distributed.parallel_layers.mappings")
    mappings.reduce_from_tensor_model_parallel_region = reduce_from_tensor_model_parallel_region
    _module("neuronx_distributed.parallel_layers.utils", cls=_ImportOnly)
    layers.clip_grad_norm = clip_grad_norm  # parallel_layers/__init__ re-exports it
    optimizer = _module("neuronx_distributed.optimizer")
    optimizer.NeuronZero1Optimizer = _unsimulated_class("neuronx_distributed.optimizer.NeuronZero1Optimizer")
    if _ImportOnlyFinder not in sys.meta_path:
        sys.meta_path.append(_ImportOnlyFinder)
    if _AcceleratePackageFinder not in sys.meta_path:
        sys.meta_path.insert(0, _AcceleratePackageFinder)
    return xm


class _AcceleratePackageFinder(object):
    """Finds ``optimum.neuron.accelerate`` -- the installed folder -- as a package whose ``__init__`` is
    not run. Everything around it imports as usual: ``optimum.neuron`` (the real package, first, where
    the start-up watcher sees it) before, the released ``optimizer`` module after."""

    NAME = "optimum.neuron.accelerate"

    @classmethod
    def find_spec(cls, fullname, path=None, target=None):
        if fullname != cls.NAME:
            return None
        folder = next((os.path.join(entry, "accelerate") for entry in path or ()
                       if os.path.isdir(os.path.join(entry, "accelerate"))), None)
        if folder is None:
            return None
        spec = importlib.machinery.ModuleSpec(fullname, cls, is_package=True)
        spec.submodule_search_locations = [folder]
        return spec

    @staticmethod
    def create_module(spec):
        return None  # the default module object

    @staticmethod
    def exec_module(module):
        return None  # the package __init__ (NeuronAccelerator, the whole SDK) is not run


def load_optimizer_module():
    """Import the released ``optimum.neuron.accelerate.optimizer`` (after :func:`install`)."""
    return importlib.import_module("optimum.neuron.accelerate.optimizer")
