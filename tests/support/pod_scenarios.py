"""Replica scenarios for SyncCheck on a small "pod": one process per rank, joined by torch.distributed (gloo).

Run by :func:`support.ranks.run_ranks` as ``python -m support.pod_scenarios --scenario NAME --rank R
--world W --port P --out FILE [--variant V] [--kill]`` (or as a script, ``python .../pod_scenarios.py``,
under ``tpu-closure-fix run``). Each scenario is a training loop or a few ``compare_replicas`` calls;
``--variant`` picks the "right" case or its twin. The child writes one JSON file:

* ``warnings``: every ``TPUClosureFixWarning`` issued (``message``, ``filename``, ``lineno``), shown
  always (no once-per-location filtering);
* ``reports``: ``SyncReport.as_dict()`` of the reports the scenario got, each with ``message`` and ``case``;
* ``hook``: what the zero-code check did here (module loaded, armed every N, ``seen["checks"]``, the
  last report, per stream: key, checks, stood down);
* ``error``: the exception the scenario ended with (``Type: message``), or None; ``result``: scenario facts;
* ``modules``: the files ``tpu_closure_fix`` and ``_tpu_closure_fix_startup`` were loaded from (None: not
  loaded), ``seconds``: wall time since the interpreter reached this module.

``fabric-ddp`` and ``trainer-ddp`` import the framework of a release-matrix target: tests/target/test_synccheck.py
runs them with the target's folder on ``PYTHONPATH``.

Module level imports only the standard library: the ``plain`` scenario is a script that imports neither a
framework nor ``tpu_closure_fix`` (only the start-up hook may bring it in). Every other scenario imports
``tpu_closure_fix`` first, as a user's script would at its top.

Exit code: 0 when the scenario ended without an exception, 3 when it raised (the JSON is written either way);
a rank told ``--kill`` dies with ``os._exit(1)`` where the scenario says.
"""
import argparse
import importlib.util
import os
import sys
import threading
import time
import warnings

T0 = time.monotonic()
NEURON_STATE = "neuronx_distributed.parallel_layers.parallel_state"
OURS = r"(SyncCheck|tpu-closure-fix)"
SEEN = []


def _record_warnings():
    original = warnings.showwarning

    def show(message, category, filename, lineno, file=None, line=None):
        if any(c.__name__ == "TPUClosureFixWarning" for c in category.__mro__):
            SEEN.append({"message": str(message), "category": category.__name__, "filename": filename,
                         "lineno": lineno})
        original(message, category, filename, lineno, file, line)

    warnings.showwarning = show
    _show_ours()
    if os.environ.get("SYNC_CHECK_TEST_RECORD", "1") == "1":  # "0": the reports go to stderr as for a user
        from support.said import record_into

        record_into(SEEN)  # SyncCheck's reports go out on its logger


def _show_ours():
    warnings.filterwarnings("always", message=OURS)


class Context(object):
    def __init__(self, args):
        self.rank, self.world, self.variant, self.kill = args.rank, args.world, args.variant, args.kill
        self.port = args.port
        self.steps, self.drain = args.steps, args.drain
        self.reports, self.result, self.barrier = [], {}, True
        self.exit_normally = False  # leave through the interpreter's exit (its exit hooks run), not os._exit

    def keep(self, report, case):
        if report is None:
            self.reports.append({"case": case, "outcome": None})
            return
        entry = report.as_dict()
        entry.update(case=case, message=report.message())
        self.reports.append(entry)


# --------------------------------------------------------------------------- training pieces
def make_model(seed=0):
    import torch

    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))


def batch(data_rank, step):
    import torch

    gen = torch.Generator().manual_seed(1000 * (data_rank + 1) + step)
    return torch.randn(16, 8, generator=gen), torch.randn(16, 4, generator=gen)


def all_reduce_grads(params, world):
    import torch.distributed as dist

    for p in params:
        dist.all_reduce(p.grad)
        p.grad.div_(world)


def train_step(model, optimizer, x, y, reduce, world):
    import torch

    optimizer.zero_grad()
    torch.nn.functional.mse_loss(model(x), y).backward()
    if reduce:
        all_reduce_grads(list(model.parameters()), world)
    optimizer.step()


def hook_state():
    """What the zero-code check did in this process (read from the loaded modules, nothing imported)."""
    hook = sys.modules.get("tpu_closure_fix.synccheck.hook")
    if hook is None:
        return {"loaded": False, "checks": 0, "armed_every": 0, "last_report": None, "streams": []}
    last = hook.seen["last_report"]
    streams = [{"key": stream.key, "checks": stream.checks, "steps": steps, "stood_down": stream.stood_down}
               for stream, steps in list(hook._counts.values())]
    return {"loaded": True, "checks": hook.seen["checks"], "armed_every": hook.armed_every(),
            "last_report": None if last is None else last.as_dict(), "streams": sorted(streams, key=lambda s: s["key"])}


# --------------------------------------------------------------------------- scenarios
#: Seconds a loop of ``--steps 0`` ("until it raises") trains at most.
UNTIL_RAISED_SECONDS = 120.0


def probe(ctx):
    """(a) A correct loop (``--variant noreduce``: no gradient all-reduce); after step 1 only rank 0 probes
    for accelerate with importlib.util.find_spec (the start-up watcher's trigger). ``--steps 0``: the loop runs
    until a step raises (at most :data:`UNTIL_RAISED_SECONDS`): how many steps a rank trains before its worker
    answers is then the machine's load, not the test's guess."""
    import torch

    model = make_model(0)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    deadline = time.monotonic() + UNTIL_RAISED_SECONDS
    step = 0
    while step < ctx.steps or (ctx.steps == 0 and time.monotonic() < deadline):
        step += 1
        train_step(model, optimizer, *batch(ctx.rank, step), reduce=ctx.variant != "noreduce", world=ctx.world)
        if step == 1 and ctx.rank == 0:
            ctx.result["probed"] = importlib.util.find_spec("accelerate") is not None
    ctx.result["steps"] = step


