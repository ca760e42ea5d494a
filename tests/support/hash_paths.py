"""Both ways a CPU tensor is hashed, for the fingerprint tests: XXH3 (the ``xxhash`` package, the default where
it imports) and the elementwise hash (the fallback where it does not, the hash XLA computes on the device)."""
import pytest

from tpu_closure_fix.synccheck import fingerprint


@pytest.fixture(params=["xxh3", "elementwise"], autouse=True)
def hash_path(request, monkeypatch):
    """Run the test once per path: "elementwise" makes ``xxhash`` read as not importable, as on a machine
    without it; "xxh3" needs it installed (it is a dependency of the package)."""
    if request.param == "elementwise":
        monkeypatch.setattr(fingerprint, "_xxhash", [None])
    elif fingerprint.xxhash_module() is None:
        pytest.skip("the xxhash package does not import here: pip install 'xxhash>=3.0' to test the XXH3 path")
    assert fingerprint.uses_xxh3() == (request.param == "xxh3")
    return request.param
