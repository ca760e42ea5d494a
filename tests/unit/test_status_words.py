"""Words that say what will happen: ``status`` speaks of the training process, never of the CLI's own.

* the zero-code sync check's line: what the training process will do with ``TPU_CLOSURE_FIX_SYNC_CHECK``, rule
  by rule (the CLI's process imports no ``torch.optim``: it used to say "not armed" because of that);
* a switch's bad value seen by the CLI: the warning points at the environment, not at the CLI's source line;
* ``--python`` to an interpreter that hangs: one line on stderr after a few seconds saying what is awaited, and
  ``--timeout SECONDS`` (a bad value: a short message naming the flag and the accepted values).

(A relative ``PYTHONPATH``: tests/unit/test_fresh_status.py.)
"""
import os
import subprocess
import sys
import time

import pytest

from tpu_closure_fix import cli
from tpu_closure_fix.outcome import sync_line
from tpu_closure_fix.verify import fresh

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ACTIVE = (True, "armed at interpreter start by the start-up module")
VAR = "TPU_CLOSURE_FIX_SYNC_CHECK"


# --------------------------------------------------------------------------- the zero-code sync check's line
@pytest.mark.parametrize("environ, flags, hook, expected", [
    # 1. unset or empty: off
    ({}, {}, ACTIVE, "off (TPU_CLOSURE_FIX_SYNC_CHECK unset)"),
    ({VAR: " "}, {}, ACTIVE, "off (TPU_CLOSURE_FIX_SYNC_CHECK unset)"),
    # 2. the interpreter ignores the environment
    ({VAR: "5"}, {"ignore_environment": True}, ACTIVE,
     "off: python -E/-I ignores the environment, TPU_CLOSURE_FIX_SYNC_CHECK included"),
    # 3. a bad value: the training process warns and leaves it off
    ({VAR: "often"}, {}, ACTIVE, "off: TPU_CLOSURE_FIX_SYNC_CHECK='often' is not an accepted value (the training "
                                 "process warns and leaves it off)"),
    # 4. zero: off
    ({VAR: "0"}, {}, ACTIVE, "off (TPU_CLOSURE_FIX_SYNC_CHECK=0)"),
    # 5. the shim never activates there
    ({VAR: "5"}, {}, (False, "tpu_closure_fix is not installed"),
     "not armed: the start-up hook does not run there, and only the shim's activation arms it (a training script "
     "that imports tpu_closure_fix arms it)"),
    # 6. armed: what the training process will do
    ({VAR: "5"}, {}, ACTIVE, "armed at the first optimizer step of a process that imports torch: every 5 steps, "
                             "on divergence: warn"),
    ({VAR: "1", VAR + "_ON_DIVERGENCE": "raise"}, {}, ACTIVE,
     "armed at the first optimizer step of a process that imports torch: every 1 step, on divergence: raise"),
    ({VAR: "5", VAR + "_ON_DIVERGENCE": "stop"}, {}, (None, "not asked"),
     "armed at the first optimizer step of a process that imports torch: every 5 steps, on divergence: warn "
     "(TPU_CLOSURE_FIX_SYNC_CHECK_ON_DIVERGENCE='stop' is not an accepted value)"),
])
def test_the_sync_check_line_rule_by_rule(environ, flags, hook, expected):
    assert sync_line.line({"flags": flags}, hook, environ) == sync_line.HEAD + expected


def test_status_in_a_torch_only_venv_says_the_training_process_arms_the_check(tmp_path):
    """The real command in this venv (torch, no framework): the CLI's process never imports torch.optim; the
    line says what a training process that does will do."""
    env = dict(os.environ, PYTHONPATH=REPO, TPU_CLOSURE_FIX_SYNC_CHECK="5")
    env.pop("TPU_CLOSURE_FIX", None)
    proc = subprocess.run([sys.executable, "-m", "tpu_closure_fix", "status"], env=env, capture_output=True,
                          text=True, timeout=300, cwd=str(tmp_path))
    said = " ".join(proc.stdout.split())
    assert ("zero-code sync check: armed at the first optimizer step of a process that imports torch: every 5 steps, "
            "on divergence: warn") in said, proc.stdout
    assert "not imported in this process" not in said
