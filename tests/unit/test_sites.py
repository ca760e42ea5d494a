"""The call-site table is well-formed, and the shape guard reads real code objects."""
import re

import pytest

from tpu_closure_fix import fixes, integrations, shape, sites
from tpu_closure_fix.integrations import lightning
from tpu_closure_fix.releases import in_range


def test_every_row_is_complete():
    variants = set()
    for site in sites.CALL_SITES:
        assert site.variant not in variants, site.variant
        variants.add(site.variant)
        assert re.match(r"^[a-z_]+(\.[a-z_0-9]+)+$", site.module), site.module
        # a private method is named as the class holds it: ``Class._Class__step`` (name-mangled)
        assert re.match(r"^([A-Za-z0-9]+\.)?[a-z_]+$", site.qualname) or \
            re.match(r"^([A-Za-z0-9]+)\._\1__[a-z_]+$", site.qualname), site.qualname
        assert site.module.startswith(site.package), (site.module, site.package)
        assert site.integration in integrations.NAMES
        assert all(isinstance(release, str) and fingerprint for release, fingerprint in site.fingerprints)
        if site.inherits:
            assert site.fix is None and site.shape is None
        else:
            assert isinstance(site.shape, shape.Shape)
            assert site.fix is None or isinstance(site.fix, fixes.Fix)


def test_ranges_of_one_site_do_not_overlap():
    probes = ["%d.%d.%d" % (a, b, c) for a in (1, 2) for b in range(10) for c in range(12)]
    for key in sites.site_keys():
        rows = sites.rows_for(*key)
        for release in probes:
            matching = [r.variant for r in rows if in_range(release, r.releases)]
            assert len(matching) <= 1, (key, release, matching)


def test_affected_history_is_encoded():
    # Trainer: buggy up to 1.8.x, fixed from 1.9.0; Lite/Fabric buggy through 2.6.6.
    def verdicts(package, release):
        return {s.variant: (s.fix is not None) for s in sites.CALL_SITES
                if s.package == package and not s.inherits and in_range(release, s.releases)}

    assert set(verdicts("pytorch_lightning", "1.8.6").values()) == {True}
    assert set(verdicts("pytorch_lightning", "1.2.0").values()) == {True}
    assert set(verdicts("pytorch_lightning", "1.9.0").values()) == {False}
    assert set(verdicts("pytorch_lightning", "2.6.6").values()) == {False}
    assert set(verdicts("lightning_fabric", "2.6.6").values()) == {True}
    assert set(verdicts("lightning_lite", "1.8.0").values()) == {True}
    assert verdicts("lightning_fabric", "2.7.0") == {}


def test_shape_reads_parameters_and_names():
    def optimizer_step(self, optimizer, model, optimizer_idx, closure, **kwargs):
        import torch_xla.core.xla_model as xm  # noqa: F401  (never executed)

        closure = self._wrap_closure(model, optimizer, optimizer_idx, closure)
        return xm.optimizer_step(optimizer, optimizer_args={"closure": closure, **kwargs})

    assert lightning.TRAINER_OPTIMIZER_FIRST.check(optimizer_step).ok
    result = lightning.TRAINER_MODEL_FIRST.check(optimizer_step)
    assert not result.ok and "parameters" in result.reason

    def upstream(self, optimizer, model, optimizer_idx, closure, **kwargs):
        closure = self._tpu_wrap_closure(optimizer, closure)
        closure = self._wrap_closure(model, optimizer, optimizer_idx, closure)
        result = optimizer.step(closure=closure, **kwargs)
        xm.mark_step()  # noqa: F821
        return result

    assert lightning.FIXED_1_9.check(upstream).ok
    bad = lightning.TRAINER_OPTIMIZER_FIRST.check(upstream)
    assert not bad.ok and "lacks" in bad.reason


def test_bind_maps_positional_and_keyword_calls():
    names = ("optimizer", "model", "optimizer_idx", "closure")
    values, extra = fixes.bind(names, ("o", "m"), {"optimizer_idx": 0, "closure": "c", "foo": 1})
    assert values == {"optimizer": "o", "model": "m", "optimizer_idx": 0, "closure": "c"}
    assert extra == {"foo": 1}
    with pytest.raises(fixes._Unbindable):
        fixes.bind(names, ("o",), {})
    with pytest.raises(fixes._Unbindable):
        fixes.bind(names, ("o", "m", 0, "c", "extra"), {})


def test_every_integration_declares_its_rows_and_packages():
    loaded = integrations.load()
    assert [integration.NAME for integration in loaded] == list(integrations.NAMES)
    for integration in loaded:
        assert integration.CALL_SITES and all(site.integration == integration.NAME for site in integration.CALL_SITES)
        tops = {site.package.split(".")[0] for site in integration.CALL_SITES}
        watched = {package.split(".")[0] for package in integration.PACKAGES}
        assert tops <= watched, (integration.NAME, tops - watched)
    assert sites.CALL_SITES == tuple(site for integration in loaded for site in integration.CALL_SITES)