def probe_optimizer(ctx):
    """(b) A correct loop; rank 0 also trains a probe model with an optimizer of its own every step
    (``--variant copy``: instead, before training, rank 0 alone steps once a copy of the model -- the same
    shapes as the model's optimizer -- at a line of its own)."""
    import copy

    import torch

    model = make_model(0)
    if ctx.variant == "copy" and ctx.rank == 0:
        probe_model = copy.deepcopy(model)
        probe_optimizer = torch.optim.SGD(probe_model.parameters(), lr=0.5)
        train_step(probe_model, probe_optimizer, *batch(ctx.rank, 0), reduce=False, world=ctx.world)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    if ctx.variant != "copy":
        probe_model = torch.nn.Linear(4, 1)
        probe_optimizer = torch.optim.SGD(probe_model.parameters(), lr=0.1)
    ctx.result["loop_start_seconds"] = round(time.monotonic() - T0, 3)
    for step in range(1, ctx.steps + 1):
        x, y = batch(ctx.rank, step)
        train_step(model, optimizer, x, y, reduce=True, world=ctx.world)
        if ctx.rank == 0 and ctx.variant != "copy":
            probe_optimizer.zero_grad()
            probe_model(model(x).detach()).pow(2).mean().backward()
            probe_optimizer.step()
        ctx.result["steps"] = step
    ctx.result["loop_end_seconds"] = round(time.monotonic() - T0, 3)  # from the interpreter's start
    ctx.result["drained_in_loop"] = _drain(ctx.drain)  # the checks are answered off the training thread
    hook = sys.modules.get("tpu_closure_fix.synccheck.hook")
    counts = hook._counts if hook is not None else {}
    if id(optimizer) not in counts:
        return  # the check is off in this run
    ctx.result["main_stream"] = counts[id(optimizer)][0].key
    ctx.result["main_checks"] = counts[id(optimizer)][0].checks
    if ctx.rank == 0:
        ctx.result["probe_stream"] = counts[id(probe_optimizer)][0].key
        ctx.result["probe_stood_down"] = counts[id(probe_optimizer)][0].stood_down


def probe_first(ctx):
    """(b') Rank 0 steps a probe optimizer of its own BEFORE the main one at every step (its checks are never
    reached by rank 1); ``--variant diverge``: rank 1 alone applies a different update at step ``steps - 40``."""
    import torch

    model = make_model(0)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    probe_model = torch.nn.Linear(4, 1)
    probe_optimizer = torch.optim.SGD(probe_model.parameters(), lr=0.1)
    diverge_at = ctx.steps - 40 if ctx.variant == "diverge" else None
    for step in range(1, ctx.steps + 1):
        x, y = batch(0, step)
        if ctx.rank == 0:
            probe_optimizer.zero_grad()
            probe_model(torch.ones(2, 4)).pow(2).mean().backward()
            probe_optimizer.step()
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        all_reduce_grads(list(model.parameters()), ctx.world)
        if step == diverge_at and ctx.rank == 1:
            model[0].weight.grad[0, 0] += 1.0
        optimizer.step()
        time.sleep(0.02)  # a real step's time: the worker exchanges one check per step
        ctx.result["steps"] = step
    ctx.result["diverged_at"] = diverge_at
    ctx.result["drained_in_loop"] = _drain(ctx.drain)
    hook = sys.modules.get("tpu_closure_fix.synccheck.hook")
    stream = hook._counts[id(optimizer)][0]
    ctx.result["main_stood_down"], ctx.result["main_checks"] = stream.stood_down, stream.checks
    if ctx.rank == 0:
        ctx.result["probe_stood_down"] = hook._counts[id(probe_optimizer)][0].stood_down


def _twenty_steps(ctx):
    """20 steps of a small model with the gradients all-reduced; with ``diverge`` in the variant rank 1 alone applies
    a different update at the last step (step 20)."""
    import torch

    torch.manual_seed(0)
    model = torch.nn.Linear(8, 8)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.ones(4, 8)
    for step in range(1, 21):
        optimizer.zero_grad()
        model(x).sum().backward()
        all_reduce_grads(list(model.parameters()), ctx.world)
        if step == 20 and ctx.rank == 1 and "diverge" in ctx.variant:
            model.weight.grad[0, 0] += 1.0
        optimizer.step()


def last_step(ctx):
    """(b'') 20 steps, a check every 10 (armed by the test); ``--variant diverge``: rank 1 alone applies a
    different last update at step 20. Then a barrier and the job's end: ``destroy_process_group`` (the
    default), or with ``--variant exit`` none, the interpreter exiting normally (its exit hooks run);
    ``slow``: rank 1 ends 1 s later (saving a checkpoint)."""
    import torch.distributed as dist

    _twenty_steps(ctx)
    dist.barrier()
    if "slow" in ctx.variant and ctx.rank == 1:
        time.sleep(1)
    ctx.barrier = False
    if "exit" in ctx.variant:
        ctx.exit_normally = True  # the checks are answered by the interpreter's exit hooks, after the result
        return
    dist.destroy_process_group()
    ctx.result["destroyed"] = True


def plain(ctx):
    """(c) A plain torch.distributed script: no framework, no ``import tpu_closure_fix``; gradients all-reduced
    (``--variant reduce``) or not (default)."""
    import torch

    model = make_model(0)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(1, 13):
        train_step(model, optimizer, *batch(ctx.rank, step), reduce=ctx.variant == "reduce", world=ctx.world)
    ctx.result["pythonpath"] = os.environ.get("PYTHONPATH", "")
    ctx.result["sync_check_var"] = os.environ.get("TPU_CLOSURE_FIX_SYNC_CHECK")


def seeded(ctx):
    """(d) check_sync(every=5) on four correct loops, called with step 0 before the first step as documented:
    models seeded by rank, declared replicas (``replicas="world"``, "by-rank") and not ("by-rank-auto"), the
    same seed ("same"), the same seed with rank 1 perturbing a weight after step 3 ("perturbed")."""
    import torch

    from tpu_closure_fix import check_sync

    for case, seed, replicas in (("by-rank", ctx.rank, "world"), ("by-rank-auto", ctx.rank, "auto"),
                                 ("same", 0, "auto"), ("perturbed", 0, "auto")):
        model = make_model(seed)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        ctx.keep(check_sync(model, 0, every=5, replicas=replicas), "%s@0" % case)
        for step in range(1, 6):
            train_step(model, optimizer, *batch(ctx.rank, step), reduce=True, world=ctx.world)
            if case == "perturbed" and step == 3 and ctx.rank == 1:
                with torch.no_grad():
                    model[2].weight[0, 0] += 1e-3
            report = check_sync(model, step, every=5, replicas=replicas)
            if report is not None:
                ctx.keep(report, "%s@%d" % (case, step))


def dtensor(ctx):
    """(e) A 2x2 (dp, tp) mesh: ``w`` sharded over tp, ``b`` replicated."""
    import torch
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    from tpu_closure_fix import compare_replicas

    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    torch.manual_seed(0)
    full_w, full_b = torch.randn(4, 6), torch.randn(6)
    w = torch.nn.Parameter(distribute_tensor(full_w, mesh, [Replicate(), Shard(0)]))
    b = torch.nn.Parameter(distribute_tensor(full_b, mesh, [Replicate(), Replicate()]))
    ctx.result["coordinate"] = list(mesh.get_coordinate())
    ctx.result["w_local"] = w.to_local().detach().reshape(-1).tolist()
    ctx.result["types"] = [type(w).__name__, type(b).__name__]
    plain_shard = {"w_local": w.to_local().detach().clone()}
    ctx.keep(compare_replicas(plain_shard, replicas="world"), "local-shards-as-plain")
    ctx.keep(compare_replicas({"w": w, "b": b}), "dict")
    ctx.keep(compare_replicas([("w", w), ("b", b)]), "list")
    if ctx.rank == 2:  # dp replica 1 of tp shard 0
        with torch.no_grad():
            w._local_tensor[0, 0] += 1.0
    ctx.keep(compare_replicas({"w": w, "b": b}), "changed")


