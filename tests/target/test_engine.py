"""Issue #2: idempotency, exact restore on disable(), status() content and the CLI's exit codes.

Each check runs in a fresh interpreter against the real target release.
"""
import json
import os
import subprocess
import sys

import pytest

from conftest import REPO, TARGET, TESTS, child_env, cli_status_json
from support import expectations


def lightning_sites():
    """(module, qualname) of every Lightning row with a fix, for support.engine_probe."""
    from tpu_closure_fix import sites

    return sorted({(s.module, s.qualname) for s in sites.CALL_SITES
                   if s.fix is not None and s.integration == "lightning"})


def probe(check, env=None):
    """support.engine_probe ``check`` in a fresh interpreter; its PROBE output."""
    environ = child_env(True)
    environ.update(env or {})
    proc = subprocess.run([sys.executable, "-m", "support.engine_probe", check, json.dumps(lightning_sites())],
                          env=environ, capture_output=True, text=True, timeout=300, cwd=TESTS)
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = [l for l in proc.stdout.splitlines() if l.startswith("PROBE ")][-1]
    return json.loads(line[len("PROBE "):])


@pytest.fixture(scope="module")
def log():
    return probe("lifecycle")


def carries_step(site):
    """Whether the release's Trainer hands its closure to torch_xla in this method (support/expectations.py)."""
    if site.startswith(("pytorch_lightning.", "lightning.pytorch.")):
        return expectations.trainer_site_carries_step(TARGET, site)
    return True


def expected_patched(site):
    """From Lightning's history (support/expectations.py), not from the shim's table."""
    if site.startswith(("pytorch_lightning.", "lightning.pytorch.")):
        return expectations.trainer_affected(TARGET) and carries_step(site)
    return expectations.lite_affected(TARGET)  # Lite/Fabric: every release


def expected_verdict(site):
    if not carries_step(site):
        return "not in this release"
    return "patched" if expected_patched(site) else "fixed upstream"


def test_lifecycle_one_layer_and_exact_restore(log):
    assert any(expected_patched(site) for site in log["before"]), "the target has no affected call site?"
    # With the wheel's .pth installed, Lightning was already patched on import ("before").
    unpatched = ("disable", "disable_twice") + (() if log["auto_enabled"] else ("before",))
    patched = ("import", "enable_twice", "reload_package", "enable_again") + (("before",) if log["auto_enabled"] else ())
    for stage in unpatched + patched:
        for site, info in log[stage].items():
            if expected_patched(site) and stage in patched:
                assert info == {"depth": 1, "is_original": False, "wraps_original": True}, (stage, site, info)
            else:  # switched off, or fixed upstream: Lightning's own function object, untouched
                assert info == {"depth": 0, "is_original": True, "wraps_original": True}, (stage, site, info)


def test_status_records(log):
    records = log["status"]
    assert {tuple(sorted(r)) for r in records} == {tuple(sorted(
        ("distribution", "release", "module", "method", "verdict", "reason", "variant", "integration")))}
    by_site = {"%s:%s" % (r["module"], r["method"]): r for r in records}
    dist, version = expectations.parse_target(TARGET)
    for site in log["enable_again"]:
        record = by_site[site]
        assert record["verdict"] == expected_verdict(site), record
        assert record["release"] == str(version), record
        assert bool(record["variant"]) == carries_step(site), record  # a row of the table judged it
    if expectations.has_trainer(TARGET) and not expectations.trainer_affected(TARGET):
        fixed = [r for r in records if r["verdict"] == "fixed upstream"]
        assert fixed and all(r["module"].startswith(("pytorch_lightning.", "lightning.pytorch.")) for r in fixed)


def test_cli_status_exit_codes_and_json():
    enabled = cli_status_json(True)
    assert enabled.returncode == 0, enabled.stdout + enabled.stderr[-2000:]
    records = json.loads(enabled.stdout)["sites"]
    patched = [r for r in records if r["verdict"] == "patched"]
    assert patched
    # The twin: the same environment with the switch off is reported, and gated, as unprotected.
    disabled = cli_status_json(False)
    assert disabled.returncode == 1
    off = {(r["module"], r["method"]): r for r in json.loads(disabled.stdout)["sites"]}
    for r in patched:
        assert off[(r["module"], r["method"])]["verdict"] == "disabled"
        assert "TPU_CLOSURE_FIX=0" in off[(r["module"], r["method"])]["reason"]



def test_cli_table_via_console_script():
    script = os.path.join(os.path.dirname(sys.executable), "tpu-closure-fix")
    args = [script, "status"] if os.path.exists(script) else None
    if args is None:  # running from a source checkout: the console script is not installed
        args = [sys.executable, "-c", "import sys; from tpu_closure_fix.cli import main; sys.exit(main())", "status"]
    proc = subprocess.run(args, env=child_env(True), capture_output=True, text=True, timeout=300, cwd=TESTS)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "patched" in proc.stdout and "\nPROTECTED: every installed affected site" in proc.stdout


def test_unknown_release_is_left_untouched_and_reported():
    """A release newer than every row (99.0.0): a site whose code is identical to a known release's is
    patched by code identity and says so; every other one is left untouched and reported, with a warning."""
    # TPU_CLOSURE_FIX=0 keeps the .pth auto-enable out of the way until the version is changed
    out = probe("unknown-release", env={"TPU_CLOSURE_FIX": "0"})
    assert out["loaded"], out
    by_site = {"%s:%s" % (r["module"], r["method"]): r for r in out["status"]}
    patched = [r for r in out["status"] if r["verdict"] == "patched"]
    skipped = [r for r in out["status"] if r["verdict"] == "skipped"]
    assert patched or skipped, out["status"]
    assert all("99.0.0 not in the table" in r["reason"] for r in patched), patched
    assert all("unknown release 99.0.0" in r["reason"] for r in skipped), skipped
    for site, untouched in out["untouched"].items():
        assert untouched == (by_site[site]["verdict"] != "patched"), (site, by_site[site])
    if skipped:
        assert out["warnings"] and all("unknown release 99.0.0" in w for w in out["warnings"]), out["warnings"]
    else:
        assert out["warnings"] == [], out["warnings"]


def test_loaded_code_has_the_fingerprint_recorded_in_its_row():
    """The code-identity rule patches a release no row names only when its code's fingerprint equals one
    recorded in a row: those must be the fingerprints of the code this target really loads (checked by
    scripts/fingerprints.py against the table, in a subprocess with the target's code imported)."""
    proc = subprocess.run([sys.executable, os.path.join(REPO, "scripts", "fingerprints.py"), "check", TARGET],
                          capture_output=True, text=True, timeout=600, cwd=REPO)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "fingerprints check: ok" in proc.stdout
