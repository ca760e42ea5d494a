"""SyncCheck on real torch_xla (CPU PJRT, replicas as threads): what tests/xla/test_synccheck_xla.py asserts.

Run in a torch_xla environment as ``PJRT_DEVICE=CPU CPU_NUM_DEVICES=2 python -m support.synccheck_xla``;
prints one result line (``RESULT_MARK`` + JSON: ordinal -> findings). In every replica thread:

1. the fingerprint vector of tensors of every parameter dtype (f32, bf16, fp16, f64, with NaN and inf; and
   int64, int8, uint8, bool, int16 buffers: every way a tensor's bits become words on XLA),
   computed on the XLA device, against the same computed on the CPU: the exact fields (structure, bit
   hashes, non-finite counts) must be bitwise equal, the float sums close (XLA may sum in another order);
2. one ``compare_replicas`` on a model on the XLA device, traced: torch_xla's ``xm.all_reduce`` is
   wrapped to dump the pending graph of its result (IR text and HLO) and then stop, because executing
   a collective on CPU hangs (torch_xla 2.1) or aborts (2.9). The check must reach exactly one
   all-reduce of the whole fingerprint vector, and -- stopped there -- report "unverified", not crash.
"""
import json
import sys
import threading

RESULT_MARK = "TPU_CLOSURE_FIX_RESULT "
_captured = {}
_lock = threading.Lock()


class CollectiveNotExecuted(RuntimeError):
    """Raised by the tracing all_reduce after it dumped the graph: the collective never runs."""


def _tensors():
    import torch

    gen = torch.Generator().manual_seed(0)
    special = torch.tensor([float("nan"), 1.5, float("inf"), -float("inf"), -0.0])
    return [torch.randn(7, 5, generator=gen), torch.randn(300, generator=gen).to(torch.bfloat16),
            torch.randn(11, generator=gen).to(torch.float16), torch.randn(4, 4, generator=gen).double(),
            special, torch.randn(3, 1, 2, generator=gen),
            torch.randint(-2 ** 40, 2 ** 40, (6,), generator=gen),
            torch.randint(-128, 128, (9,), generator=gen).to(torch.int8),
            torch.randint(0, 256, (5,), generator=gen).to(torch.uint8), torch.randint(-3, 3, (4,), generator=gen) > 0,
            torch.randint(-2 ** 15, 2 ** 15, (3,), generator=gen).to(torch.int16)]


def _device():
    import torch_xla
    import torch_xla.core.xla_model as xm

    device = getattr(torch_xla, "device", None)  # torch_xla >= 2.5; xm.xla_device is deprecated there
    return device() if callable(device) else xm.xla_device()


def _ordinal():
    try:
        import torch_xla.runtime as xr

        return xr.global_ordinal()
    except (ImportError, AttributeError):
        import torch_xla.core.xla_model as xm

        return xm.get_ordinal()


def _fingerprint_matches(device):
    import torch

    from tpu_closure_fix.synccheck import fingerprint

    tensors = _tensors()
    # the elementwise hash on both sides: the one XLA computes on the device (a CPU vector hashes with XXH3
    # where xxhash imports, and says so in its format)
    on_cpu = fingerprint.local_vector(tensors, cpu_hash="elementwise")
    on_xla = fingerprint.local_vector([t.to(device) for t in tensors], device=device, cpu_hash="elementwise").cpu()
    _, floats, _ = fingerprint._layout(fingerprint.SLOTS)  # the exact fields come first
    hashes = [fingerprint.unsigned32(fingerprint.bit_hash(t, k)) for k, t in enumerate(tensors)]
    hashes_xla = [fingerprint.unsigned32(fingerprint.bit_hash(t.to(device), k).cpu()) for k, t in enumerate(tensors)]
    return {"length": on_xla.numel(), "expected_length": fingerprint.vector_length(),
            "exact_equal": bool(torch.equal(on_cpu[:floats], on_xla[:floats])),
            "exact_differing": (on_cpu[:floats] != on_xla[:floats]).nonzero().flatten().tolist()[:10],
            "floats_close": bool(torch.allclose(on_cpu[floats:], on_xla[floats:], rtol=1e-5, atol=1e-5)),
            "bit_hashes_cpu": hashes, "bit_hashes_xla": hashes_xla}


def _tracing_all_reduce(original):
    import torch_xla

    def all_reduce(reduce_type, inputs, *args, **kwargs):
        out = original(reduce_type, inputs, *args, **kwargs)
        tensors = [out] if not isinstance(out, list) else out
        with _lock:
            _captured[_ordinal()] = {
                "reduce_type": str(reduce_type), "input_shapes": [list(t.shape) for t in tensors],
                "ir": torch_xla._XLAC._get_xla_tensors_text(tensors),
                "hlo": torch_xla._XLAC._get_xla_tensors_hlo(tensors)}
        raise CollectiveNotExecuted("traced only: a collective cannot execute on CPU")
    return all_reduce


def _traced_check(device):
    import torch

    from tpu_closure_fix import synccheck

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.Tanh(), torch.nn.Linear(5, 3)).to(device)
    report = synccheck.compare_replicas(model, step=7)
    with _lock:
        captured = dict(_captured.get(_ordinal(), {}))
    ir, hlo = captured.pop("ir", ""), captured.pop("hlo", "")
    captured.update(
        report=None if report is None else report.as_dict(),
        ir_all_reduces=ir.count("xla::cross_replica_sum("),
        hlo_all_reduces=sum(1 for line in hlo.splitlines() if " all-reduce(" in line),
        hlo_all_reduce_lines=[line.strip()[:200] for line in hlo.splitlines() if " all-reduce(" in line][:3])
    return captured


def _wrap_all_reduce_once():
    """In the replica process (run_multiprocess starts a new one): torch_xla's all_reduce dumps, then stops."""
    import torch_xla.core.xla_model as xm

    with _lock:
        if not getattr(xm.all_reduce, "traces_only", False):
            xm.all_reduce = _tracing_all_reduce(xm.all_reduce)
            xm.all_reduce.traces_only = True


def _replica():
    import traceback

    out = {}
    try:
        _wrap_all_reduce_once()
        device = _device()
        out["ordinal"] = _ordinal()
        out["fingerprint"] = _fingerprint_matches(device)
        out["check"] = _traced_check(device)
    except Exception as exc:  # reported to the test, with the reason
        out["error"] = "%s: %s\n%s" % (type(exc).__name__, exc, traceback.format_exc()[-2000:])
    return out


def main():
    from torch_xla._internal import pjrt

    results = pjrt.run_multiprocess(_replica)
    print(RESULT_MARK + json.dumps({str(k): v for k, v in results.items()}))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