def neuron(ctx):
    """(f) neuronx-distributed style TP 2 x DP 2: the double's parallel_state, patched to report tensor
    parallel size 2 and data-parallel replica groups [[0, 2], [1, 3]]."""
    import torch

    from support import neuron_sdk

    from tpu_closure_fix import compare_replicas

    neuron_sdk.install(ctx.world, ctx.rank)
    state = sys.modules[NEURON_STATE]
    tp = 2
    groups = [[r for r in range(ctx.world) if r % tp == t] for t in range(tp)]
    state.get_tensor_model_parallel_size = lambda: tp
    state.get_tensor_model_parallel_rank = lambda: ctx.rank % tp
    state.get_data_parallel_size = lambda: ctx.world // tp
    state.get_data_parallel_rank = lambda: ctx.rank // tp
    state.get_data_parallel_replica_groups = lambda: [list(g) for g in groups]
    torch.manual_seed(0)
    full, bias = torch.randn(4, 6), torch.randn(6)
    shard = full.chunk(tp)[ctx.rank % tp].clone()
    ctx.result["groups"] = groups
    named = {"shard": shard, "bias": bias}
    ctx.keep(compare_replicas(named), "tp")
    state.model_parallel_is_initialized = lambda: False  # no parallel state: compared over the whole world
    ctx.keep(compare_replicas(named, replicas="world"), "no-parallel-state")
    state.model_parallel_is_initialized = lambda: True
    if ctx.rank == 3:  # dp replica 1 of tp rank 1
        shard[0, 0] += 1.0
    ctx.keep(compare_replicas(named), "changed")


def optimizer(ctx):
    """(g) compare_replicas of optimizers (differing and agreeing replicas) and of an exhausted generator."""
    import torch

    from tpu_closure_fix import compare_replicas

    model = make_model(0)
    if ctx.rank == 1:
        with torch.no_grad():
            model[0].weight[0, 0] += 1e-3
    differing = torch.optim.SGD(model.parameters(), lr=0.1)
    ctx.keep(compare_replicas(differing, replicas="world"), "differing")
    generator = (p for p in model.parameters())
    ctx.result["exhausted"] = len(list(generator))
    ctx.keep(compare_replicas(generator), "exhausted-generator")
    agreeing = torch.optim.SGD(make_model(0).parameters(), lr=0.1)
    ctx.keep(compare_replicas(agreeing), "agreeing")


class OutOfData(Exception):
    pass


def lbfgs(ctx):
    """(h) LBFGS (gradients and loss all-reduced in the closure) on 2 batches: its closure raises at step 3;
    the script goes on with SGD for 10 steps, without the gradient all-reduce (``--variant reduce``: with)."""
    import torch
    import torch.distributed as dist

    model = make_model(0)
    params = list(model.parameters())
    lbfgs_optimizer = torch.optim.LBFGS(params, lr=0.1, max_iter=1)
    data = iter([batch(ctx.rank, s) for s in (1, 2)])
    done = 0
    for step in range(1, 5):
        def closure():
            try:
                x, y = next(data)
            except StopIteration:
                raise OutOfData("out of data at step %d" % step)
            lbfgs_optimizer.zero_grad()
            loss = torch.nn.functional.mse_loss(model(x), y)
            loss.backward()
            all_reduce_grads(params, ctx.world)
            total = loss.detach().clone()
            dist.all_reduce(total)
            return total / ctx.world

        try:
            lbfgs_optimizer.step(closure)
            done += 1
        except OutOfData as exc:
            ctx.result["caught"] = str(exc)
            break
    ctx.result["lbfgs_steps"] = done
    sgd = torch.optim.SGD(params, lr=0.1)
    for step in range(1, 11):
        train_step(model, sgd, *batch(ctx.rank, 10 + step), reduce=ctx.variant == "reduce", world=ctx.world)
    hook = sys.modules["tpu_closure_fix.synccheck.hook"]
    _drain(60)  # the checks are answered off the training thread
    ctx.result["lbfgs_checks"] = hook._counts[id(lbfgs_optimizer)][0].checks
    ctx.result["sgd_checks"] = hook._counts[id(sgd)][0].checks


def many(ctx):
    """(i) 3,000 tensors; then rank 1 changes one of them (t1234)."""
    import torch

    from tpu_closure_fix import compare_replicas

    base = torch.randn(3000, 3, generator=torch.Generator().manual_seed(0))
    named = [("t%d" % k, base[k].clone()) for k in range(3000)]
    ctx.keep(compare_replicas(named, replicas="world"), "same")
    if ctx.rank == 1:
        named[1234][1][1] += 1e-3
    ctx.keep(compare_replicas(named, replicas="world"), "one-differs")


def killed(ctx):
    """(j) A correct loop of 12 steps; the rank told ``--kill`` dies (os._exit(1)) right before its check at
    step 5 (in its optimizer's own post-hook, which torch runs before the global ones)."""
    import torch

    model = make_model(0)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    count = [0]

    def die_before_check(opt, args, kwargs):
        count[0] += 1
        if ctx.kill and count[0] == 5:
            sys.stderr.write("rank %d: os._exit(1) before the check at step 5\n" % ctx.rank)
            sys.stderr.flush()
            os._exit(1)

    optimizer.register_step_post_hook(die_before_check)
    ctx.barrier = False  # a peer is gone: no final barrier
    for step in range(1, 13):
        ctx.result["step"] = step
        train_step(model, optimizer, *batch(ctx.rank, step), reduce=True, world=ctx.world)
    ctx.result["finished"] = True


def four(ctx):
    """(k) No gradient all-reduce; ranks 0..W-2 train on the same data (they stay bitwise equal), the last
    rank on its own: one rank holds another version."""
    import torch

    model = make_model(0)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    data_rank = 1 if ctx.rank == ctx.world - 1 else 0
    for step in range(1, 11):
        train_step(model, optimizer, *batch(data_rank, step), reduce=False, world=ctx.world)


