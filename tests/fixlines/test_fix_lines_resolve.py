"""Every ``pip install`` line the tool prints for a call-site row resolves with today's pip and leaves torch alone.

Resolution only: ``pip install --dry-run --report -`` run by the newest pip (a venv of its own under
``.cache/pip-today``, upgraded once per run) against this interpreter (``pip --python``), whose installed torch
a constraint file holds (``torch==<installed release>``). A line passes when pip resolves it and its plan
installs no torch. A line of :data:`tpu_closure_fix.install.INSTALLS` that names its own torch (torch_xla runs
only beside the torch it was built for) is held to that torch instead, and must install exactly it.
Needs the network (PyPI); pip downloads metadata, not wheels, for most packages. The lines resolve
:data:`JOBS` at a time: 7 min for the 42 lines (about 3 min of CPU) at load average 5-7 on 2 cores.
"""
import json
import os
import shlex
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from importlib import metadata

import pytest

from tpu_closure_fix import install
from tpu_closure_fix.sites import CALL_SITES
from tpu_closure_fix.verify import script_dir

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PIP_VENV = os.path.join(REPO, ".cache", "pip-today")
#: Seconds one resolution may take (the slowest measured alone: 54 s, torch 2.9's CUDA wheels' metadata).
TIMEOUT = 300
#: Resolutions run at a time.
JOBS = 2
#: The examples of releases whose own line fails with today's pip (pip >= 24.1 or torch 2.x refuses them).
REPLACED = [("pytorch-lightning", "1.5.10"), ("pytorch-lightning", "1.5.10.post0"), ("pytorch-lightning", "1.6.5"),
            ("pytorch-lightning", "1.7.7"), ("pytorch-lightning", "1.8.0"), ("pytorch-lightning", "1.3.8"),
            ("lightning-lite", "1.8.0"), ("lightning", "1.8.0")]


def _commands():
    """``{command: torch it may install (None: none)}``: every row's fix, every INSTALLS line, the replacements."""
    commands = {}
    for row in CALL_SITES:
        commands.setdefault(install.pin_command(row), None)
    for entry in install.INSTALLS:
        commands["pip install %s" % entry.line] = entry.torch
    for distribution, release in REPLACED:
        command, why = install.release_command(distribution, release)
        assert why, (distribution, release)
        commands.setdefault(command, None)
    return commands


COMMANDS = _commands()


@pytest.fixture(scope="module")
def pip_today(tmp_path_factory):
    """The newest pip, in a venv of its own; the python that runs it."""
    python = os.path.join(PIP_VENV, "bin", "python")
    if not os.path.exists(python):
        subprocess.run([sys.executable, "-I", "-m", "venv", PIP_VENV], check=True)
    done = subprocess.run([python, "-I", "-m", "pip", "install", "-q", "--disable-pip-version-check", "-U", "pip"],
                          capture_output=True, text=True, timeout=TIMEOUT)
    assert done.returncode == 0, done.stderr
    version = subprocess.run([python, "-I", "-m", "pip", "--version"], capture_output=True, text=True).stdout
    print("resolving with %s" % version.strip())
    return python


def _torch_release():
    return metadata.version("torch").split("+")[0]


def _resolve(pip_today, command, folder):
    """``(seconds, exit code, report or None, stderr lines)`` of ``command`` resolved beside the held torch."""
    held = COMMANDS[command] or _torch_release()
    constraints = os.path.join(folder, "constraints-%d.txt" % sorted(COMMANDS).index(command))
    with open(constraints, "w") as handle:
        handle.write("torch==%s\n" % held)
    started = time.time()
    done = subprocess.run([pip_today, "-I", "-m", "pip", "--python", sys.executable, "install", "--dry-run",
                           "--disable-pip-version-check", "--report", "-", "--quiet", "-c", constraints]
                          + shlex.split(command)[2:], capture_output=True, text=True, timeout=TIMEOUT)
    errors = [line for line in done.stderr.splitlines() if "is ignored: it is neither" not in line]
    report = json.loads(done.stdout) if done.returncode == 0 else None
    return time.time() - started, done.returncode, report, errors


@pytest.fixture(scope="module")
def resolutions(pip_today, tmp_path_factory):
    """``{command: _resolve(...)}`` of every command, :data:`JOBS` at a time."""
    folder = str(tmp_path_factory.mktemp("constraints"))
    started = time.time()
    with ThreadPoolExecutor(max_workers=JOBS) as pool:
        futures = {command: pool.submit(_resolve, pip_today, command, folder) for command in COMMANDS}
        results = {command: future.result() for command, future in futures.items()}
    print("%d lines resolved in %.0f s, %d at a time" % (len(results), time.time() - started, JOBS))
    for command, result in sorted(results.items(), key=lambda item: -item[1][0]):
        print("  %5.1f s  %s" % (result[0], command))
    return results


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_the_fix_resolves_with_todays_pip_and_leaves_torch_alone(command, resolutions):
    assert shlex.split(command)[:2] == ["pip", "install"], command
    own_torch = COMMANDS[command]
    held = own_torch or _torch_release()
    _, code, report, errors = resolutions[command]
    assert code == 0, "`%s` does not resolve beside torch %s:\n%s" % (command, held, "\n".join(errors[-15:]))
    planned = {item["metadata"]["name"].lower(): item["metadata"]["version"] for item in report["install"]}
    if own_torch:
        assert planned.get("torch") == own_torch, (command, planned)
    else:
        assert "torch" not in planned, "`%s` would replace torch %s by %s" % (command, held, planned["torch"])


def test_the_script_directory_fix_of_a_release_that_does_not_install_names_one_that_does():
    found = {"package": "pytorch_lightning", "path": "/w/pytorch_lightning", "release": "1.5.10"}
    step = script_dir.install_step(found, "/venv/bin/python")
    command = install.release_command("pytorch-lightning", "1.5.10")[0]
    assert step.endswith("`/venv/bin/python -m %s`" % command), step
    assert command in COMMANDS
