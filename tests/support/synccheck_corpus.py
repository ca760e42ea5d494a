"""A corpus of replica divergence kinds for SyncCheck's comparison, each with its "identical" twin.

Every kind builds, on each replica, the parameters a replica would hold: ``build(rank, world, twin)``
returns a list of ``(name, tensor)``. The divergent version differs across the replicas the way the
kind says; the twin is what correctly synchronised replicas hold (bitwise the same everywhere). The
oracle is independent of the fingerprint: the SHA-256 of every tensor's bytes, shape and dtype,
gathered from all replicas (``torch.distributed.all_gather_object``).

Run as a replica process (``python -m support.synccheck_corpus --rank R --world W --port P --backend
gloo|xla-standin --out FILE``): every kind and twin goes through ``compare_replicas`` once -- the
first check -- over torch.distributed (gloo) or through the XLA host channel on the torch_xla stand-in
(whose ``xm.all_reduce`` / ``xm.all_gather`` are delegated to gloo). The stand-in needs a process group
for its collectives, and with a process group initialised SyncCheck uses torch.distributed (its own gloo
group) even when torch_xla is imported: the result file records that choice (``default_backend``), then
the XLA host channel is pinned for the cases. The result file holds, per case, the report and the oracle's
verdict. tests/unit/test_synccheck_replicas.py starts the replicas and asserts.
"""
import argparse
import hashlib
import json
import os
import sys

import torch

#: Perturbation kinds change the last replica only: "one replica of N differs".
CLASSES = 10


def _last(rank, world):
    return rank == world - 1


def _bump_ulp(tensor, index):
    """``tensor`` with element ``index`` (flat) moved to the next representable value (one ulp)."""
    out = tensor.detach().clone().reshape(-1)
    bits = {4: torch.int32, 2: torch.int16, 8: torch.int64}[out.element_size()]
    out.view(bits)[index] += 1
    return out.reshape(tensor.shape)


def _base(shape, dtype=torch.float32, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=gen).to(dtype)


# --------------------------------------------------------------------------- training kinds
def _train(rank, world, reduce, optimizer, head=False, steps=1):
    """Parameters after ``steps`` steps of data-parallel training on each replica's own batch; the
    gradients are mean all-reduced (``reduce``) or not (the missing all-reduce)."""
    import torch.distributed as dist

    torch.manual_seed(0)
    if head:  # a linear classifier head on frozen features (softmax cross-entropy)
        model = torch.nn.Linear(16, CLASSES)
    else:
        model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, CLASSES))
    make = {"sgd": lambda p: torch.optim.SGD(p, lr=0.1),
            "momentum": lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9),
            "adam": lambda p: torch.optim.Adam(p, lr=1e-3)}[optimizer]
    opt = make(model.parameters())
    gen = torch.Generator().manual_seed(100 + rank)
    x = torch.randn(32, 16 if head else 8, generator=gen)
    y = torch.randint(0, CLASSES, (32,), generator=gen)
    for _ in range(steps):
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        if reduce:
            for p in model.parameters():
                dist.all_reduce(p.grad)
                p.grad.mul_(1.0 / world)
        opt.step()
    return list(model.named_parameters())


def _trained(optimizer, head=False):
    def build(rank, world, twin):
        return _train(rank, world, reduce=twin, optimizer=optimizer, head=head)
    return build


# --------------------------------------------------------------------------- perturbation kinds
def _sum_preserving(rank, world, twin):
    w = torch.randint(-64, 64, (4, 5), generator=torch.Generator().manual_seed(1)).float() / 8
    if not twin and _last(rank, world):
        w[0, 0] += 0.25  # +e on one element, -e on another: exact in float32, the sum is unchanged
        w[1, 1] -= 0.25
    return [("w", w), ("b", _base(5, seed=2))]


def _one_ulp(dtype):
    def build(rank, world, twin):
        w = _base((6, 7), dtype)
        if not twin and _last(rank, world):
            w = _bump_ulp(w, 17)
        return [("a", _base(3, dtype, seed=3)), ("w", w)]
    return build


def _rows_permuted(rank, world, twin):
    w = _base((4, 6))
    if not twin and _last(rank, world):
        w = w[[1, 0, 2, 3]]
    return [("w", w)]


