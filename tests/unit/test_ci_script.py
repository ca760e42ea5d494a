"""scripts/test.sh runs every stage whatever an earlier one did, and counts each failure in its exit code."""
import os
import re

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _lines(name):
    with open(os.path.join(REPO, "scripts", name)) as handle:
        return [line.split("#", 1)[0].strip() for line in handle]


def test_errexit_is_off_after_the_venv_script_turns_it_on():
    """venv.sh sets -e; sourced into test.sh it would end the run at the first failing stage, before the
    later stages and the summary: test.sh turns it off again at once."""
    assert any(re.match(r"set -[a-z]*e", line) for line in _lines("venv.sh"))
    lines = [line for line in _lines("test.sh") if line]
    source = lines.index("source scripts/venv.sh || exit 1")
    assert lines[source + 1] == "set +e"
    assert not any(re.match(r"set -[a-z]*e", line) for line in lines[source + 1:])


def test_every_stage_counts_its_failure_and_the_script_exits_with_the_count():
    lines = [line for line in _lines("test.sh") if line]
    assert lines[-1] == "exit $status"
    assert "status=0" in lines
