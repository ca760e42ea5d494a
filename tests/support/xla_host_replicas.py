"""Two torch_xla replicas as threads of one process, no process group, the zero-code check armed: what the
check's host channel (its own TCPStore and gloo group, never an XLA collective) makes of them.

Run as ``python -m support.xla_host_replicas --mode standin|real --scenario different|same|probe --steps N
--out FILE`` with ``TPU_CLOSURE_FIX_SYNC_CHECK`` (and ``TPU_CLOSURE_FIX_SYNC_CHECK_CHANNEL``) in the environment:

* ``standin``: the one test double (support.xla_standin) configured as 2 replicas in 1 process; this program
  starts the 2 replica threads, each entering its replica (``global_ordinal`` per thread, as torch_xla's);
* ``real``: real torch_xla (``PJRT_DEVICE=CPU CPU_NUM_DEVICES=2``), ``xmp.spawn``: 2 replica threads in the
  pool process torch_xla starts.

Each replica trains a small model for ``--steps`` plain optimizer steps (no collective: on CPU PJRT an XLA
collective cannot execute), on its own data (``different``), on the same data (``same``), or on the same
data with a probe optimizer stepped by replica 0 alone (``probe``). torch_xla's ``all_reduce`` and
``all_gather`` are replaced by functions that record the call and raise: the check must never issue one.
The replica of ordinal 0 writes the process's result: each replica's steps and error, every
TPUClosureFixWarning said in the process, the checks it answered, the XLA collectives called.
"""
import argparse
import json
import os
import sys
import threading
import warnings

#: What the process saw, shared by its replica threads and the check's worker threads.
_seen = {"warnings": [], "collectives": [], "replicas": {}}
_lock = threading.Lock()
_setup = []


def _record_warnings():
    """Every TPUClosureFixWarning of the process, from any thread, into ``_seen`` (once per process)."""
    from tpu_closure_fix.config import TPUClosureFixWarning

    original = warnings.showwarning

    def showwarning(message, category, filename, lineno, file=None, line=None):
        if issubclass(category, TPUClosureFixWarning):
            with _lock:
                _seen["warnings"].append(str(message))
        else:
            original(message, category, filename, lineno, file, line)

    warnings.showwarning = showwarning
    warnings.simplefilter("always", TPUClosureFixWarning)
    from support.said import record_into

    class Messages(list):  # SyncCheck's reports go out on its logger: their messages, as the warnings above
        def append(self, entry):
            with _lock:
                _seen["warnings"].append(entry["message"])

    record_into(Messages())


def _forbid_collectives(xm):
    """torch_xla's collectives record the call and raise: the check must issue none."""
    def forbidden(name):
        def collective(*args, **kwargs):
            with _lock:
                _seen["collectives"].append(name)
            raise RuntimeError("the sync check issued xm.%s" % name)
        return collective

    for name in ("all_reduce", "all_gather"):
        setattr(xm, name, forbidden(name))


def _once_per_process(xm):
    with _lock:
        if _setup:
            return
        _setup.append(True)
    _record_warnings()
    _forbid_collectives(xm)
    import tpu_closure_fix  # noqa: F401  (arms the zero-code check from the environment)


def _model(torch, device):
    """The same initial weights on every replica (a generator of its own: torch's global seed is shared by
    the replica threads)."""
    generator = torch.Generator().manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.copy_(torch.randn(parameter.shape, generator=generator))
    return model.to(device)


def _step(torch, model, optimizer, x, y, share=None):
    optimizer.zero_grad()
    loss = ((model(x) - y) ** 2).mean()
    loss.backward()
    if share is not None:
        share(model)
    optimizer.step()


_shared = {}
_grads_barrier = threading.Barrier(2)


def _share_grads(ordinal):
    """A host-side stand-in for a data-parallel job's gradient all-reduce (CPU tensors, replica threads of the
    test double): every replica steps with replica 0's gradients. Without it, replicas on the same data may
    still differ in the last bit: two threads' float kernels need not round alike."""
    def share(model):
        if ordinal == 0:
            _shared["grads"] = [p.grad.detach().clone() for p in model.parameters()]
        _grads_barrier.wait(600)
        if ordinal != 0:
            for p, grad in zip(model.parameters(), _shared["grads"]):
                p.grad.copy_(grad)
        _grads_barrier.wait(600)
    return share


