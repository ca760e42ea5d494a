"""SyncCheck on real torch_xla (CPU PJRT, replicas as threads): what tests/xla/test_synccheck_xla.py asserts.

Run in a torch_xla environment as ``PJRT_DEVICE=CPU CPU_NUM_DEVICES=2 python -m support.synccheck_xla``;
prints one result line (``RESULT_MARK`` + JSON: ordinal -> findings). In every replica thread:

1. the fingerprint vector of tensors of every parameter dtype (f32, bf16, fp16, f64, with NaN and inf; and
   int64, int8, uint8, bool, int16 buffers: every way a tensor's bits become words on XLA),
   computed on the XLA device, against the same computed on the CPU: the exact fields (structure, bit
   hashes, non-finite counts) must be bitwise equal, the float sums close (XLA may sum in another order);
2. one ``compare_replicas`` on a model on the XLA device (the same weights on both replicas): with no process
   group it goes over the check's own host channel (a TCPStore this process makes and hands over, gloo),
   never through an XLA collective: torch_xla's ``all_reduce`` and ``all_gather`` are replaced by functions
   that record the call and raise (executing a collective on CPU hangs on torch_xla 2.1 and aborts on 2.9).
   The check must call none of them and report "identical" over the 2 replicas.
"""
import json
import sys
import threading

RESULT_MARK = "TPU_CLOSURE_FIX_RESULT "
_captured = {}
_lock = threading.Lock()


class CollectiveCalled(RuntimeError):
    """Raised by torch_xla's collectives in this run: the check must issue none."""


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


def _forbidding(name):
    def collective(*args, **kwargs):
        with _lock:
            _captured.setdefault(_ordinal(), []).append(name)
        raise CollectiveCalled("the check issued xm.%s" % name)
    return collective


def _host_check(device):
    import torch

    from tpu_closure_fix import synccheck

    generator = torch.Generator().manual_seed(0)  # torch's global seed is shared by the replica threads
    model = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.Tanh(), torch.nn.Linear(5, 3))
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.copy_(torch.randn(parameter.shape, generator=generator))
    report = synccheck.compare_replicas(model.to(device), step=7)
    with _lock:
        called = list(_captured.get(_ordinal(), []))
    return {"report": None if report is None else report.as_dict(), "xla_collectives": called}


def _forbid_collectives_once():
    """In the replica process (run_multiprocess starts a new one): torch_xla's collectives record and raise."""
    import torch_xla.core.xla_model as xm

    with _lock:
        for name in ("all_reduce", "all_gather"):
            if not getattr(getattr(xm, name), "forbidden", False):
                setattr(xm, name, _forbidding(name))
                getattr(xm, name).forbidden = True


def _replica():
    import traceback

    out = {}
    try:
        _forbid_collectives_once()
        device = _device()
        out["ordinal"] = _ordinal()
        out["fingerprint"] = _fingerprint_matches(device)
        out["check"] = _host_check(device)
    except Exception as exc:  # reported to the test, with the reason
        out["error"] = "%s: %s\n%s" % (type(exc).__name__, exc, traceback.format_exc()[-2000:])
    return out


def main():
    from torch_xla._internal import pjrt

    import tpu_closure_fix.synccheck  # noqa: F401  (the process starting the replicas hands the channel over)

    results = pjrt.run_multiprocess(_replica)
    print(RESULT_MARK + json.dumps({str(k): v for k, v in results.items()}))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
