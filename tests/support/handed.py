"""The zero-code check's training-thread part without a worker thread or a process group: every check it
hands over goes to a list (a test then delivers each job's verdict itself, as the worker would)."""
from tpu_closure_fix.synccheck import comm


class DistributedChannel(comm.DistributedChannel):
    """A process group's channel (rank ``rank`` of 2) without a process group: the worker is replaced."""

    def __init__(self, rank=0):
        self.dist, self.rank, self.size, self.timeout = None, rank, 2, 5


def hand_checks_to_a_list(monkeypatch):
    """Patch (with ``monkeypatch``) the worker's entry so that every check goes to the returned list of
    ``worker.Job``; the training thread's part runs as in a job."""
    from tpu_closure_fix.synccheck import worker

    jobs = []
    channel = DistributedChannel()
    monkeypatch.setattr(comm, "channel", lambda timeout=None: channel)
    monkeypatch.setattr(comm, "default_group_id", lambda: 1)
    monkeypatch.setattr(worker, "stale", lambda group: False)
    monkeypatch.setattr(worker, "submit", lambda job: jobs.append(job) or True)
    return jobs
