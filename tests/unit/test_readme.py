"""README: short, names both commands, links what moved to docs/; the support tables are generated, never typed."""
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


def test_readme_is_short_and_its_links_exist():
    with open(os.path.join(REPO, "README.md")) as handle:
        text = handle.read()
    assert len(text.encode("utf-8")) <= 15 * 1024, "README.md is %d bytes: keep it <= 15 KB" % len(text.encode())
    import re

    links = re.findall(r"\]\(([^)#]+)\)", text)
    assert links
    missing = [link for link in links if "://" not in link and not os.path.exists(os.path.join(REPO, link))]
    assert not missing, missing


def test_readme_shows_the_demo_picture_on_its_first_screen():
    # The picture is the fastest way to see the bug: it belongs before the first section heading.
    with open(os.path.join(REPO, "README.md")) as handle:
        first_screen = handle.read().split("\n## ", 1)[0]
    assert "](docs/demo.png)" in first_screen
    assert os.path.getsize(os.path.join(REPO, "docs", "demo.png")) > 10000
