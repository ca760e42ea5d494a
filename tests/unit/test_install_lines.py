"""The install lines of call-site rows and of releases (:data:`tpu_closure_fix.install.INSTALLS`), offline.

That each line resolves with today's pip beside a held torch is tested with the network: tests/fixlines."""
import shlex

import pytest

from tpu_closure_fix import install
from tpu_closure_fix.releases import in_range
from tpu_closure_fix.sites import CALL_SITES
from tpu_closure_fix.verify import script_dir


def _pinned(line, distribution):
    """The release ``line`` pins of ``distribution`` (``dist==release``), or None."""
    for word in shlex.split(line):
        if word.lower().startswith(distribution + "=="):
            return word.split("==", 1)[1]
    return None


@pytest.mark.parametrize("entry", install.INSTALLS, ids=lambda entry: "%s%s" % (entry.distribution, entry.releases))
def test_each_line_installs_a_release_outside_the_releases_it_stands_for(entry):
    release = _pinned(entry.line, entry.distribution)
    assert release is not None, entry
    assert install.install_entry(entry.distribution, release) is None, entry
    if entry.torch is None:  # else the line would fail as the releases it replaces do
        assert not in_range(release, entry.releases), entry
    else:  # a line moving torch stands for its rows only: a release found beside a script installs as it is
        assert install.release_command(entry.distribution, release)[1] is None, entry
    assert "`" not in entry.why and entry.why, entry  # said inside a sentence, no command
    assert ("torch==%s" % entry.torch in shlex.split(entry.line)) if entry.torch else \
        not any(word.startswith("torch==") for word in shlex.split(entry.line)), entry


@pytest.mark.parametrize("release, pinned", [("1.5.10", "1.5.3"), ("1.5.10.post0", "1.5.3"), ("1.6.5", "1.6.5.post0"),
                                             ("1.7.7", "1.8.6"), ("1.8.0", "1.8.6"), ("1.3.8", "1.4.9")])
def test_a_release_whose_own_line_fails_today_gets_the_nearest_that_installs(release, pinned):
    command, why = install.release_command("pytorch-lightning", release)
    assert _pinned(command, "pytorch-lightning") == pinned and why, (command, why)


@pytest.mark.parametrize("release", ["1.0.8", "1.5.3", "1.6.5.post0", "1.8.4", "1.8.6", "2.6.6"])
def test_a_release_that_installs_is_pinned_as_it_is(release):
    assert install.release_command("pytorch-lightning", release) == ("pip install pytorch-lightning==%s" % release,
                                                                      None)


def test_a_row_none_of_whose_releases_installs_today_names_the_line_that_does():
    rows = {row.variant: row for row in CALL_SITES}
    assert install.pin_command(rows["pl-1.7"]) == "pip install %s" % install.install_entry(
        "pytorch-lightning", "1.7.7").line
    assert install.pin_command(rows["pl-1.3"]) == "pip install %s" % install.install_entry(
        "pytorch-lightning", "1.3.8").line
    # a range with releases that install (pip skips the others): the range itself
    assert install.pin_command(rows["pl-1.5"]) == "pip install 'pytorch-lightning>=1.5.0,<1.6.0'"
    assert install.pin_command(rows["torch_xla-2.1+"]) == "pip install torch==2.9.0 torch-xla==2.9.0"


def test_the_script_directory_fix_says_why_it_installs_another_release():
    found = {"package": "pytorch_lightning", "path": "/w/pytorch_lightning", "release": "1.7.7"}
    reason = script_dir.reason([found], "/w", "/venv/bin/python")
    command = "/venv/bin/python -m " + install.release_command("pytorch-lightning", "1.7.7")[0]
    assert ("Fix: install into the interpreter the nearest release that installs (pytorch_lightning 1.7.7 does "
            "not: its metadata torch>=1.9.* is invalid since pip 24.1), `%s`, and move /w/pytorch_lightning out of "
            "/w" % command) in reason, reason
