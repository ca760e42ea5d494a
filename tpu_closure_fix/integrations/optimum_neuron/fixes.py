"""optimum-neuron's fixes: ``NeuronAcceleratedOptimizer.step(closure)`` on Trainium.

The release's ``step`` performs its gradient reductions -- the sequence-parallel
pass over the tensor-parallel group, ``bucket_allreduce_gradients`` over the
data-parallel group (and, from 0.4, the expert-parallel pass) -- and the
prepared gradient clipping, and only then calls
``self.optimizer.step(closure=closure)``: the closure's gradients are never
reduced, every replica steps on its own.

With a closure, the fixes run, after *each* evaluation of the closure, exactly
what the release runs before its step: the same functions, looked up where the
release looks them up (the module's globals at call time, or the call-time
import of 0.1-0.2.2), over the same groups, with the same conditions; then the
clipping the release would have applied; the loss an LBFGS-like optimizer reads
is averaged over the same data-parallel group by the same function (the
lockstep rule). Without a closure, on an accumulation micro-step
(``sync_gradients`` false), on the ZeRO-1 branch, and off the data/model-parallel
branch (0.1-0.3: another distributed type), the release's ``step`` runs
unchanged. Like the release, the fixed step returns None.

Never reduced by a global ``xm.reduce_gradients``: with tensor parallelism that
would average different tensor-parallel shards together.
"""
import importlib
import inspect
from functools import partial

from ...fixes import Fix, FixUnavailable, guarded, one_of, reduce_after, xla_model_for

#: ``NeuronAcceleratedOptimizer.step(self, closure=None)`` in every release.
PARAMS = ("closure",)


def _module_globals(original, names):
    """The globals of the module the release's ``step`` lives in; FixUnavailable if one of ``names`` is missing."""
    function = inspect.unwrap(original)
    module_globals = getattr(function, "__globals__", None)
    if module_globals is None:
        raise FixUnavailable("optimum.neuron.accelerate.optimizer: step is not a Python function")
    missing = [name for name in names if name not in module_globals]
    if missing:
        raise FixUnavailable("optimum.neuron.accelerate.optimizer has no %s" % ", ".join(missing))
    return module_globals


def _clip_parameters(parameters):
    """Parameters to clip after every evaluation: a one-shot iterator (``model.parameters()``) as a list."""
    if parameters is not None and iter(parameters) is parameters:
        return list(parameters)
    return parameters


class _Evaluation(object):
    """What the fixed step runs after each closure evaluation, and how it averages the loss."""

    def __init__(self, reduce, mean):
        self.reduce = reduce
        self.mean = mean


def _step_with(xm, instance, closure, evaluation):
    """``self.optimizer.step(closure=...)`` with every evaluation reduced (and averaged for lockstep)."""
    optimizer = instance.optimizer
    evaluate = partial(reduce_after, xm, optimizer, closure, evaluation.reduce, evaluation.mean)
    optimizer.step(closure=evaluate)
    return None


class DataParallelStepFix(Fix):
    """optimum-neuron 0.1.0-0.3.0: the data-parallel reduction and clipping after each evaluation.

    ``imports``: where the release finds ``parallel_layers`` and
    ``bucket_allreduce_gradients``: ``"step"`` (0.1-0.2.2: ``from neuronx_distributed
    import ...`` inside ``step``, repeated here at call time) or ``"module"``
    (0.3.0: the module's globals, read at call time).
    """

    name = "optimum-neuron-data-parallel"

    def __init__(self, imports):
        self.imports = one_of("imports", imports, ("step", "module"))

    def describe(self):
        return ("with a closure on the XLA/model-parallel branch: closure -> sequence-parallel pass -> "
                "bucket_allreduce_gradients over the data-parallel group -> clip as prepared (per evaluation) "
                "-> step; otherwise: original")

    def prepare(self, site, original, switch):
        needed = ("allreduce_sequence_parallel_gradients", "DistributedType", "NeuronDistributedType")
        if self.imports == "module":
            needed += ("parallel_layers", "bucket_allreduce_gradients")
        module_globals = _module_globals(original, needed)
        xla_model = xla_model_for(original)
        neuronx = _call_time_imports if self.imports == "step" else partial(_module_imports, module_globals)

        def data_parallel_step_fix(wrapped, args, kwargs, instance, values, extra):
            closure = values["closure"]
            if closure is None or not instance.gradient_state.sync_gradients:
                return wrapped(*args, **kwargs)
            distributed_type = instance.accelerator_state.distributed_type
            model_parallel = distributed_type is module_globals["NeuronDistributedType"].MODEL_PARALLELISM
            zero_1 = module_globals.get("ZeroRedundancyOptimizer")
            if (zero_1 is None or isinstance(instance.optimizer, zero_1)
                    or not (model_parallel or distributed_type is module_globals["DistributedType"].XLA)):
                return wrapped(*args, **kwargs)
            try:
                parallel_layers, bucket_allreduce_gradients = neuronx()
            except ImportError:  # the release's own check raises its message
                return wrapped(*args, **kwargs)
            xm = xla_model()
            clip = _take_prepared_clip(instance)
            evaluation = _data_parallel_evaluation(module_globals, xm, instance, parallel_layers,
                                                   bucket_allreduce_gradients, model_parallel, clip)
            return _step_with(xm, instance, closure, evaluation)

        return guarded(site.shape.params, switch, data_parallel_step_fix)


