"""``tpu-closure-fix check`` against the installed release: protected with the shim (exit 0), and the
twin under TPU_CLOSURE_FIX=0 is reported unprotected, naming a site, with failing self-tests (exit 1).

The self-test drives exactly the rows of the call-site table that matched the installed release.
The graph part needs torch_xla (tests/xla and scripts/main.sh cover it); here ``--no-graph``.
"""
import functools
import json
import subprocess
import sys

from conftest import TARGET, TESTS, child_env, cli_status_json, defined_where
from tpu_closure_fix import sites
from tpu_closure_fix.verify import table


def check(shim, *args):
    proc = subprocess.run([sys.executable, "-m", "tpu_closure_fix", "check", "--no-graph"] + list(args),
                          env=child_env(shim), capture_output=True, text=True, timeout=600, cwd=TESTS)
    return proc.returncode, proc.stdout


@functools.lru_cache(maxsize=None)
def _check_json_text(shim):
    """One ``check --json`` run per shim mode for the whole module (each takes 10-20 s)."""
    return check(shim, "--json")


def check_json(shim):
    code, out = _check_json_text(shim)
    return code, json.loads(out)  # parsed afresh: a test may not change what another one reads


def installed_rows():
    """Status records of the installed, protected sites whose method is their own (not inherited)."""
    records = json.loads(cli_status_json(True).stdout)["sites"]
    rows = {r.variant: r for r in sites.CALL_SITES}
    return {"%s:%s" % (r["module"], r["method"]): r for r in records
            if r["verdict"] in ("patched", "fixed upstream", "guarded") and r["variant"]
            and not rows[r["variant"]].inherits and table.missing_driver(rows[r["variant"]]) is None}


def test_check_with_the_shim_is_protected():
    code, out = check_json(True)
    assert (code, out["outcome"], out["exit_code"], out["ok"]) == (0, "protected", 0, True), out["reason"]
    assert out["reason"].startswith("PROTECTED: ") and "XLA graph not checked (--no-graph)" in out["reason"]
    sites_tested = out["event_check"]["sites"]
    assert sites_tested and all(e["ok"] for e in sites_tested), out["event_check"]
    for e in sites_tested:
        assert e["events"].index("backward") < e["events"].index("reduce_gradients") < e["events"].index("step")


def test_check_tests_exactly_the_table_rows_of_this_release():
    """One self-test per installed site, on the row the engine matched for this release."""
    code, out = check_json(True)
    expected = installed_rows()
    tested = {e["site"]: e for e in out["event_check"]["sites"]}
    assert sorted(tested) == sorted(expected)
    for site, e in tested.items():
        assert e["variant"] == expected[site]["variant"] and e["verdict"] == expected[site]["verdict"]


def test_check_without_the_shim_twin():
    code, out = check_json(False)
    assert (code, out["outcome"], out["exit_code"], out["ok"]) == (1, "unprotected", 1, False), out["reason"]
    disabled = [e for e in out["event_check"]["sites"] if e["verdict"] == "disabled"]
    assert disabled and not any(e["ok"] for e in disabled), out["event_check"]
    assert all(e["events"][0] == "reduce_gradients(no grads)" for e in disabled), out["event_check"]
    # the reason names a site that runs the buggy code, and why
    assert out["reason"].startswith("UNPROTECTED: ") and "run the buggy code: " in out["reason"], out["reason"]
    assert any("%s (disabled" % e["site"] in out["reason"] for e in disabled), out["reason"]


def test_text_output_ends_with_the_reason_and_has_no_empty_heading():
    for shim, code_expected, start in ((True, 0, "PROTECTED: "), (False, 1, "UNPROTECTED: ")):
        code, text = check(shim)
        lines = text.rstrip("\n").splitlines()
        outcome = text.rstrip("\n").split("\n\n")[-1]  # the last paragraph: the outcome, wrapped at 120 columns
        assert code == code_expected and outcome.startswith(start), text[-2000:]
        for i, line in enumerate(lines):
            if line.endswith(":") and not line.startswith(" "):
                assert lines[i + 1].startswith("  ") and lines[i + 1].strip(), (line, text)



def _readme_sample_test():
    """README.md shows a real `tpu-closure-fix status` run with Fabric 2.6.6: on that target the output is the
    same, line for line (the interpreter's path and version on the first line aside)."""
    import os
    import re

    from conftest import REPO

    with open(os.path.join(REPO, "README.md")) as handle:
        sample = re.search(r"```text\n(python: .*?)```", handle.read(), re.S).group(1).splitlines()
    proc = subprocess.run([sys.executable, "-m", "tpu_closure_fix", "status"], env=child_env(True),
                          capture_output=True, text=True, timeout=300, cwd=TESTS)
    out = proc.stdout.splitlines()
    assert proc.returncode == 0 and out[1:] == sample[1:], proc.stdout
    assert out[0].startswith("python: ") and sample[0].startswith("python: ")


if TARGET == "lightning-fabric==2.6.6":  # the sample is of Fabric 2.6.6: defined on that target only
    test_the_readme_sample_of_status_is_what_status_prints_here = _readme_sample_test


@defined_where(TARGET == "pytorch-lightning==1.8.6")
def test_the_release_without_pkg_resources_could_not_verify_naming_the_pin(tmp_path):
    """``pip install pytorch-lightning==1.8.6`` in a fresh venv brings setuptools >= 81, which has no
    pkg_resources: ``import pytorch_lightning`` fails (lightning_lite's __init__ imports it). Hidden here by a
    first path entry whose pkg_resources raises what a missing one does. Before: its leftover submodules read as a
    release without __version__, UNPROTECTED (exit 1) with no fix. The twin, the target as pinned, is
    test_check_with_the_shim_is_protected."""
    hidden = tmp_path / "setuptools-81-or-later"
    hidden.mkdir()
    (hidden / "pkg_resources.py").write_text(
        "raise ModuleNotFoundError(\"No module named 'pkg_resources'\", name='pkg_resources')\n")
    for command in ("status", "check"):
        proc = subprocess.run([sys.executable, "-m", "tpu_closure_fix", command, "--json"] +
                              (["--no-graph"] if command == "check" else []),
                              env=child_env(True, path_first=[str(hidden)]), capture_output=True, text=True,
                              timeout=600, cwd=TESTS)
        out = json.loads(proc.stdout)
        assert (proc.returncode, out["outcome"]) == (3, "could not verify"), out["reason"]
        assert "(import failed: ModuleNotFoundError: No module named 'pkg_resources')" in out["reason"], out["reason"]
        assert out["reason"].endswith(". Fix: `%s -m pip install 'setuptools<81'`." % sys.executable), out["reason"]
        failed = [r for r in out["sites"] if r["verdict"] == "failed"]
        assert failed and not [r for r in out["sites"] if r["verdict"] in ("skipped", "patched")], out["sites"]
