"""optimum-neuron's rows of the call-site table, and how its release is read."""
import json
import os
import sys
import types

from tpu_closure_fix import sites
from tpu_closure_fix.integrations import optimum_neuron
from tpu_closure_fix.releases import in_range, loaded_release

ROWS = [s for s in sites.CALL_SITES if s.integration == "optimum_neuron"]
#: Releases whose optimizer.py was read (files identical within a row; 0.0.24-0.0.28: the torch_xla
#: guard's call, no row).
READ = {"optimum-neuron-0.1": ("0.1.0", "0.2.0", "0.2.1", "0.2.2"), "optimum-neuron-0.3": ("0.3.0",),
        "optimum-neuron-0.4": ("0.4.0", "0.4.1", "0.4.2", "0.4.3", "0.4.4", "0.4.5")}


def test_rows_are_loaded_into_the_table_and_arm_the_watcher():
    assert ROWS and ROWS == list(optimum_neuron.CALL_SITES)
    assert "optimum.neuron" in sites.top_level_packages()


def test_every_release_read_falls_in_exactly_one_row():
    for variant, releases in READ.items():
        for release in releases:
            assert [s.variant for s in ROWS if in_range(release, s.releases)] == [variant], release
    for release in ("0.0.24", "0.0.28", "0.4.6", "0.5.0"):  # guarded by torch_xla's guard / not read: no row
        assert not any(in_range(release, s.releases) for s in ROWS), release


def test_recorded_fingerprints_agree_with_the_measured_releases():
    """One code per row, measured from every wheel of its range (docs/fingerprints.json)."""
    path = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "docs",
                        "fingerprints.json")
    with open(path) as handle:
        measured = json.load(handle)
    for site in ROWS:
        assert sorted(measured[site.variant]) == sorted(READ[site.variant]), site.variant
        assert {fp for _, fp in site.fingerprints} == set(measured[site.variant].values()), site.variant
        for release, fingerprint in site.fingerprints:
            assert measured[site.variant][release] == fingerprint, (site.variant, release)


def _namespace_modules(monkeypatch, lazy_version=None, version_module="0.4.5"):
    """``optimum`` as a namespace package (no __version__), ``optimum.neuron`` a module that may not carry
    its release, and its ``version`` module."""
    namespace = types.ModuleType("optimum")
    namespace.__path__ = []
    package = types.ModuleType("optimum.neuron")
    if lazy_version is not None:
        package.__version__ = lazy_version
    monkeypatch.setitem(sys.modules, "optimum", namespace)
    monkeypatch.setitem(sys.modules, "optimum.neuron", package)
    if version_module is not None:
        version = types.ModuleType("optimum.neuron.version")
        version.__version__ = version_module
        monkeypatch.setitem(sys.modules, "optimum.neuron.version", version)
    else:
        monkeypatch.delitem(sys.modules, "optimum.neuron.version", raising=False)


def test_release_of_a_namespace_distribution_comes_from_its_version_module(monkeypatch):
    """optimum.neuron is a transformers _LazyModule without __version__: its version module has it."""
    _namespace_modules(monkeypatch)
    assert loaded_release("optimum.neuron") == "0.4.5"


def test_release_of_a_namespace_distribution_prefers_its_own_version(monkeypatch):
    _namespace_modules(monkeypatch, lazy_version="0.3.0", version_module="0.4.5")
    assert loaded_release("optimum.neuron") == "0.3.0"


def test_no_release_without_either(monkeypatch):
    _namespace_modules(monkeypatch, version_module=None)
    assert loaded_release("optimum.neuron") is None


def test_a_top_level_release_still_wins(monkeypatch):
    """The unified lightning package: sub-packages take the top level's release (unchanged)."""
    top = types.ModuleType("lightning")
    top.__version__ = "2.6.6"
    sub = types.ModuleType("lightning.fabric")
    sub.__version__ = "9.9.9"
    monkeypatch.setitem(sys.modules, "lightning", top)
    monkeypatch.setitem(sys.modules, "lightning.fabric", sub)
    assert loaded_release("lightning.fabric") == "2.6.6"