def fsdp(ctx):
    """(l) FSDP1 on 4 ranks, two "hosts": HYBRID_SHARD with shard groups [0, 1], [2, 3] and replica groups
    [0, 2], [1, 3], without and with ``use_orig_params``, then FULL_SHARD. Three correct steps each (the
    zero-code check runs when armed), ``compare_replicas`` of the model, then rank 2 changes its shard."""
    import torch
    import torch.distributed as dist
    from torch.distributed.fsdp import FullyShardedDataParallel, ShardingStrategy

    from tpu_closure_fix import compare_replicas

    shard_groups = [dist.new_group([0, 1]), dist.new_group([2, 3])]
    replica_groups = [dist.new_group([0, 2]), dist.new_group([1, 3])]
    hybrid = (shard_groups[ctx.rank // 2], replica_groups[ctx.rank % 2])
    # "subgroup": NO_SHARD within each host only (beside another parallelism): the hosts train on their own
    # data, so they differ by design; the ranks of a host agree
    cases = [("hybrid", ShardingStrategy.HYBRID_SHARD, False), ("hybrid-orig", ShardingStrategy.HYBRID_SHARD, True),
             ("full", ShardingStrategy.FULL_SHARD, False), ("subgroup", ShardingStrategy.NO_SHARD, False)]
    groups = {"hybrid": hybrid, "hybrid-orig": hybrid, "full": None, "subgroup": shard_groups[ctx.rank // 2]}
    for case, strategy, orig in cases:
        model = FullyShardedDataParallel(make_model(0), process_group=groups[case],
                                         sharding_strategy=strategy, device_id=torch.device("cpu"),
                                         use_orig_params=orig)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        data_rank = ctx.rank // 2 if case == "subgroup" else ctx.rank
        for step in range(1, 4):
            train_step(model, optimizer, *batch(data_rank, step), reduce=False, world=ctx.world)
        ctx.result[case] = [[name, list(p.shape)] for name, p in model.named_parameters()]
        ctx.keep(compare_replicas(model), case)
        held = [p for p in model.parameters() if p.numel() > 0][0]
        ctx.keep(compare_replicas({"local": held.detach().clone()}, replicas="world"), case + "-as-plain")
        if ctx.rank == 2:
            with torch.no_grad():
                held.view(-1)[0] += 1.0
        train_step(model, optimizer, *batch(data_rank, 4), reduce=False, world=ctx.world)
        ctx.keep(compare_replicas(model), case + "-changed")
        ctx.result[case + "-changed"] = [name for name, p in model.named_parameters() if p is held]
        hook = sys.modules.get("tpu_closure_fix.synccheck.hook")
        _drain(60)  # the checks are answered off the training thread
        if hook is not None and id(optimizer) in hook._counts:  # gone with the optimizer: read it now
            stream, steps = hook._counts[id(optimizer)]
            ctx.result[case + "-stream"] = {"checks": stream.checks, "steps": steps[0],
                                            "stood_down": stream.stood_down}


def pipeline(ctx):
    """(m) Pipeline parallelism on 2 ranks: rank 0 holds stage 0, rank 1 stage 1, layers of the same shapes
    (seeded per stage: they differ by design); activations and their gradients go point to point. Three
    correct steps (``--steps``), each stage's optimizer stepping its own stage."""
    import torch
    import torch.distributed as dist

    torch.manual_seed(100 + ctx.rank)
    stage = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Tanh())
    optimizer = torch.optim.SGD(stage.parameters(), lr=0.1)
    for step in range(1, ctx.steps + 1):
        x, y = batch(0, step)
        optimizer.zero_grad()
        if ctx.rank == 0:
            out = stage(x)
            dist.send(out.detach(), 1)
            grad = torch.empty_like(out)
            dist.recv(grad, 1)
            out.backward(grad)
        else:
            inp = torch.empty(16, 8)
            dist.recv(inp, 0)
            inp.requires_grad_(True)
            torch.nn.functional.mse_loss(stage(inp)[:, :4], y).backward()
            dist.send(inp.grad, 0)
        optimizer.step()
        ctx.result["steps"] = step


def zero(ctx):
    """(n) A ZeRO-1 style optimizer on 2 ranks: the model replicated, gradients all-reduced, an inner Adam
    stepping this rank's own flat shard of the parameters (equal sizes), the shards all-gathered back into
    the model. ``--steps`` correct steps."""
    import torch
    import torch.distributed as dist

    model = make_model(0)
    params = list(model.parameters())
    flat = torch.cat([p.detach().reshape(-1) for p in params])
    size = flat.numel() // ctx.world
    shard = torch.nn.Parameter(flat[ctx.rank * size:(ctx.rank + 1) * size].clone())
    inner = torch.optim.Adam([shard], lr=0.01)
    for step in range(1, ctx.steps + 1):
        model.zero_grad()
        torch.nn.functional.mse_loss(model(batch(ctx.rank, step)[0]), batch(ctx.rank, step)[1]).backward()
        all_reduce_grads(params, ctx.world)
        grads = torch.cat([p.grad.reshape(-1) for p in params])
        shard.grad = grads[ctx.rank * size:(ctx.rank + 1) * size].clone()
        inner.step()
        pieces = [torch.empty(size) for _ in range(ctx.world)]
        dist.all_gather(pieces, shard.detach())
        merged = torch.cat(pieces)
        with torch.no_grad():
            offset = 0
            for p in params:
                n = min(p.numel(), max(0, merged.numel() - offset))
                p.view(-1)[:n].copy_(merged[offset:offset + n])
                offset += n
        ctx.result["steps"] = step


def ddp_groups(ctx):
    """(o) DDP on the subgroups {0, 1} and {2, 3} (``process_group=``), each subgroup training on its own data:
    the subgroups differ by design, the ranks of one agree. Three steps (the zero-code check runs when armed),
    ``compare_replicas`` of the DDP module and of copies of its parameters (no DDP holds them: no evidence of
    the subgroups), declared replicas over the world and not declared, then rank 3 changes a weight. Last, a
    DDP module over the whole world and a bare model, each changed on rank 1 before its first check:
    ``check_sync(..., on_divergence="raise")`` at step 0 (DDP is a declared layout; calling check_sync declares the
    bare model)."""
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    from tpu_closure_fix import check_sync, compare_replicas
    from tpu_closure_fix.synccheck import ReplicaDivergenceError

    subgroups = [dist.new_group([0, 1]), dist.new_group([2, 3])]
    model = DistributedDataParallel(make_model(0), process_group=subgroups[ctx.rank // 2])
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(1, 4):
        train_step(model, optimizer, *batch(ctx.rank // 2, step), reduce=False, world=ctx.world)
    ctx.keep(compare_replicas(model), "agree")
    copies = {n: p.detach().clone() for n, p in model.named_parameters()}
    ctx.keep(compare_replicas(copies, replicas="world"), "copies")
    ctx.keep(compare_replicas(copies), "copies-auto")
    if ctx.rank == 3:
        with torch.no_grad():
            model.module[2].weight[0, 0] += 1e-3
    ctx.keep(compare_replicas(model), "changed")
    fresh = DistributedDataParallel(make_model(0))  # its constructor broadcast rank 0's parameters
    bare = make_model(0)
    if ctx.rank == 1:
        with torch.no_grad():
            fresh.module[0].bias[0] += 1.0
            bare[0].bias[0] += 1.0
    for case, started in (("ddp-started-different", fresh), ("bare-started-different", bare)):
        try:
            ctx.keep(check_sync(started, 0, on_divergence="raise"), case)
        except ReplicaDivergenceError as exc:
            ctx.keep(exc.report, case)
            ctx.result[case + "-raised"] = True


def fsdp2(ctx):
    """(p) FSDP2 ``fully_shard`` over 2 ranks and a ``[Shard(0)]`` DTensor: every tensor a shard of its own."""
    import torch
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import Shard, distribute_tensor

    from tpu_closure_fix import compare_replicas

    model = make_model(0)
    fully_shard(model)
    ctx.result["types"] = sorted({type(p).__name__ for p in model.parameters()})
    ctx.keep(compare_replicas(model), "fully-shard")
    mesh = init_device_mesh("cpu", (ctx.world,))
    w = distribute_tensor(torch.randn(4, 6, generator=torch.Generator().manual_seed(0)), mesh, [Shard(0)])
    ctx.keep(compare_replicas({"w": w}), "shard0")


def scale(ctx):
    """(q) 20,000 tiny tensors, every one different on each rank."""
    import torch

    from tpu_closure_fix import compare_replicas

    named = [("t%d" % k, torch.full((2,), float(ctx.rank))) for k in range(20000)]
    ctx.keep(compare_replicas(named, replicas="world"), "all-differ")


def kinds(ctx):
    """(r) One sparse and three dense tensors (agreeing, then rank 1 changes a dense one); a meta tensor alone."""
    import torch

    from tpu_closure_fix import compare_replicas

    dense = make_model(0)
    named = [("embedding.weight", torch.eye(4).to_sparse())] + list(dense.named_parameters())[:3]
    ctx.keep(compare_replicas(named, replicas="world"), "sparse-agree")
    if ctx.rank == 1:
        with torch.no_grad():
            dense[0].bias[0] += 1.0
    ctx.keep(compare_replicas(named, replicas="world"), "sparse-changed")
    ctx.keep(compare_replicas({"w": torch.zeros(3, device="meta")}), "meta")


def gan(ctx):
    """(s) Two optimizers over models of the same shapes (a GAN's generator and discriminator); the
    discriminator's gradients are not all-reduced (``--variant twin``: they are): it alone diverges."""
    import torch

    class GAN(torch.nn.Module):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.generator = torch.nn.Sequential()
            self.generator.add_module("fc", torch.nn.Linear(4, 4))
            self.discriminator = torch.nn.Sequential()
            self.discriminator.add_module("fc", torch.nn.Linear(4, 4))

    net = GAN()
    optimizers = [torch.optim.SGD(m.parameters(), lr=0.1) for m in (net.generator, net.discriminator)]
    for step in range(1, 3):
        for module, optimizer, reduce in zip((net.generator, net.discriminator), optimizers,
                                             (True, ctx.variant == "twin")):
            x, y = batch(ctx.rank, step)
            train_step(module, optimizer, x[:, :4], y, reduce=reduce, world=ctx.world)


def _one_node_per_rank(ctx):
    """What Lightning's default cluster environment reads when each process is a node of one device (the
    process group is already joined: Lightning leaves it as it is)."""
    os.environ.update(LOCAL_RANK="0", NODE_RANK=str(ctx.rank), WORLD_SIZE=str(ctx.world), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(ctx.port))


def _perturbed_on_rank_1(ctx, module):
    import torch

    if ctx.rank == 1:
        with torch.no_grad():
            next(iter(module.parameters())).view(-1)[0] += 1.0


def fabric_ddp(ctx):
    """(t) Fabric (the target's lightning_fabric) with its DDP strategy, one device per process: ``fabric.setup``
    wraps the model in DistributedDataParallel (whose constructor broadcast rank 0's parameters); then rank 1
    changes a weight before the first ``check_sync(model, 0, on_divergence="raise")``. ``--variant bare``: the
    same model, not set up (no DDP around it: nothing declared)."""
    import torch
    from lightning_fabric import Fabric

    from tpu_closure_fix import check_sync
    from tpu_closure_fix.synccheck import ReplicaDivergenceError

    _one_node_per_rank(ctx)
    fabric = Fabric(accelerator="cpu", devices=1, num_nodes=ctx.world, strategy="ddp")
    fabric.launch()
    model = make_model(0)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    if ctx.variant != "bare":
        model, optimizer = fabric.setup(model, optimizer)
    ctx.result["strategy"] = type(fabric.strategy).__name__
    _perturbed_on_rank_1(ctx, model)
    try:
        ctx.keep(check_sync(model, 0, on_divergence="raise"), "step-0")
    except ReplicaDivergenceError as exc:
        ctx.keep(exc.report, "step-0")
        ctx.result["raised"] = True


def trainer_ddp(ctx):
    """(u) The Lightning Trainer (the target's pytorch_lightning) with ``strategy="ddp"``, one device per process
    and ``SyncCheck(on_divergence="raise")``; rank 1 changes a weight in ``on_fit_start`` (after the DDP wrapping,
    before the callback's first check). ``--variant single``: one device, no DDP strategy (nothing declared)."""
    import torch
    import pytorch_lightning as pl

    from tpu_closure_fix import SyncCheck
    from tpu_closure_fix.synccheck import ReplicaDivergenceError

    _one_node_per_rank(ctx)

    class Module(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = make_model(0)

        def on_fit_start(self):
            _perturbed_on_rank_1(ctx, self)

        def training_step(self, batch, batch_idx):
            return torch.nn.functional.mse_loss(self.net(batch[0]), batch[1])

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    data = [batch(ctx.rank, step) for step in range(1, 4)]
    check = SyncCheck(every=1, on_divergence="raise")
    ddp = ctx.variant != "single"
    trainer = pl.Trainer(accelerator="cpu", devices=1, num_nodes=ctx.world if ddp else 1,
                         strategy="ddp" if ddp else None, max_epochs=1, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False, callbacks=[check],
                         replace_sampler_ddp=False)
    ctx.result["strategy"] = type(trainer.strategy).__name__
    try:
        trainer.fit(Module(), train_dataloaders=torch.utils.data.DataLoader(data, batch_size=None))
    except ReplicaDivergenceError:
        ctx.result["raised"] = True
    for report in check.reports:
        ctx.keep(report, "step-%d" % report.step)


def _rss_kib():
    with open("/proc/self/statm") as handle:
        return int(handle.read().split()[1]) * (os.sysconf("SC_PAGE_SIZE") // 1024)


def _threads():
    import threading

    return sorted(t.name for t in threading.enumerate() if t.is_alive())


def endurance(ctx):
    """(v) A tiny correct model for ``--steps`` steps (the check armed at every step by the test): resident
    memory after a tenth of the steps and at the end; then a forked child reports whether it has the check's
    worker; then the job destroys its process group, which releases the worker and the check's group. The
    function is bound by name before the first check, as a script's ``from torch.distributed import
    destroy_process_group`` binds it (the shim armed at start-up, when torch was imported)."""
    import torch
    from torch.distributed import destroy_process_group

    from tpu_closure_fix.synccheck import comm, worker

    torch.manual_seed(0)
    model = torch.nn.Linear(2, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.ones(4, 2), torch.zeros(4, 1)
    for step in range(1, ctx.steps + 1):
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        optimizer.step()
        if step == ctx.steps // 10:
            ctx.result["rss_kib_early"] = _rss_kib()
    ctx.result["drained_in_loop"] = _drain(ctx.drain)
    ctx.result["rss_kib_end"] = _rss_kib()
    ctx.result["steps"] = ctx.steps
    ctx.result["threads_before"] = _threads()
    reader, writer = os.pipe()
    child = os.fork()
    if child == 0:  # the child says what it has, and leaves at once
        os.write(writer, ("%d %d %s" % (worker.running(), len(comm._groups), ",".join(_threads()))).encode())
        os._exit(0)
    os.close(writer)
    ctx.result["fork_child"] = os.read(reader, 4096).decode()
    os.waitpid(child, 0)
    ctx.result["worker_before_destroy"] = worker.running()
    destroy_process_group()
    ctx.result["worker_after_destroy"] = worker.running()
    ctx.result["check_groups_after_destroy"] = len(comm._groups)
    ctx.result["threads_after"] = _threads()
    ctx.barrier = False  # no process group left to wait in


# --------------------------------------------------------------------------- what the check has seen, and says
def _until_raised(ctx, body, limit):
    """Run ``body(step)`` for steps 1.. until it raises or ``limit`` steps: the step reached goes to the result."""
    step = 0
    try:
        for step in range(1, limit + 1):
            body(step)
    finally:
        ctx.result["steps"] = step


def local_scale(ctx):
    """(w) A plain data-parallel loop (gradients all-reduced by hand, no DDP) whose optimizer also holds one
    1-element rank-local scale (``--variant twin``: no such scale); rank 1 alone changes ``2.weight`` after step
    30. Armed by the test (every 10, raise): the scale alone is set aside, the change is raised."""
    import torch

    model = make_model(0)
    params = list(model.parameters())
    if ctx.variant != "twin":
        model.register_parameter("scale", torch.nn.Parameter(torch.full((1,), float(ctx.rank + 1))))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)

    def body(step):
        x, y = batch(0, step)
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(model(x) * getattr(model, "scale", 1.0), y).backward()
        all_reduce_grads(params, ctx.world)
        optimizer.step()
        if step == 30 and ctx.rank == 1:
            with torch.no_grad():
                model[2].weight[0, 0] += 1.0

    _until_raised(ctx, body, ctx.steps)


def epochs(ctx):
    """(x) An optimizer built afresh at each epoch of 200 steps over the same model; from step 200 (the last of the
    first epoch) on, rank 1 no longer all-reduces its gradients (``--variant twin``: it does). Armed by the test
    (every 1000, raise): the next epoch's optimizer finds the difference at its first check, and its step where the
    ranks agree to raise falls within its epoch."""
    import torch

    model = make_model(0)
    params = list(model.parameters())
    state = {"optimizer": None}

    def body(step):
        if step % 200 == 1:
            state["optimizer"] = torch.optim.SGD(model.parameters(), lr=0.05)
        reduce = ctx.variant == "twin" or ctx.rank == 0 or step < 200
        x, y = batch(ctx.rank, step)
        optimizer = state["optimizer"]
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        if reduce:
            all_reduce_grads(params, ctx.world)
        else:
            dist_all_reduce_skipped(params, ctx.world)
        optimizer.step()

    _until_raised(ctx, body, ctx.steps)


def dist_all_reduce_skipped(params, world):
    """Rank 1's side of the all-reduce rank 0 still enters: it contributes zeros and keeps its own gradients."""
    import torch
    import torch.distributed as dist

    for p in params:
        dist.all_reduce(torch.zeros_like(p.grad))


def apart_3000(ctx):
    """(y) 3,000 one-element parameters (``p.0`` .. ``p.2999``) stepped by SGD with zero gradients; only ``p.2500``
    is rank-local. Armed by the test: one note, naming ``p.2500`` and counting 1."""
    import torch

    holder = torch.nn.Module()
    holder.p = torch.nn.ParameterList([torch.nn.Parameter(torch.full((1,), float(ctx.rank if k == 2500 else 0)))
                                       for k in range(3000)])
    optimizer = torch.optim.SGD(holder.parameters(), lr=0.1)
    for _ in range(ctx.steps):
        for p in holder.parameters():
            p.grad = torch.zeros_like(p)
        optimizer.step()


def plain_check_sync(ctx):
    """(z) The README's call for plain loops: ``check_sync(model, step)`` after each step of a loop that forgets
    the gradient all-reduce (``--variant reduce``: it does not)."""
    import torch

    from tpu_closure_fix import check_sync

    model = make_model(0)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(1, ctx.steps + 1):
        train_step(model, optimizer, *batch(ctx.rank, step), reduce=ctx.variant == "reduce", world=ctx.world)
        report = check_sync(model, step, every=5)
        if report is not None:
            ctx.keep(report, "step-%d" % step)


def muted(ctx):
    """(aa) A loop without the gradient all-reduce under the zero-code check, in a script that mutes warnings
    (``--variant filter``: ``warnings.filterwarnings("ignore")`` at its top; ``record``: the loop inside
    ``warnings.catch_warnings(record=True)``; ``plain``: nothing; ``reduce`` added: with the all-reduce);
    ``PYTHONWARNINGS``, if any, from the test."""
    import contextlib
    import warnings

    import torch

    if "filter" in ctx.variant:
        warnings.filterwarnings("ignore")
    recorded = warnings.catch_warnings(record=True) if "record" in ctx.variant else contextlib.nullcontext([])
    model = make_model(0)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with recorded as caught:
        for step in range(1, ctx.steps + 1):
            train_step(model, optimizer, *batch(ctx.rank, step), reduce="reduce" in ctx.variant, world=ctx.world)
        ctx.result["drained_in_loop"] = _drain(ctx.drain)
    ctx.result["caught"] = len(caught or [])


def repeat(ctx):
    """(bb) ``--steps`` steps of about 5 ms each without the gradient all-reduce (``--variant reduce``: with it),
    the zero-code check armed at every step by the test: one stream, a divergence at every check. Each step
    all-reduces its loss for logging, as a real job's ranks meet at every step. ``lag`` in the variant: rank 1's
    worker pauses 1.5 s before it counts in its first check (a worker on a loaded host). ``stall``: each rank's
    training waits 0.3 s before step 2 (as in a collective, for a rank held up), and rank 1's worker hands the
    agreed raise step over only once its training went 3 steps past the check (or 5 s passed); ``stall-late``: only
    once its training went past the agreed step itself (or 5 s passed)."""
    import torch
    import torch.distributed as dist

    if "lag" in ctx.variant and ctx.rank == 1:
        _lag_first_arrival(1.5)
    if "stall" in ctx.variant and ctx.rank == 1:
        _learn_the_raise_step_late(None if "late" in ctx.variant else 3)
    model = make_model(0)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(1, ctx.steps + 1):
        if "stall" in ctx.variant and step == 2:
            time.sleep(0.3)
        train_step(model, optimizer, *batch(ctx.rank, step), reduce="reduce" in ctx.variant, world=ctx.world)
        dist.all_reduce(torch.ones(1))
        time.sleep(0.005)
    ctx.result["drained_in_loop"] = _drain(ctx.drain)
    hook = sys.modules["tpu_closure_fix.synccheck.hook"]
    stream = hook._counts[id(optimizer)][0]
    ctx.result["stood_down"], ctx.result["checks"] = stream.stood_down, stream.checks


def _lag_first_arrival(seconds):
    """This rank's check worker sleeps ``seconds`` before it counts in its first check."""
    from tpu_closure_fix.synccheck import worker

    original, lagged = worker.Worker._arrive, []

    def _arrive(self, job):
        if not lagged:
            lagged.append(job)
            time.sleep(seconds)
        return original(self, job)

    worker.Worker._arrive = _arrive


def _learn_the_raise_step_late(steps):
    """This rank's check worker hands the agreed raise step to training only once training went ``steps`` steps
    past the check (None: past the agreed step itself), or 5 s passed."""
    from tpu_closure_fix.synccheck import worker

    original = worker.Worker._agree_raise_step

    def _agree_raise_step(self, job):
        agreed = original(self, job)
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            if job.pending.stream.passed >= agreed if steps is None else job.current_step() >= job.step_then + steps:
                break
            time.sleep(0.001)
        return agreed

    worker.Worker._agree_raise_step = _agree_raise_step


def ends_first(ctx):
    """(cc) A loop without the gradient all-reduce that ends after ``--steps`` steps, before the step where the
    ranks agreed to raise (armed by the test: raise); the job then ends by ``destroy_process_group``
    (``--variant destroy``) or by the interpreter's exit (``exit``); ``reduce`` in the variant: with the
    all-reduce; ``lag``: each rank's worker pauses 1 s before it counts in its first check, and the loop does not
    wait for it (the verdict is found after the training ended, by the job's end)."""
    import torch
    import torch.distributed as dist

    if "lag" in ctx.variant:
        _lag_first_arrival(1.0)
    model = make_model(0)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(1, ctx.steps + 1):
        train_step(model, optimizer, *batch(ctx.rank, step), reduce="reduce" in ctx.variant, world=ctx.world)
    if "lag" not in ctx.variant:
        ctx.result["drained_in_loop"] = _drain(ctx.drain)  # the verdict of the check at step 1 is in
    dist.barrier()
    ctx.barrier = False
    if "exit" in ctx.variant:
        ctx.exit_normally = True  # after the result is written, through the interpreter's exit
        return
    dist.destroy_process_group()
    ctx.result["destroyed"] = True


def sigterm(ctx):
    """(dd) 20 steps, a check every 10 (armed by the test); ``--variant diverge``: rank 1 alone applies a different
    last update. Then, after a barrier, each rank is sent SIGTERM (as a scheduler ends a job) and waits to be
    ended: no result is written, only stderr and the exit status tell."""
    import signal

    import torch.distributed as dist

    _twenty_steps(ctx)
    dist.barrier()
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(60)  # ended by the signal before this returns


#: The threads of this process before it made its process group.
BEFORE_GROUP = []


def guarded(ctx):
    """(ee) A DDP job (armed at every step by the test) whose process ends its run the way a test suite with a
    thread-leak guard does: every thread started since the job began must end or stop (``support.thread_guard``)."""
    import torch
    import threading
    from torch.nn.parallel import DistributedDataParallel

    from support.thread_guard import zombies

    before = list(BEFORE_GROUP)  # as a test that makes its process group (Lightning's DDP tests in rank 0's process)
    model = DistributedDataParallel(make_model(0))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(1, ctx.steps + 1):
        train_step(model, optimizer, *batch(ctx.rank, step), reduce=False, world=ctx.world)
    ctx.result["threads_started"] = sorted(t.name for t in set(threading.enumerate()) - set(before))
    ctx.result["zombies"] = zombies(before)
    hook = sys.modules["tpu_closure_fix.synccheck.hook"]
    last = hook.seen["last_report"]
    ctx.result["last_outcome"] = last.outcome if last is not None else None
    for step in range(ctx.steps + 1, ctx.steps + 4):  # a later check starts a new worker
        train_step(model, optimizer, *batch(ctx.rank, step), reduce=False, world=ctx.world)
    ctx.result["drained_after"] = _drain(ctx.drain)
    ctx.result["checks"] = hook.seen["checks"]


def _refuse_walks(ctx):
    """From here on a scan of the live objects fails: ``gc.get_objects`` raises (``result["walks"]`` counts the
    attempts). SyncCheck reads its evidence from what was recorded and what the stack holds, never from a scan."""
    import gc

    ctx.result["walks"] = 0

    def refused(*args, **kwargs):
        ctx.result["walks"] += 1
        raise RuntimeError("gc.get_objects() called: a scan of every live object")

    gc.get_objects = refused


def ddp_recorded(ctx):
    """(ff) Every scan of the live objects refused (``gc.get_objects`` raises): DDP on a group of this rank alone
    ({0} and {1}) and DDP over the world, beside a bare model, each rank training on its own data for 3 steps (the
    zero-code check runs when armed). ``compare_replicas`` of the inner module of each DDP (known to the check only
    from the DDP's construction), of the DDP itself and of the bare model. ``--variant late`` (the twin): the DDP
    modules are made before SyncCheck is first imported, so their construction is not recorded."""
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    _refuse_walks(ctx)
    alone = [dist.new_group([rank]) for rank in range(ctx.world)]
    if ctx.variant != "late":
        from tpu_closure_fix import compare_replicas  # the first import of SyncCheck: recording starts
    ctx.result["imported_before_ddp"] = "tpu_closure_fix.synccheck" in sys.modules
    model = DistributedDataParallel(make_model(0), process_group=alone[ctx.rank])
    world_model = DistributedDataParallel(make_model(0))
    from tpu_closure_fix import compare_replicas  # noqa: F811  (late: the first import, after the DDP modules)

    bare = make_model(0)
    models = (model, world_model, bare)
    optimizers = [torch.optim.SGD(m.parameters(), lr=0.1) for m in models]
    for step in range(1, 4):
        for m, optimizer in zip(models, optimizers):
            train_step(m, optimizer, *batch(ctx.rank, step), reduce=False, world=ctx.world)
    ctx.keep(compare_replicas(model.module), "alone")
    ctx.keep(compare_replicas(model), "alone-given")
    ctx.keep(compare_replicas(world_model.module), "world")
    ctx.keep(compare_replicas(bare), "bare")
    _drain(60)
    hook = sys.modules.get("tpu_closure_fix.synccheck.hook")
    streams = hook._counts if hook is not None else {}
    for case, optimizer in zip(("alone", "world", "bare"), optimizers):
        if id(optimizer) in streams:
            stream = streams[id(optimizer)][0]
            ctx.result[case + "-stream"] = {"checks": stream.checks, "stood_down": stream.stood_down,
                                            "paths": (getattr(stream, "module_paths", None) or [None])[0]}


def scheduled(ctx):
    """(gg) 41 steps with the gradient all-reduce, a check at every step (armed by the test), the last one handed to
    an idle worker; then the scheduling policy of each of this process's threads, by thread (the check's worker,
    the threads its gloo group started, the job's own gloo threads, the main thread), again after the worker's
    thread is stopped (as by a thread-leak guard) and after ``destroy_process_group``, for those still running.
    ``behind``: the worker's bounds lowered at step 20, its group made (from then on every check held is too
    many: it yields no more)."""
    import torch
    import torch.distributed as dist

    from tpu_closure_fix.synccheck import worker

    model = make_model(0)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(1, 42):
        if step == 20 and "behind" in ctx.variant:
            worker.CATCH_UP, worker.KEPT_UP = 0, -1
        train_step(model, optimizer, *batch(ctx.rank, step), reduce=True, world=ctx.world)
        if step == 40:  # the last check then comes to an idle worker: what it holds is that one check
            ctx.result["drained_in_loop"] = _drain(ctx.drain)
    _drain(ctx.drain)
    running = worker._workers["process"]
    check_group = sorted(running.group_threads())
    ctx.result["check_group"] = len(check_group)
    ctx.result["policies"] = _policies(check_group, running.thread.native_id)
    running.thread.stop()  # as a thread-leak guard stops it: the check's group lives on for the next worker
    ctx.result["after_stop"] = _policies(check_group, None)
    dist.barrier()
    ctx.barrier = False
    dist.destroy_process_group()
    ctx.result["after_destroy"] = _policies(check_group, None)


def _policies(check_group, worker_tid):
    """{thread kind: sorted policy names} of this process's threads now: ``worker``, ``check-group`` (the ids
    given), ``gloo`` (other gloo threads: the job's), ``main``."""
    names = {os.SCHED_OTHER: "OTHER", os.SCHED_BATCH: "BATCH"}
    found = {}
    for tid in (int(t) for t in os.listdir("/proc/self/task")):
        try:
            with open("/proc/self/task/%d/comm" % tid) as name:
                comm = name.read().strip()
            policy = names.get(os.sched_getscheduler(tid), "other")
        except OSError:  # ended meanwhile
            continue
        kind = ("worker" if tid == worker_tid else "check-group" if tid in check_group else
                "main" if tid == threading.main_thread().native_id else
                "gloo" if comm in ("gloo_tcp_loop", "pt_gloo_runloop") else None)
        if kind is not None:
            found.setdefault(kind, []).append(policy)
    return {kind: sorted(found[kind]) for kind in found}


SCENARIOS = {"fabric-ddp": fabric_ddp, "trainer-ddp": trainer_ddp,
             "pipeline": pipeline, "zero": zero, "ddp-groups": ddp_groups, "fsdp2": fsdp2, "scale": scale,
             "kinds": kinds, "gan": gan, "probe": probe, "endurance": endurance, "probe-optimizer": probe_optimizer,
             "probe-first": probe_first, "last-step": last_step, "plain": plain,
             "seeded": seeded,
             "dtensor": dtensor, "neuron": neuron, "optimizer": optimizer, "lbfgs": lbfgs, "many": many,
             "killed": killed, "four": four, "fsdp": fsdp, "local-scale": local_scale, "epochs": epochs,
             "apart-3000": apart_3000, "plain-check-sync": plain_check_sync, "muted": muted, "repeat": repeat,
             "ends-first": ends_first, "sigterm": sigterm, "guarded": guarded, "ddp-recorded": ddp_recorded,
             "scheduled": scheduled}


def _drain(seconds):
    """Wait at most ``seconds`` for the zero-code check's worker to answer every check handed to it: what
    the result says about the checks is then final. True when nothing is left (or no worker runs)."""
    worker = sys.modules.get("tpu_closure_fix.synccheck.worker")
    return True if worker is None else worker.drain(seconds)


def _module_file(name):
    return getattr(sys.modules.get(name), "__file__", None)


def main(argv=None):
    parser = argparse.ArgumentParser(description="one rank of a SyncCheck pod scenario")
    parser.add_argument("--scenario", choices=sorted(SCENARIOS), required=True)
    parser.add_argument("--rank", type=int, required=True)
    parser.add_argument("--world", type=int, required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--variant", default="")
    parser.add_argument("--kill", action="store_true")
    parser.add_argument("--steps", type=int, default=12, help="optimizer steps of the loops that take a count")
    parser.add_argument("--drain", type=float, default=60.0,
                        help="seconds to wait at the end for the checks still being exchanged")
    parser.add_argument("--pg-timeout", type=float, default=60.0, help="the process group's timeout (seconds)")
    args = parser.parse_args(argv)
    _record_warnings()
    if args.scenario != "plain":
        import tpu_closure_fix  # noqa: F401  (the top of a user's script)
    import torch
    import torch.distributed as dist

    from support import ranks

    torch.set_num_threads(1)
    BEFORE_GROUP[:] = threading.enumerate()  # a guarded test's threads: the process group is made inside it
    ranks.join_gloo(args.rank, args.world, args.port, timeout=args.pg_timeout)
    _show_ours()
    ctx = Context(args)
    error = None
    try:
        SCENARIOS[args.scenario](ctx)
    except Exception as exc:
        error = "%s: %s" % (type(exc).__name__, str(exc).splitlines()[0] if str(exc) else "")
    ctx.result["trained_seconds"] = round(time.monotonic() - T0, 3)
    ctx.result["drained"] = _drain(args.drain)
    payload = {"rank": args.rank, "world": args.world, "scenario": args.scenario, "variant": args.variant,
               "warnings": SEEN, "reports": ctx.reports, "hook": hook_state(), "error": error, "result": ctx.result,
               "modules": {"tpu_closure_fix": _module_file("tpu_closure_fix"),
                           "_tpu_closure_fix_startup": _module_file("_tpu_closure_fix_startup")},
               "seconds": round(time.monotonic() - T0, 2)}
    ranks.write_result(args.out, payload, default=str)
    if ctx.barrier and error is None:
        try:
            dist.barrier()
        except Exception:
            pass
    if ctx.exit_normally:
        sys.stdout.flush()
        sys.exit(0 if error is None else 3)
    ranks.leave(0 if error is None else 3)


if __name__ == "__main__":
    if __package__ in (None, ""):  # run as a script: this folder is sys.path[0]; the tests folder must serve
        tests = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        if tests not in sys.path:
            sys.path.append(tests)
    main()