def _large_tensor(rank, world, twin):
    """More words than one CPU chunk (fingerprint.CHUNK): the difference sits in the second chunk."""
    w = _base((1536, 1024))
    if not twin and _last(rank, world):
        w = _bump_ulp(w, 1536 * 1024 - 5)
    return [("big", w)]


def _many_tensors(rank, world, twin):
    """More tensors than fingerprint slots: several tensors share a slot (t1050 shares slot 26 with t26),
    yet the differing tensor is named exactly."""
    tensors = [("t%d" % k, _base(3, seed=k)) for k in range(1100)]
    if not twin and _last(rank, world):
        tensors[1050] = ("t1050", _bump_ulp(tensors[1050][1], 1))
    return tensors


def _nonfinite(rank, world, twin):
    """Twin: the same NaN and inf on every replica (not a divergence). Divergent: a NaN on the last
    replica only."""
    w = _base((3, 3))
    if twin or _last(rank, world):
        w[1, 1] = float("nan")
    if twin:
        w[2, 0] = float("inf")
    return [("w", w), ("b", _base(3, seed=4))]


# --------------------------------------------------------------------------- structure kinds
def _count(rank, world, twin):
    tensors = [("a", _base(3)), ("b", _base((2, 2), seed=1))]
    if not twin and _last(rank, world):
        tensors.append(("c", _base(4, seed=2)))
    return tensors


def _shape(rank, world, twin):
    shape = (4, 3) if not twin and _last(rank, world) else (3, 4)
    return [("a", _base(5)), ("w", _base(shape, seed=1))]


def _dtype(rank, world, twin):
    dtype = torch.float64 if not twin and _last(rank, world) else torch.float32
    return [("a", _base(5)), ("w", _base((3, 4), dtype, seed=1))]


def _no_parameters(rank, world, twin):
    """The last replica holds no parameters (it still joins), or (twin) none anywhere: nothing can be
    compared on that replica, so the check is "unverified" either way -- never "identical" unseen."""
    if twin or _last(rank, world):
        return []
    return [("a", _base(3))]


#: name -> (build, outcome of the divergent version); every twin's outcome is "identical", but the
#: non-finite kind's twin ("nonfinite") and the no-parameters kind's twin ("unverified").
KINDS = {
    "no-allreduce-sgd": (_trained("sgd"), "differ"),
    "no-allreduce-momentum": (_trained("momentum"), "differ"),
    "no-allreduce-adam": (_trained("adam"), "differ"),
    "linear-head": (_trained("sgd", head=True), "differ"),
    "sum-preserving": (_sum_preserving, "differ"),
    "one-ulp-float32": (_one_ulp(torch.float32), "differ"),
    "one-ulp-float64": (_one_ulp(torch.float64), "differ"),
    "one-ulp-bfloat16": (_one_ulp(torch.bfloat16), "differ"),
    "one-ulp-float16": (_one_ulp(torch.float16), "differ"),
    "rows-permuted": (_rows_permuted, "differ"),
    "large-tensor": (_large_tensor, "differ"),
    "many-tensors": (_many_tensors, "differ"),
    "nonfinite": (_nonfinite, "differ"),
    "structure-count": (_count, "structure"),
    "structure-shape": (_shape, "structure"),
    "structure-dtype": (_dtype, "structure"),
    "no-parameters": (_no_parameters, "unverified"),
}
TWIN_OUTCOME = {"nonfinite": "nonfinite", "no-parameters": "unverified"}


# --------------------------------------------------------------------------- the oracle
def _digest(tensor):
    t = tensor.detach().contiguous().reshape(-1)
    return hashlib.sha256(bytes(t.view(torch.uint8).tolist())).hexdigest()  # torch only: no numpy here


