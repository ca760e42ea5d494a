"""Every shell command README.md shows (and the demo's, in docs/demo.md) works as written in a fresh venv.

The commands are read from the documents' ```bash blocks, not copied here: a command added to a
document without an expectation below fails the test. Each runs with ``bash -c`` in one fresh venv
(this machine's Python) whose ``bin`` is first on PATH, as a user's shell would have it, in a copy of
this checkout as a clone has it (no .git, .cache, results or build outputs): the documents install
from a clone (``pip install .``) until the package is on PyPI. What differs from a user's machine, and why:

* torch is the one installed first (``torch==2.13.0``, the local CPU build; a TPU image has its own),
  so pip does not pull a multi-GB CUDA build for the demo's Lightning.

``bash scripts/quick.sh``, ``bash scripts/main.sh`` and ``bash scripts/test.sh`` are the repository's own
commands (this test is part of the last, which runs the unit tests of the first); they are checked by CI running
them, not here.
"""
import os
import re
import shutil
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DOCUMENTS = ("README.md", os.path.join("docs", "demo.md"))
REPOSITORY_COMMANDS = ("bash scripts/quick.sh", "bash scripts/main.sh", "bash scripts/test.sh",
                       "bash scripts/demo.sh")
TIMEOUT = 1200

#: command as written -> the exit code the documents promise for it in a venv with nothing but
#: torch and what the commands before it installed (in document order).
EXPECTED = {
    "pip install .": 0,
    # no framework installed: "nothing to protect" (0), said as such, never "protected" or "unprotected"
    "tpu-closure-fix status": 0,
    "tpu-closure-fix check": 0,
    'tpu-closure-fix status --python "$(command -v python)"': 0,
    'pip install ".[demo]"': 0,
    "tpu-closure-fix demo --out demo-out": 0,
}


def shell_commands(path):
    """Command lines of the ```bash blocks of ``path`` (comments and blank lines dropped)."""
    with open(os.path.join(REPO, path)) as handle:
        text = handle.read()
    commands = []
    for block in re.findall(r"```bash\n(.*?)```", text, re.S):
        for line in block.splitlines():
            line = line.split(" #", 1)[0].strip() if not line.lstrip().startswith("#") else ""
            if line:
                commands.append(line)
    return commands


def documented_commands():
    return [(doc, command) for doc in DOCUMENTS for command in shell_commands(doc)
            if not command.startswith(REPOSITORY_COMMANDS)]


def test_every_documented_command_has_an_expectation():
    commands = documented_commands()
    assert commands, "no shell command found in %s" % (DOCUMENTS,)
    missing = [command for _, command in commands if command not in EXPECTED]
    assert not missing, "documented commands without an expected exit code here: %s" % missing


#: What a clone does not have: version control, caches, results and build outputs.
NOT_IN_A_CLONE = shutil.ignore_patterns(".git", ".cache", "results", "__pycache__", "*.egg-info", "build", "dist",
                                        ".pytest_cache", ".hypothesis")


@pytest.fixture(scope="module")
def user_env(tmp_path_factory):
    """(environment, clone): a fresh venv with torch first on PATH, and a copy of this checkout."""
    root = tmp_path_factory.mktemp("readme")
    clone = root / "tpu-closure-fix"
    shutil.copytree(REPO, str(clone), ignore=NOT_IN_A_CLONE)
    venv = root / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=TIMEOUT)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "TPU_CLOSURE_FIX", "VIRTUAL_ENV")}
    env.update(PATH=str(venv / "bin") + os.pathsep + env.get("PATH", ""), VIRTUAL_ENV=str(venv),
               PIP_DISABLE_PIP_VERSION_CHECK="1", PYTHONWARNINGS="ignore")
    subprocess.run(["pip", "install", "-q", "torch==2.13.0"], check=True, env=env, timeout=TIMEOUT,
                   cwd=str(root))
    return env, clone


def test_documented_commands_work_as_written(user_env):
    env, clone = user_env
    results = []
    for doc, command in documented_commands():
        proc = subprocess.run(["bash", "-c", command], env=env, cwd=str(clone), capture_output=True, text=True,
                              timeout=TIMEOUT)
        results.append((doc, command, proc.returncode, (proc.stdout + proc.stderr)[-1500:]))
    wrong = [r for r in results if r[2] != EXPECTED[r[1]]]
    assert not wrong, "\n\n".join("%s: `%s` exited %d (expected %d):\n%s" % (doc, command, code, EXPECTED[command],
                                                                           tail)
                                  for doc, command, code, tail in wrong)
    # what the demo promises: the picture and the results, in the folder it was given
    assert (clone / "demo-out" / "results.json").is_file()