def test_recorded_fingerprints_agree_with_the_measured_releases():
    """Each row's (release, fingerprint) pairs are those measured from the wheels (docs/fingerprints.json),
    one per distinct code, and every fixed Lightning row has at least one."""
    import json
    import os

    with open(os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(__file__))), "docs",
                           "fingerprints.json")) as handle:
        measured = json.load(handle)
    for site in sites.CALL_SITES:
        if site.integration != "lightning" or site.inherits or (site.fix is None and not site.fingerprints):
            continue
        assert site.fingerprints, site.variant
        assert len({fp for _, fp in site.fingerprints}) == len(site.fingerprints), site.variant
        for release, fingerprint in site.fingerprints:
            assert measured[site.variant][release] == fingerprint, (site.variant, release)
        assert {fp for _, fp in site.fingerprints} == set(measured[site.variant].values()), site.variant


def test_fingerprint_check_against_the_table_is_by_code_not_by_release_name():
    """The table names each distinct code once (by its newest release): a measured release of the row is
    right when its fingerprint is one the row records; against a per-release file it must match exactly."""
    import importlib.util
    import os

    path = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(__file__))), "scripts", "fingerprints.py")
    spec = importlib.util.spec_from_file_location("tcf_fingerprints_script", path)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    table = {"fabric-1.9": {"2.0.9": "sha256:a"}}
    assert script.compare({"fabric-1.9": {"1.9.5": "sha256:a"}}, table, by_release=False) == []
    assert script.compare({"fabric-1.9": {"1.9.5": "sha256:b"}}, table, by_release=False)
    assert script.compare({"fabric-1.9": {"1.9.5": "sha256:a"}}, table, by_release=True)


# ------------------------------------------------------------------ release ranges without packaging.specifiers

_TRICKY = ["0.4.0", "1.2.0rc1", "1.2.0", "1.8.6", "1.8.6.post1", "1.9.0rc0", "1.9.0.dev3", "1.9.0", "1.9.0+cu118",
           "2.6.6", "2.6.7rc1", "2.6.7", "2.6.7.post1", "2.1.0+libtpu", "2.1.0rc2", "2.9.0+git1a2b3c",
           "2.10.0a0", "2.10", "1!0.1", "1.15.0", "1.15.1.dev0", "1.15.1", "0.27.2", "0.28.0b1", "3.0"]


def test_in_range_agrees_with_packaging_specifiers_on_every_table_range():
    """The table's ranges are decided without importing packaging.specifiers; the result must equal
    SpecifierSet.contains(prereleases=True) for releases of every kind (pre, post, dev, local, epoch)."""
    from packaging.specifiers import SpecifierSet

    from tpu_closure_fix import releases, sites

    ranges = sorted({row.releases for row in sites.CALL_SITES}) + [">=1.2.0rc1,<2.6.7rc2", ">=2.1.0"]
    checked = 0
    for spec in ranges:
        for release in _TRICKY:
            want = SpecifierSet(spec).contains(release, prereleases=True)
            assert releases.in_range(release, spec) is want, (release, spec, want)
            checked += 1
    assert checked >= len(_TRICKY) * 10


def test_table_ranges_take_the_fast_path_and_others_fall_back():
    """Every range of the table is parsed without packaging.specifiers (asserted in a fresh interpreter);
    a clause of another kind (``~=``, ``==``, ``!=``) is still answered, by packaging.specifiers."""
    import subprocess
    import sys

    code = ("import sys; from tpu_closure_fix import releases, sites\n"
            "[releases.in_range('1.8.6', row.releases) for row in sites.CALL_SITES]\n"
            "print('packaging.specifiers' in sys.modules)")
    env = dict(__import__("os").environ, TPU_CLOSURE_FIX="0")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert out.stdout.strip().splitlines()[-1] == "False", out.stdout + out.stderr

    from tpu_closure_fix import releases

    assert releases.in_range("1.8.3", "~=1.8.0") and not releases.in_range("1.9.0", "~=1.8.0")
    assert releases.in_range("2.0.9", "==2.0.*") and not releases.in_range("2.1.0", "!=2.1.0,>=2.0")
    assert not releases.in_range("not a version", ">=1.0")


def test_fingerprint_table_reads_one_row_per_variant_with_every_pair_in_order():
    table = sites.fingerprint_table("""
    # a comment line, then rows; a trailing comment is not a pair
    a-1   1.0=sha256:00  1.2=sha256:01
    b-2   2.0=sha256:02  # same code as before
    """)
    assert table == {"a-1": (("1.0", "sha256:00"), ("1.2", "sha256:01")), "b-2": (("2.0", "sha256:02"),)}


@pytest.mark.parametrize("text", ["a-1", "a-1 1.0", "a-1 1.0=x=y", "a-1 1.0=x\na-1 1.2=y"],
                         ids=["no-pair", "no-equals", "two-equals", "variant-twice"])
def test_fingerprint_table_refuses_a_bad_row_naming_it(text):
    with pytest.raises(ValueError, match="fingerprint table: bad row 'a-1"):
        sites.fingerprint_table(text)