def _gather_json(obj):
    """Every replica's ``obj`` (JSON), gathered as bytes: all_gather_object needs numpy, absent here."""
    import torch.distributed as dist

    world = dist.get_world_size()
    data = torch.tensor(list(json.dumps(obj).encode("utf-8")), dtype=torch.uint8)
    sizes = [torch.zeros(1, dtype=torch.int64) for _ in range(world)]
    dist.all_gather(sizes, torch.tensor([data.numel()]))
    longest = max(int(n) for n in sizes)
    buffers = [torch.zeros(longest, dtype=torch.uint8) for _ in range(world)]
    dist.all_gather(buffers, torch.cat([data, torch.zeros(longest - data.numel(), dtype=torch.uint8)]))
    return [json.loads(bytes(b[:int(n)].tolist()).decode("utf-8")) for b, n in zip(buffers, sizes)]


def oracle(named):
    """What the replicas hold, gathered from all of them: the outcome a comparison must give, and the
    names of the tensors whose bytes differ."""
    import torch.distributed as dist

    mine = {"structure": [(list(t.shape), str(t.dtype)) for _, t in named],
            "bytes": [_digest(t) for _, t in named],
            "nonfinite": any(t.is_floating_point() and not bool(torch.isfinite(t).all()) for _, t in named)}
    everyone = _gather_json(mine)
    if any(not o["structure"] for o in everyone):  # a replica with nothing to compare: no verdict
        return "unverified", []
    if any(o["structure"] != everyone[0]["structure"] for o in everyone):  # compared as JSON read them
        return "structure", []
    differing = [name for k, (name, _) in enumerate(named) if len({o["bytes"][k] for o in everyone}) > 1]
    if differing:
        return "differ", differing
    return ("nonfinite" if mine["nonfinite"] else "identical"), []


def expected(kind, twin):
    return TWIN_OUTCOME.get(kind, "identical") if twin else KINDS[kind][1]


# --------------------------------------------------------------------------- the replica process
class Model(object):
    """The case's tensors as a model would give them (``named_parameters()``): an object SyncCheck keeps a
    history of checks for (a plain list gets none), so each case is its own first check."""

    def __init__(self, named):
        self.named = named

    def named_parameters(self):
        return iter(self.named)


def run_case(kind, twin, rank, world):
    from tpu_closure_fix import synccheck

    build, _ = KINDS[kind]
    named = build(rank, world, twin)
    truth, truly_differing = oracle(named)
    # every case is data-parallel replicas by construction: declared, so a difference at this first check is
    # a divergence (with nothing declared it would be the first-check rule's note: test_synccheck_rules.py)
    report = synccheck.compare_replicas(Model(named), step=1, replicas="world")
    return {"kind": kind, "twin": twin, "expected": expected(kind, twin), "oracle": truth,
            "oracle_differing": truly_differing,
            "outcome": getattr(report, "outcome", None), "diverged": None if report is None else report.diverged,
            "report": None if report is None else report.as_dict(),
            "message": None if report is None else report.message()}


def main(argv=None):
    parser = argparse.ArgumentParser(description="one SyncCheck corpus replica")
    parser.add_argument("--rank", type=int, required=True)
    parser.add_argument("--world", type=int, required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--backend", choices=("gloo", "xla-standin"), required=True)
    parser.add_argument("--kinds", default=",".join(KINDS), help="comma-separated kinds (default: all)")
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    import torch.distributed as dist

    from tpu_closure_fix.synccheck import comm

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method="tcp://127.0.0.1:%d" % args.port, rank=args.rank,
                            world_size=args.world)
    if args.backend == "xla-standin":
        from support import xla_standin

        xla_standin.configure(args.world, args.rank)
        xla_standin.install()
    default_backend = getattr(comm.channel(), "kind", None)  # with a process group: torch.distributed
    if args.backend == "xla-standin":
        import torch_xla.core.xla_model as xm

        # its own store: the one the test's process made and handed over (TPU_CLOSURE_FIX_SYNC_CHECK_CHANNEL)
        pinned = comm.HostChannel(xm, args.world)
        comm.channel = lambda timeout=None: pinned  # the path of XLA without a process group
    cases = [run_case(kind, twin, args.rank, args.world) for kind in args.kinds.split(",")
             for twin in (False, True)]
    with open(args.out, "w") as handle:
        json.dump({"rank": args.rank, "default_backend": default_backend, "cases": cases}, handle)
    dist.barrier()
    sys.stdout.flush()
    os._exit(0)  # gloo's teardown can stall a process whose peers already left


if __name__ == "__main__":
    main()
