"""accelerate's rows of the call-site table: contiguous ranges, fingerprints as measured."""
import json
import os

from packaging.version import Version

from tpu_closure_fix import sites
from tpu_closure_fix.integrations import accelerate
from tpu_closure_fix.releases import in_range

ROWS = [s for s in sites.CALL_SITES if s.integration == "accelerate"]


def test_rows_are_loaded_into_the_table_and_arm_the_watcher():
    assert ROWS and ROWS == list(accelerate.CALL_SITES)
    assert "accelerate" in sites.top_level_packages()


def test_every_closure_taking_release_read_falls_in_exactly_one_row():
    measured = _measured()
    releases = sorted({r for s in ROWS for r in measured[s.variant]}, key=Version)
    assert releases[0] == "0.4.0" and releases[-1] == "1.16.0"
    for release in releases:
        assert [s.variant for s in ROWS if in_range(release, s.releases)] == \
               [v for v in measured if v.startswith("accelerate-") and release in measured[v]], release
    for release in ("0.3.0", "1.16.1", "1.17.0"):  # no closure / not read yet: unknown, left untouched
        assert not any(in_range(release, s.releases) for s in ROWS), release


def test_recorded_fingerprints_agree_with_the_measured_releases():
    measured = _measured()
    for site in ROWS:
        assert site.fingerprints and site.fix is not None, site.variant
        for release, fingerprint in site.fingerprints:
            assert measured[site.variant][release] == fingerprint, (site.variant, release)
        assert {fp for _, fp in site.fingerprints} == set(measured[site.variant].values()), site.variant


def _measured():
    path = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "docs",
                        "fingerprints.json")
    with open(path) as handle:
        return json.load(handle)
