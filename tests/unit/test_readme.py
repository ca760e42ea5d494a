"""README's support table is generated from the call-site table (and stored matrix results), never typed."""
import os
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_support_table_is_up_to_date():
    proc = subprocess.run([sys.executable, os.path.join(REPO, "scripts", "support_table.py"), "--check"],
                          capture_output=True, text=True, cwd=REPO, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_readme_names_both_commands_and_ci_runs_the_test_command():
    with open(os.path.join(REPO, "README.md")) as handle:
        head = handle.read()[:2500]
    assert "bash scripts/main.sh" in head and "bash scripts/test.sh" in head
    with open(os.path.join(REPO, ".ci", "run")) as handle:
        assert "bash scripts/test.sh" in handle.read()
