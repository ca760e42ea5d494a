"""Verification driver for the optimum-neuron integration (used by the support table and ``check``).

The patching code never imports it. The release matrix runs optimum-neuron's
released optimizer module on stand-ins for torch_xla and the Neuron SDK
(tests/target/test_optimum_neuron.py); its scenarios are named
``optimum-neuron-*``.

:func:`event_step` drives one ``step(closure)`` of the row's release on a bare
``NeuronAcceleratedOptimizer`` (``__new__``: its ``step`` reads only the
attributes set here) with the recording stand-in for torch_xla. The
data-parallel reduction the release calls -- neuronx-distributed's
``bucket_allreduce_gradients``, and from it the data-parallel size -- is
replaced for that one call by a recorder (one replica: it records and reduces
nothing), where the release looks it up: the module's globals (0.3 on) or the
attributes its in-step import reads (0.1-0.2.2); everything is put back after.
:func:`graph_step` is not provided: a graph check needs the Neuron SDK's
collectives on a real device (``check`` reports it as not verified).
"""
import contextlib
import inspect
import types

from ...verify import driver


def matrix_scenarios(site, target):
    """Names of the scenarios of a release-matrix ``target`` that ran through ``site``: every
    ``optimum-neuron-*`` scenario (a target installs one optimum-neuron release, which one row matches)."""
    return [n for n in target.get("scenarios_run") or [] if n.startswith("optimum-neuron-")]


#: Releases that pass the closure to ``xm.optimizer_step`` (read from the wheels: file identical).
GUARDED_RELEASES = ("0.0.24", "0.0.28")


def unlisted_rows(targets):
    """Affected code no row patches, for the generated support tables: the 0.0.x line (the torch_xla
    guard's call; verified where a matrix target of that line reports it ``guarded``), and
    neuronx-distributed's own optimizer (not installable from the public index: not verifiable here)."""
    lower, upper = GUARDED_RELEASES
    names = sorted(name for name, target in targets.items()
                   if name.startswith("optimum-neuron==0.0.") and any(
                       r.get("verdict") == "guarded" and r.get("module") == "optimum.neuron.accelerate.optimizer"
                       for r in target.get("status") or []))
    evidence = []
    for name in names:
        target = targets[name]
        scenarios = [s for s in target.get("scenarios_run") or [] if s.startswith("optimum-neuron-")]
        if target.get("verdict") != "pass":
            evidence.append("`%s`: **FAIL**" % name)
            continue
        details = target.get("scenarios") or {}
        affected = [s for s in scenarios if (details.get(s) or {}).get("bug_can_occur")]
        worst = max([(details[s].get("divergence_without_shim") or 0.0) for s in affected] or [0.0])
        evidence.append("`%s`: status `guarded`; %s = reference bitwise; without shim diverge (max %.2g)"
                        % (name, ", ".join(s.split("-", 2)[2] for s in scenarios), worst))
    return [
        {"integration": "optimum_neuron", "package": "optimum.neuron", "releases": ">=%s,<0.1.0" % lower,
         "call_site": "optimum.neuron.accelerate.optimizer:NeuronAcceleratedOptimizer.step",
         "verdict": "guarded (no row)", "fix": "the torch_xla guard: the XLA branch passes the closure to "
         "`xm.optimizer_step` (the model-parallel branch drops it: another defect, untouched)",
         "evidence": evidence, "targets": names, "summary_releases": ">= %s, <= %s" % (lower, upper),
         "summary_verdict": "guarded: the closure goes to `xm.optimizer_step`"},
        {"integration": "optimum_neuron", "package": "neuronx_distributed", "releases": ">=0.6,<=0.11",
         "call_site": "neuronx_distributed.trainer.optimizer:NxDOptimizer.step",
         "verdict": "**affected, not verifiable here**", "fix": "none: not on the public package index; "
         "SyncCheck reports the divergence (docs/synccheck.md)", "evidence": [], "targets": [],
         "summary_releases": ">= 0.6, <= 0.11 (SDK 2.26)",
         "summary_verdict": "**affected, not verifiable here**"},
    ]


def _in_step_imports(target):
    return "neuronx_distributed.parallel_layers.grads" in target.row.shape.requires


def _recording_bucket(events):
    def bucket_allreduce_gradients(grads_list, reduce_over_ep_group=False):
        if not reduce_over_ep_group:
            events.append("reduce_gradients" if grads_list else "reduce_gradients(no grads)")

    return bucket_allreduce_gradients


@contextlib.contextmanager
def _replaced(owner, values):
    """``owner``'s attributes (a module, or a dict of module globals) set to ``values``, restored after."""
    space = owner if isinstance(owner, dict) else vars(owner)
    missing = object()
    saved = {name: space.get(name, missing) for name in values}
    space.update(values)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is missing:
                space.pop(name, None)
            else:
                space[name] = value


def _data_parallel_layers():
    """What 0.1-0.3 read from ``neuronx_distributed.parallel_layers``: a data-parallel size > 1 (so the
    release reduces at all), and the clipping (never asked for here)."""
    state = types.SimpleNamespace(get_data_parallel_size=lambda: 2)
    return types.SimpleNamespace(parallel_state=state, clip_grad_norm=None)


def _bindings(target, xm, bucket):
    """The replacements for one step, as ``[(owner, {name: value})]``."""
    module_globals = inspect.unwrap(target.function).__globals__
    if "trn_config" in target.row.shape.requires:  # 0.4: module globals
        return [(module_globals, {"bucket_allreduce_gradients": bucket})]
    layers = _data_parallel_layers()
    if not _in_step_imports(target):  # 0.3.0
        return [(module_globals, {"bucket_allreduce_gradients": bucket, "parallel_layers": layers,
                                  "xm": driver.FetchingXlaModel(xm)})]
    import importlib

    package = importlib.import_module("neuronx_distributed")
    grads = importlib.import_module("neuronx_distributed.parallel_layers.grads")
    return [(module_globals, {"xm": driver.FetchingXlaModel(xm)}), (package, {"parallel_layers": layers}),
            (grads, {"bucket_allreduce_gradients": bucket})]


def neuron_optimizer(target, optimizer):
    """A bare NeuronAcceleratedOptimizer of the row's release around ``optimizer``, on the branch the bug
    is on: sync step, no ZeRO-1, ``DistributedType.XLA`` (0.1-0.3), no sequence parallelism, no clipping."""
    module_globals = inspect.unwrap(target.function).__globals__
    distributed_type = getattr(module_globals.get("DistributedType"), "XLA", None)
    neuron = target.owner.__new__(target.owner)
    neuron.__dict__.update(
        optimizer=optimizer, scaler=None, clip_grad_norm_to_perform=None, permanent_clip_grad_norm=None,
        permanent_parameters=[], grad_norm=None, parameters=[], parameter_ids={},
        gradient_state=types.SimpleNamespace(sync_gradients=True),
        accelerator_state=types.SimpleNamespace(distributed_type=distributed_type,
                                                trn_config=types.SimpleNamespace(sequence_parallel_enabled=False)))
    return neuron


def event_step(target, torch, xm, events):
    """Run one ``step(closure)`` through ``target``; append ``forward``/``backward``/``step`` and the
    data-parallel reduction (``reduce_gradients``) to ``events``."""
    step = driver.recording_step(torch, events)
    neuron = neuron_optimizer(target, step.optimizer)
    with contextlib.ExitStack() as stack:
        for owner, values in _bindings(target, xm, _recording_bucket(events)):
            stack.enter_context(_replaced(owner, values))
        neuron.step(step.closure)
