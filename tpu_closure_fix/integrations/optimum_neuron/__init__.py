"""The Hugging Face optimum-neuron integration (AWS Trainium): ``NeuronAcceleratedOptimizer.step(closure)``.

Trainium trains through torch_xla; optimum-neuron wraps the optimizer in
``NeuronAcceleratedOptimizer`` (``optimum/neuron/accelerate/optimizer.py``),
whose ``step`` reduces the gradients over neuronx-distributed's data-parallel
group *before* handing the closure to the optimizer. The rows follow the code
shapes read from the published wheels (every boundary between two adjacent
releases that were both read; files identical within a row):

==============  ===============================================================
0.0.24-0.0.28   XLA branch: ``xm.optimizer_step(self.optimizer, optimizer_args=...)``
                with the closure: no row, the torch_xla guard's call (``guarded``);
                the model-parallel branch calls ``self.optimizer.step()`` and drops
                the closure (another defect, not this one)
0.1.0-0.2.2     on ``DistributedType.XLA`` or ``MODEL_PARALLELISM``: imports inside
                ``step()``; sequence-parallel LayerNorm gradients all-reduced over the
                tensor-parallel group (model parallelism), then
                ``bucket_allreduce_gradients(xm._fetch_gradients(...))`` when the
                data-parallel size is > 1, then ``parallel_layers.clip_grad_norm``
                as prepared, then ``self.optimizer.step(closure=closure)``
0.3.0           the same, imported at module level
0.4.0-0.4.5     no distributed-type test; sequence-parallel pass when
                ``trn_config.sequence_parallel_enabled``; ``self._fetch_gradients()``
                splits expert-parallel gradients: ``bucket_allreduce_gradients(non_ep + ep)``
                and, with experts, a second pass ``reduce_over_ep_group=True``;
                ``clip_grad_norm`` prepared or permanent; then the step
==============  ===============================================================

On every row the ZeRO-1 branch (torch_xla's ``ZeroRedundancyOptimizer`` up to
0.3.0, ``NeuronZero1Optimizer`` from 0.4.0) runs the closure inside the ZeRO
``step`` and reduce-scatters after it: that branch is left to the release.

The release of optimum-neuron is read from ``optimum.neuron.version.__version__``
(:func:`tpu_closure_fix.releases.loaded_release`): ``optimum`` is a namespace
package without a release of its own, and ``optimum.neuron`` is a lazy module
that does not carry it.
"""
from ...shape import Shape
from ...sites import fingerprint_table, make_site
from .fixes import PARAMS, DataParallelStepFix, ExpertParallelStepFix

NAME = "optimum_neuron"
#: Packages whose import arms the start-up watcher (``optimum`` alone is a namespace shared by
#: many distributions that never train on Trainium).
PACKAGES = frozenset(("optimum.neuron",))

MODULE = "optimum.neuron.accelerate.optimizer"
QUALNAME = "NeuronAcceleratedOptimizer.step"
PACKAGE = "optimum.neuron"
DISTRIBUTION = "optimum-neuron"

# --- shapes ------------------------------------------------------------------
_COMMON = ("sync_gradients", "allreduce_sequence_parallel_gradients", "bucket_allreduce_gradients",
           "_fetch_gradients", "clip_grad_norm_to_perform", "closure", "optimizer", "step")
#: Signs of another code path: torch_xla's own optimizer_step (0.0.x), a reduction inside the closure.
_NOT_THIS = ("optimizer_step", "optimizer_args", "reduce_gradients", "mark_step")
_IN_STEP_IMPORT = "neuronx_distributed.parallel_layers.grads"
_DATA_PARALLEL = _COMMON + ("parallel_layers", "parallel_state", "get_data_parallel_size", "clip_grad_norm",
                            "ZeroRedundancyOptimizer", "MODEL_PARALLELISM", "XLA", "distributed_type", "xm")
_EXPERT_PARALLEL = ("trn_config", "sequence_parallel_enabled", "NeuronZero1Optimizer", "reduce_over_ep_group",
                    "clip_grad_norm", "permanent_clip_grad_norm", "permanent_parameters")

#: What only the 0.4 code reads.
_NOT_DATA_PARALLEL = ("trn_config", "NeuronZero1Optimizer", "reduce_over_ep_group")

DATA_PARALLEL_STEP_IMPORTS = Shape(PARAMS, varkw=False, requires=_DATA_PARALLEL + (_IN_STEP_IMPORT,),
                                   forbids=_NOT_THIS + _NOT_DATA_PARALLEL)
DATA_PARALLEL_MODULE_IMPORTS = Shape(PARAMS, varkw=False, requires=_DATA_PARALLEL,
                                     forbids=_NOT_THIS + _NOT_DATA_PARALLEL + (_IN_STEP_IMPORT,))
EXPERT_PARALLEL = Shape(PARAMS, varkw=False, requires=_COMMON + _EXPERT_PARALLEL,
                        forbids=_NOT_THIS + ("ZeroRedundancyOptimizer", "get_data_parallel_size", _IN_STEP_IMPORT))


#: Code fingerprints (:mod:`tpu_closure_fix.identity`) of each row's known code, ``(release,
#: fingerprint)``, measured by ``python scripts/fingerprints.py wheels`` from every wheel 0.1.0-0.4.5
#: (docs/fingerprints.json): one code per row.
FINGERPRINTS = fingerprint_table("""
optimum-neuron-0.1  0.2.2=sha256:cd9aef4581d4485b
optimum-neuron-0.3  0.3.0=sha256:569735073877ce50
optimum-neuron-0.4  0.4.5=sha256:0a45407c4da42099
""")


def _site(variant, releases, shape, fix, note=""):
    return make_site(variant, NAME, PACKAGE, DISTRIBUTION, MODULE, QUALNAME, releases, shape, fix,
                     fingerprints=FINGERPRINTS[variant], note=note)


CALL_SITES = (
    _site("optimum-neuron-0.1", ">=0.1.0,<0.3.0", DATA_PARALLEL_STEP_IMPORTS, DataParallelStepFix("step"),
          note="imports inside step(); ZeRO-1 branch left to the release"),
    _site("optimum-neuron-0.3", ">=0.3.0,<0.4.0", DATA_PARALLEL_MODULE_IMPORTS, DataParallelStepFix("module"),
          note="ZeRO-1 branch left to the release"),
    _site("optimum-neuron-0.4", ">=0.4.0,<0.4.6", EXPERT_PARALLEL, ExpertParallelStepFix(),
          note="expert-parallel passes; ZeRO-1 branch left to the release"),
)
