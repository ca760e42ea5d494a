"""Replicas as threads of this process, exchanging through memory: SyncCheck's collectives without processes.

:class:`ThreadChannel` answers what ``compare.run`` asks of a channel: its all-reduce is the element-wise
MAX of the ranks' vectors, its all-gather their list, and ``agree`` says what the test wants; :func:`fit`
drives a SyncCheck callback through one fit. Used by tests/unit/test_synccheck_rules.py,
test_synccheck_inprocess.py and test_callback_schedule.py.

Every exchange of a passing test completes in milliseconds. A rank that never comes to an exchange (a
fault that breaks one rank's part of a check) makes the others fail after :data:`TIMEOUT` seconds;
``scripts/mutation.sh`` shortens it (``TPU_CLOSURE_FIX_THREAD_RANK_TIMEOUT``) so that each such mutant fails
in seconds rather than half a minute.
"""
import os
import threading

#: Seconds a thread-rank waits for the others at one exchange.
TIMEOUT = float(os.environ.get("TPU_CLOSURE_FIX_THREAD_RANK_TIMEOUT") or 30)


class ThreadWorld(object):
    def __init__(self, size):
        self.size = size
        self.barrier = threading.Barrier(size, timeout=TIMEOUT)
        self.values = [None] * size

    def exchange(self, rank, value):
        self.values[rank] = value
        self.barrier.wait()
        out = list(self.values)
        self.barrier.wait()
        return out


class AgreeThenReduce(object):
    """``meet`` as the store channels give it above their bound: ``agree``, then ``all_reduce_max`` on "go"."""

    def meet(self, key, vector):
        return self.all_reduce_max(vector) if self.agree(key) else None


class ThreadChannel(AgreeThenReduce):
    kind = "threads"
    timeout = 5

    def __init__(self, world, rank, agree=True):
        self.world, self.rank, self.size, self._agree = world, rank, world.size, agree
        self.gathers = 0

    def device(self, tensors):
        import torch

        return torch.device("cpu")

    def agree(self, key):
        return self._agree

    def forget(self, key):
        pass

    def all_reduce_max(self, vector):
        import torch

        return torch.stack(self.world.exchange(self.rank, vector.detach().clone())).max(dim=0).values

    def all_gather(self, vector):
        self.gathers += 1
        return self.world.exchange(self.rank, vector.detach().clone())


def run_threads(size, main):
    """``main(rank)`` on ``size`` threads named ``rank-<r>``; waits for all of them (a rank stuck at an
    exchange is freed by the barrier's timeout)."""
    threads = [threading.Thread(target=main, args=(r,), name="rank-%d" % r) for r in range(size)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(2 * TIMEOUT + 30)


def fit(cb, steps, module=None, loggers=(), batches_per_step=1, **trainer):
    """One Lightning ``fit`` driven by hand through the callback ``cb``'s hooks: fit start, train start,
    ``batches_per_step`` batch ends at each global step 0 .. ``steps``, train end. The trainer is a namespace
    with ``global_step``, ``loggers`` and the other attributes given. Returns ``cb``."""
    import types

    trainer = types.SimpleNamespace(global_step=0, loggers=list(loggers), **trainer)
    cb.on_fit_start(trainer, module)
    cb.on_train_start(trainer, module)
    for step in range(0, steps + 1):
        trainer.global_step = step
        for _ in range(batches_per_step):
            cb.on_train_batch_end(trainer, module, None, None, 0)
    cb.on_train_end(trainer, module)
    return cb
