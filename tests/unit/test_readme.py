"""README: short, names its three commands, links what moved to docs/; the support tables are generated, never typed."""
import os
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_support_table_is_up_to_date():
    proc = subprocess.run([sys.executable, os.path.join(REPO, "scripts", "support_table.py"), "--check"],
                          capture_output=True, text=True, cwd=REPO, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_readme_names_the_three_commands_and_ci_runs_the_test_command():
    with open(os.path.join(REPO, "README.md")) as handle:
        commands = [line.split(" #", 1)[0].strip() for line in handle.read().splitlines()]
    for command in ("bash scripts/quick.sh", "bash scripts/main.sh", "bash scripts/test.sh"):
        assert command in commands, command
    with open(os.path.join(REPO, ".ci", "run")) as handle:
        assert "bash scripts/test.sh" in handle.read()


def test_the_first_screen_is_for_a_tpu_user_the_install_line_then_status_and_its_outcomes():
    with open(os.path.join(REPO, "README.md")) as handle:
        first_screen = handle.read().split("\n## ", 1)[0]
    install, status = first_screen.index("pip install ."), first_screen.index("tpu-closure-fix status")
    sample = first_screen.index("```text\npython: ")
    assert install < status < sample, "install line, then status, then its sample output"
    for outcome in ("PROTECTED", "NOTHING TO PROTECT", "UNPROTECTED", "COULD NOT VERIFY"):
        assert "**%s**" % outcome in first_screen, outcome
    assert "scripts/test.sh" not in first_screen and "CI" not in first_screen  # the project's own matters later


def test_readme_is_short_its_tables_narrow_and_its_links_exist():
    with open(os.path.join(REPO, "README.md")) as handle:
        text = handle.read()
    assert len(text.encode("utf-8")) <= 12 * 1024, "README.md is %d bytes: keep it <= 12 KB" % len(text.encode())
    wide = [line for line in text.splitlines() if line.startswith("|") and len(line) > 120]
    assert not wide, "table rows wider than 120 characters: %s" % wide
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


def test_the_first_screen_shows_a_users_paths_not_this_machines():
    # The sample output is what a user sees in their own venv: no path of the machine it was captured on.
    import re

    with open(os.path.join(REPO, "README.md")) as handle:
        first_screen = handle.read().split("\n## ", 1)[0]
    sample = re.search(r"```text\n(.*?)```", first_screen, re.S).group(1)
    assert sample.startswith("python: /home/user/venv/bin/python ("), sample.splitlines()[0]
    for machine in ("/work/", ".cache/", "/tmp/", "/root/"):
        assert machine not in first_screen, machine
    assert all(len(line) <= 120 for line in sample.splitlines())
