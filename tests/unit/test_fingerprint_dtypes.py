"""Every dtype torch has is fingerprinted bit for bit: one flipped bit of one element changes the vector.

float8 and the packed float4 have no sums in torch (their value sums are taken in float32, or not at
all for packed formats), complex32 is experimental, quantized tensors keep their integers apart from
their scale: none of that may cost the bit hash its exactness.
"""
import pytest

torch = pytest.importorskip("torch", reason="the fingerprint hashes torch tensors: no torch here")

from tpu_closure_fix.synccheck import fingerprint  # noqa: E402  (after the skip: needs torch)
from support.hash_paths import hash_path  # noqa: E402,F401  (autouse: every test on both CPU hashes)

QUANTIZED = {"qint8", "quint8", "qint32", "quint4x2", "quint2x4"}


def _dtypes():
    return sorted({v for v in vars(torch).values() if isinstance(v, torch.dtype)}, key=str)


def _tensor(dtype, seed):
    """A 12-element tensor of ``dtype`` with pseudo-random bits (None: torch cannot make one here)."""
    name = str(dtype).replace("torch.", "")
    gen = torch.Generator().manual_seed(seed)
    if name in QUANTIZED:
        t = torch.quantize_per_tensor(torch.rand(12, generator=gen) * 4, 0.1, 0, dtype)
        try:
            t.clone()
        except (RuntimeError, NotImplementedError):  # quint2x4/quint4x2: no kernel copies them
            return None
        return t
    try:
        t = torch.empty(12, dtype=dtype)
        raw = t.view(torch.uint8)
        t.clone()  # the sub-byte shells (int1..int7) exist as names only: no kernel copies them
    except (RuntimeError, TypeError, NotImplementedError):
        return None
    raw.copy_(torch.randint(0, 256, raw.shape, dtype=torch.uint8, generator=gen))
    if dtype == torch.bool:
        raw.bitwise_and_(1)
    return t


def _flip_one_bit(t):
    out = t.clone()
    if out.is_quantized:
        ints = out.int_repr().clone()
        ints.view(-1)[5] ^= 1
        return torch._make_per_tensor_quantized_tensor(ints, out.q_scale(), out.q_zero_point())
    raw = out.view(torch.uint8)
    raw[5] ^= 1
    return out


def test_every_dtype_of_torch_is_fingerprinted_and_one_flipped_bit_changes_the_vector():
    hashed, skipped = [], []
    for dtype in _dtypes():
        t = _tensor(dtype, 0)
        if t is None:
            skipped.append(str(dtype))
            continue
        same = fingerprint.local_vector([t.clone()])
        again = fingerprint.local_vector([t.clone()])
        assert torch.equal(same, again), dtype
        other = fingerprint.local_vector([_flip_one_bit(t)])
        exact = fingerprint._layout(fingerprint.SLOTS)[0]
        assert not torch.equal(same[:exact], other[:exact]), "%s: one flipped bit left the vector unchanged" % dtype
        hashed.append(str(dtype))
    # the float8 family and the other dtypes parameters are made of are among those hashed
    for must in ("float8_e4m3fn", "float8_e5m2", "bfloat16", "float16", "float32", "float64", "complex64",
                 "bool", "int8", "int64"):
        if hasattr(torch, must):  # float8 came with torch 2.1
            assert "torch." + must in hashed, (must, skipped)
    assert len(hashed) >= 15, (hashed, skipped)


@pytest.mark.skipif(not hasattr(torch, "float8_e4m3fn"), reason="float8 came with torch 2.1; torch %s here"
                    % torch.__version__)
def test_float8_value_sums_are_taken_in_float32():
    t = torch.tensor([1.5, -2.0, 448.0], dtype=torch.float32).to(torch.float8_e4m3fn)
    nonfinite, total, scale = fingerprint.value_sums(t)
    assert float(total) == 447.5 and float(scale) == 451.5 and float(nonfinite) == 0.0
