"""Fixtures for tests that run against one installed Lightning target.

The matrix runner (scripts/matrix.py) runs ``pytest tests/target`` once per
target with the target's folder on PYTHONPATH and TPU_CLOSURE_FIX_TARGET set to
its name. Without that variable these tests are not collected (they need a
Lightning release); with it, a target that does not import is a failure.
"""
import json
import os
import socket
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
TESTS = os.path.dirname(HERE)
REPO = os.path.dirname(TESTS)
TARGET = os.environ.get("TPU_CLOSURE_FIX_TARGET")
if TESTS not in sys.path:  # ``support`` is importable however pytest is started (repo root or tests/)
    sys.path.insert(0, TESTS)
REPLICAS = 2
TIMEOUT = 600


#: Test modules that do not depend on the Lightning release beyond the import machinery run on a
#: few representative targets only (the main affected Trainer+Lite release, the oldest supported
#: wrapt, the newest Fabric); every other module runs on every target. Declared here, in one place.
REPRESENTATIVE = ("pytorch-lightning==1.8.6", "pytorch-lightning==1.8.6+wrapt==1.14.1", "lightning-fabric==2.6.6")
ONLY_ON = {
    "test_activation.py": REPRESENTATIVE,
    "test_faults.py": ("pytorch-lightning==1.8.6",),
    "test_orderings.py": ("pytorch-lightning==1.8.6",),
    "test_concurrency.py": ("pytorch-lightning==1.8.6",),
    # SyncCheck supports Lightning >= 1.5: the oldest and newest Trainer lines and the newest Fabric.
    "test_synccheck.py": ("pytorch-lightning==1.5.10", "pytorch-lightning==1.8.6", "lightning==2.6.6",
                          "lightning-fabric==2.6.6"),
    "test_demo.py": ("pytorch-lightning==1.8.6",),
    # one target per call-site family: accelerator, Trainer plugin + Lite, fixed Trainer + Fabric XLAPrecision
    "test_check.py": ("pytorch-lightning==1.4.9", "pytorch-lightning==1.5.10", "pytorch-lightning==1.8.6",
                      "pytorch-lightning==2.6.6",
                      "lightning-fabric==2.6.6"),
    "test_accelerate.py": ("accelerate==0.27.2", "accelerate==0.28.0", "accelerate==1.0.1", "accelerate==1.15.0"),
    # the LBFGS lockstep rule, through each kind of fix: Fabric's precision plugin and accelerate's step
    "test_lockstep.py": ("lightning-fabric==2.6.6", "accelerate==1.15.0"),
}

#: Targets without Lightning: only the modules that list them in ONLY_ON run there.
NOT_LIGHTNING = ("accelerate==",)


def pytest_ignore_collect(collection_path, config):
    if not TARGET:
        return True
    name = os.path.basename(str(collection_path))
    targets = ONLY_ON.get(name)
    if targets is None:
        return name.startswith("test_") and TARGET.startswith(NOT_LIGHTNING)
    return TARGET not in targets


def defined_where(condition):
    """Decorator: define a test only where it applies to the target, so a target it does not apply to
    has no entry for it at all (never a skip counted in the results)."""
    def decorate(test):
        return test if condition else None
    return decorate


def _free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def child_env(shim, extra=None):
    env = dict(os.environ)
    env["TPU_CLOSURE_FIX"] = "1" if shim else "0"
    # absolute: children run with another working directory
    paths = [REPO, TESTS] + [os.path.abspath(p) for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    env["PYTHONPATH"] = os.pathsep.join(paths)
    env.update(extra or {})
    return env


def run_replicas(scenarios, shim, tmp_path, world=REPLICAS, module="support.replica", extra_env=None):
    """Run ``world`` replica processes (``module``: support.replica, or another driver with its
    command line) and return rank -> result JSON."""
    port = _free_port()
    procs = []
    for rank in range(world):
        out = tmp_path / ("shim%d-rank%d.json" % (int(shim), rank))
        cmd = [sys.executable, "-m", module, "--rank", str(rank), "--world", str(world),
               "--port", str(port), "--scenarios", json.dumps(scenarios), "--out", str(out)]
        log = open(str(out) + ".log", "w")
        procs.append((subprocess.Popen(cmd, env=child_env(shim, extra_env), stdout=log, stderr=subprocess.STDOUT, cwd=TESTS),
                      out, log))
    results = {}
    try:
        for rank, (proc, out, log) in enumerate(procs):
            code = proc.wait(timeout=TIMEOUT)
            log.close()
            if code != 0:
                with open(str(out) + ".log") as handle:
                    tail = handle.read()[-4000:]
                raise AssertionError("replica %d (shim=%s) exited %d:\n%s" % (rank, shim, code, tail))
            with open(str(out)) as handle:
                results[rank] = json.load(handle)
    finally:
        for proc, _, log in procs:
            if proc.poll() is None:
                proc.kill()
            log.close()
    return results


@pytest.fixture(scope="session")
def target():
    assert TARGET, "TPU_CLOSURE_FIX_TARGET is not set"
    return TARGET


@pytest.fixture(scope="session")
def replica_runs(tmp_path_factory):
    """{shim: {rank: result}} for every replica scenario of the target, one launch per shim mode.

    Shared by test_replicas.py and test_event_order.py so the 2 x 2 replica processes (each importing
    Lightning) start once per target.
    """
    from support import expectations

    scenarios = expectations.all_replica_scenarios(TARGET)
    return {shim: run_replicas(scenarios, shim, tmp_path_factory.mktemp("replicas")) for shim in (True, False)}
