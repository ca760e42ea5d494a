"""Issue #6, orderings: every order of {import Lightning, import shim, enable, disable, enable again, reload}.

One subprocess (``python -S``, so the base venv's .pth auto-enable stays out of
the picture and only the listed operations act) walks the tree of all orders
depth first and forks at every branch: each distinct prefix runs once, so
Lightning is imported once per distinct set of operations before it (10 times),
not once per order. Each leaf fits a real Trainer for one step on the torch_xla
stand-in and reports the wrapper depth of ``TPUPrecisionPlugin.optimizer_step``
and the recorded order.

Orders that cannot be written in a script are left out: enable/disable need the
shim imported, reload needs Lightning imported. That leaves 45 orders.
Expected: depth 1 and the fixed order iff the last of {import shim, enable,
disable} is not ``disable``; depth 0 and the upstream (buggy) order otherwise;
never a second layer, never a warning.
"""
import itertools
import json
import os
import subprocess
import sys
import sysconfig
import textwrap

import pytest

from conftest import REPO, TARGET, TESTS
from test_faults import PROBE, target_dir, warnings_of

pytestmark = pytest.mark.skipif(TARGET != "pytorch-lightning==1.8.6", reason="ordering tests run on PL 1.8.6 only")

OPS = ("lightning", "shim", "enable", "disable", "enable", "reload")

WALK = textwrap.dedent(
    """
    import json, os, sys
    import torch  # noqa: F401  (shared by every branch: imported once, before the first fork)
    import tcf_probe as p

    OUT = sys.argv[1]
    ORDERS = json.loads(sys.argv[2])


    def apply(op):
        import importlib
        if op == "lightning":
            p.lightning()
        elif op == "shim":
            import tpu_closure_fix  # noqa: F401
        elif op == "enable":
            sys.modules["tpu_closure_fix"].enable()
        elif op == "disable":
            sys.modules["tpu_closure_fix"].disable()
        elif op == "reload":
            module = importlib.reload(sys.modules[p.MODULE])
            module.xm = p.xm
            module._XLA_AVAILABLE = True


    def leaf(prefix):
        depth = p.site_depth()
        trainer, model, events = p.train(1)
        record = {"order": prefix, "depth": depth, "events": events, "step": trainer.global_step,
                  "status": [r["verdict"] for r in p.site_status()][:1]}
        with open(OUT, "a") as handle:
            handle.write(json.dumps(record) + "\\n")


    def walk(prefix):
        orders = [o for o in ORDERS if o[:len(prefix)] == prefix]
        if len(orders) == 1 and len(orders[0]) == len(prefix):
            leaf(prefix)
            return
        for op in sorted({o[len(prefix)] for o in orders if len(o) > len(prefix)}):
            pid = os.fork()
            if pid == 0:
                code = 0
                try:
                    apply(op)
                    walk(prefix + [op])
                except BaseException as exc:
                    with open(OUT, "a") as handle:
                        handle.write(json.dumps({"order": prefix + [op], "error": repr(exc)}) + "\\n")
                    code = 1
                sys.stdout.flush(); sys.stderr.flush()
                os._exit(code)
            os.waitpid(pid, 0)  # one branch at a time: modest CPU


    walk([])
    """
)


def valid(order):
    shim = order.index("shim")
    return all(order.index(op) > shim for op in ("enable", "disable")) and \
        order.index("reload") > order.index("lightning")


def orders():
    return sorted({o for o in itertools.permutations(OPS) if valid(o)})


def expected_depth(order):
    last = [op for op in order if op in ("shim", "enable", "disable")][-1]
    return 0 if last == "disable" else 1


def test_every_ordering(tmp_path):
    todo = [list(o) for o in orders()]
    assert len(todo) == 45
    (tmp_path / "tcf_probe.py").write_text(PROBE)
    (tmp_path / "walk.py").write_text(WALK)
    out = tmp_path / "results.jsonl"
    env = {k: v for k, v in os.environ.items() if k not in ("TPU_CLOSURE_FIX", "PYTHONWARNINGS")}
    env["TCF_TESTS"] = TESTS
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), REPO, target_dir(), sysconfig.get_paths()["purelib"]])
    proc = subprocess.run([sys.executable, "-S", str(tmp_path / "walk.py"), str(out), json.dumps(todo)], env=env,
                          capture_output=True, text=True, timeout=600, cwd=str(tmp_path))
    assert proc.returncode == 0, proc.stderr[-4000:]
    results = [json.loads(line) for line in out.read_text().splitlines()]
    errors = [r for r in results if "error" in r]
    assert not errors, errors
    assert sorted(r["order"] for r in results) == sorted(todo)
    for r in results:
        depth = expected_depth(r["order"])
        assert r["depth"] == depth, r
        assert r["step"] == 1
        if depth:
            assert r["events"] == ["forward", "backward", "reduce_gradients", "mark_step"], r
            assert r["status"] == ["patched"], r
        else:
            assert r["events"] == ["reduce_gradients", "forward", "backward"], r
            assert r["status"] == ["disabled"], r
    assert warnings_of(proc.stderr) == [], proc.stderr[-3000:]