def train(ordinal, scenario, steps, device, sync, share=None):
    """One replica's loop; its optimizer steps are what the zero-code check counts. ``share``: the stand-in
    gradient all-reduce of the replicas that train on the same data (:func:`_share_grads`), or None."""
    import torch

    model = _model(torch, device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    probe = None
    if scenario == "probe" and ordinal == 0:  # a probe model only replica 0 trains
        probe_model = torch.nn.Linear(3, 1).to(device)
        probe = (probe_model, torch.optim.SGD(probe_model.parameters(), lr=0.05))
    data = torch.Generator().manual_seed(1 + ordinal if scenario == "different" else 1)
    done = 0
    for _ in range(steps):
        x, y = torch.randn(8, 4, generator=data), torch.randn(8, 1, generator=data)
        _step(torch, model, optimizer, x.to(device), y.to(device), share if scenario != "different" else None)
        if probe is not None:
            _step(torch, probe[0], probe[1], x[:, :3].to(device), y.to(device))
        sync()
        done += 1
    return done


def replica(ordinal, args, xm, device_fn, sync, barrier, share=None):
    """The body of one replica thread: train, let the check's workers answer, and (ordinal 0) write."""
    _once_per_process(xm)
    result = {"steps": 0, "error": None}
    try:
        result["steps"] = train(ordinal, args.scenario, args.steps, device_fn(), sync, share)
    except Exception as exc:
        result["error"] = "%s: %s" % (type(exc).__name__, exc)
    with _lock:
        _seen["replicas"][ordinal] = result
    barrier.wait(600)
    if ordinal == 0:
        from tpu_closure_fix.synccheck import hook, worker

        drained = worker.drain(120)
        with open(args.out, "w") as handle:
            json.dump(dict(_seen, drained=drained, checks=hook.seen["checks"], armed=hook.armed_every(),
                           threads=sorted(t.name for t in threading.enumerate())), handle)
    barrier.wait(600)


# --------------------------------------------------------------------------- the two launches
_barrier = threading.Barrier(2)


def _real_replica(index, args):
    """``xmp.spawn``'s function: one replica thread of real torch_xla."""
    import torch_xla
    import torch_xla.core.xla_model as xm
    import torch_xla.runtime as xr

    sync = getattr(torch_xla, "sync", None) or xm.mark_step
    device_fn = getattr(torch_xla, "device", None) or xm.xla_device
    replica(xr.global_ordinal(), args, xm, device_fn, sync, _barrier)


def run_real(args):
    import torch_xla.distributed.xla_multiprocessing as xmp

    import tpu_closure_fix  # noqa: F401  (as a user's train.py, or the start-up hook: the check's channel is handed over)
    from support import xla_host_replicas as me  # spawned by its module's name, not __main__'s

    xmp.spawn(me._real_replica, args=(args,))


def run_standin(args):
    from support import xla_standin

    xla_standin.configure(2, 0, process_count=1, process_index=0)
    xm = xla_standin.install()
    import torch

    def one(ordinal):
        xla_standin.enter_replica(ordinal)  # what xmp.spawn's thread does: this thread is replica ``ordinal``
        replica(ordinal, args, xm, lambda: torch.device("cpu"), lambda: None, _barrier, _share_grads(ordinal))

    from tpu_closure_fix.synccheck import launch

    threads = [threading.Thread(target=one, args=(o,), name="replica-%d" % o) for o in (0, 1)]
    with launch.handing_over():  # what torch_xla's spawn_threads does with the check armed: the channel is handed
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()


def main(argv=None):
    parser = argparse.ArgumentParser()
    parser.add_argument("--mode", choices=("standin", "real"), required=True)
    parser.add_argument("--scenario", choices=("different", "same", "probe"), required=True)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    import torch

    torch.set_num_threads(1)
    (run_real if args.mode == "real" else run_standin)(args)
    sys.stdout.flush()
    os._exit(0)  # the check's store and gloo groups need no orderly teardown at the end of the run


if __name__ == "__main__":
    main()