def _call_time_imports():
    """``from neuronx_distributed import parallel_layers`` and ``from neuronx_distributed.parallel_layers.grads
    import bucket_allreduce_gradients``, run now as the release's step runs them."""
    package = importlib.import_module("neuronx_distributed")
    importlib.import_module("neuronx_distributed.parallel_layers")
    grads = importlib.import_module("neuronx_distributed.parallel_layers.grads")
    return package.parallel_layers, grads.bucket_allreduce_gradients


def _module_imports(module_globals):
    return module_globals["parallel_layers"], module_globals["bucket_allreduce_gradients"]


def _take_prepared_clip(instance):
    """0.1-0.3: the clipping ``prepare_clip_grad_norm`` asked for, consumed as the release consumes it."""
    prepared = instance.clip_grad_norm_to_perform
    if prepared is None:
        return None
    kwargs = dict(prepared)
    parameters = _clip_parameters(kwargs.pop("parameters", None))
    instance.clip_grad_norm_to_perform = None
    return None if parameters is None else (parameters, kwargs)


def _data_parallel_evaluation(module_globals, xm, instance, parallel_layers, bucket_allreduce_gradients,
                              model_parallel, clip):
    def reduce(optimizer):
        if model_parallel:
            module_globals["allreduce_sequence_parallel_gradients"](optimizer)
        if parallel_layers.parallel_state.get_data_parallel_size() > 1:
            bucket_allreduce_gradients(xm._fetch_gradients(optimizer))
        if clip is not None:
            instance.grad_norm = parallel_layers.clip_grad_norm(clip[0], **clip[1])

    def mean(value):
        if parallel_layers.parallel_state.get_data_parallel_size() > 1:
            bucket_allreduce_gradients([value])
        return value

    return _Evaluation(reduce, mean)


class ExpertParallelStepFix(Fix):
    """optimum-neuron 0.4.0-0.4.5: the sequence-parallel, data-parallel and expert-parallel passes and the
    clipping, after each evaluation."""

    name = "optimum-neuron-expert-parallel"

    def describe(self):
        return ("with a closure off ZeRO-1: closure -> sequence-parallel pass -> bucket_allreduce_gradients "
                "(data-parallel, then expert-parallel pass) -> clip as prepared/permanent (per evaluation) -> "
                "step; otherwise: original")

    def prepare(self, site, original, switch):
        module_globals = _module_globals(original, ("allreduce_sequence_parallel_gradients", "NeuronZero1Optimizer",
                                                    "bucket_allreduce_gradients", "clip_grad_norm"))
        xla_model = xla_model_for(original)

        def expert_parallel_step_fix(wrapped, args, kwargs, instance, values, extra):
            closure = values["closure"]
            if (closure is None or not instance.gradient_state.sync_gradients
                    or isinstance(instance.optimizer, module_globals["NeuronZero1Optimizer"])):
                return wrapped(*args, **kwargs)
            sequence_parallel = instance.accelerator_state.trn_config.sequence_parallel_enabled
            clip = _take_clip(instance)
            evaluation = _expert_parallel_evaluation(module_globals, instance, sequence_parallel, clip)
            return _step_with(xla_model(), instance, closure, evaluation)

        return guarded(site.shape.params, switch, expert_parallel_step_fix)


def _take_clip(instance):
    """0.4: the prepared clipping (consumed), else the permanent one, as the release chooses."""
    if instance.clip_grad_norm_to_perform is not None:
        kwargs = dict(instance.clip_grad_norm_to_perform)
        parameters = _clip_parameters(kwargs.pop("parameters", None))
    elif instance.permanent_clip_grad_norm is not None:
        kwargs = dict(instance.permanent_clip_grad_norm)
        parameters = instance.permanent_parameters
    else:
        return None
    if parameters is None:
        return None
    instance.clip_grad_norm_to_perform = None
    return parameters, kwargs


def _expert_parallel_evaluation(module_globals, instance, sequence_parallel, clip):
    experts = []  # whether the last evaluation had expert-parallel gradients

    def reduce(optimizer):
        if sequence_parallel:
            module_globals["allreduce_sequence_parallel_gradients"](optimizer)
        non_ep_gradients, ep_gradients = instance._fetch_gradients()
        bucket_allreduce_gradients = module_globals["bucket_allreduce_gradients"]
        bucket_allreduce_gradients(non_ep_gradients + ep_gradients)
        if len(ep_gradients) > 0:
            bucket_allreduce_gradients(non_ep_gradients, reduce_over_ep_group=True)
        experts[:] = [len(ep_gradients) > 0]
        if clip is not None:
            instance.grad_norm = module_globals["clip_grad_norm"](clip[0], **clip[1])

    def mean(value):
        """The loss is replicated like a non-expert gradient: averaged by the same passes."""
        bucket_allreduce_gradients = module_globals["bucket_allreduce_gradients"]
        bucket_allreduce_gradients([value])
        if experts and experts[0]:
            bucket_allreduce_gradients([value], reduce_over_ep_group=True)
        return value

    return _Evaluation(reduce, mean)
