"""The CPU hash: XXH3-64 of each CPU tensor's raw bytes, seeded with its position, folded to the slot's 32 bits.
Every bit counts, equal bytes hash equal, the position enters, a strided view hashes as its contiguous copy,
and a process without ``xxhash`` falls back to the elementwise hash in the same vector layout."""
import itertools
import math

import pytest

torch = pytest.importorskip("torch", reason="the fingerprint hashes torch tensors: no torch here")
xxhash = pytest.importorskip("xxhash", reason="the XXH3 path needs the xxhash package: pip install 'xxhash>=3.0'")

from tpu_closure_fix.synccheck import fingerprint  # noqa: E402  (after the skips)

SLOTS = 8
DTYPES = [torch.float32, torch.float64, torch.bfloat16, torch.float16, torch.int8, torch.uint8, torch.int64,
          torch.bool, torch.complex64]


def _tensor(dtype, n=5, seed=0):
    gen = torch.Generator().manual_seed(seed)
    if dtype == torch.bool:
        return torch.randint(0, 2, (n,), generator=gen).bool()
    if dtype.is_floating_point or dtype.is_complex:
        return (torch.randn(n, generator=gen) * 3).to(dtype) if not dtype.is_complex else \
            torch.randn(n, dtype=dtype, generator=gen)
    return torch.randint(-100 if dtype != torch.uint8 else 0, 100, (n,), generator=gen).to(dtype)


def _reference(tensor, position):
    """The documented hash from a Python copy of the bytes: XXH3-64 with seed = position, high XOR low half."""
    raw = bytes(tensor.detach().contiguous().reshape(-1).view(torch.uint8).tolist())
    digest = xxhash.xxh3_64_intdigest(raw, seed=position)
    return ((digest >> 32) ^ (digest & 0xFFFFFFFF))


def _hash(tensor, position=0):
    return fingerprint.unsigned32(int(fingerprint.tensor_hash(tensor, position, cpu_hash="xxh3")))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("pass_bytes", [fingerprint.PASS_BYTES, 8, 3], ids=["one-piece", "8-byte", "3-byte"])
def test_the_hash_is_xxh3_of_the_bytes_seeded_with_the_position_whatever_the_pieces(dtype, pass_bytes):
    """Streamed piece by piece (pieces of 8 bytes and of one element when 3 bytes hold fewer than one), the
    digest is the one of the whole bytes: no byte skipped or read twice at a piece's edge."""
    t = _tensor(dtype, n=13)
    for position in (0, 1, 7, 1100):
        found = fingerprint.xxh3_fields(t, position, pass_bytes=pass_bytes)
        assert found[0] == _reference(t, position), (dtype, position)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_flipping_any_one_bit_changes_the_hash_and_the_vector(dtype):
    t = _tensor(dtype, n=4)
    base_hash, base = _hash(t), fingerprint.local_vector([t], slots=SLOTS, cpu_hash="xxh3")
    exact = fingerprint._layout(SLOTS)[0]
    raw = t.view(torch.uint8)
    bits = [0] if dtype == torch.bool else range(8)  # a bool byte holds 0 or 1
    for byte, bit in itertools.product(range(raw.numel()), bits):
        changed = t.clone()
        changed.view(torch.uint8)[byte] ^= 1 << bit
        assert _hash(changed) != base_hash, (dtype, byte, bit)
        other = fingerprint.local_vector([changed], slots=SLOTS, cpu_hash="xxh3")
        assert not torch.equal(base[:exact], other[:exact]), (dtype, byte, bit)


def test_equal_bytes_hash_equal_and_the_position_enters():
    t = _tensor(torch.float32, n=64)
    assert _hash(t, 3) == _hash(t.clone(), 3)
    assert _hash(t, 3) != _hash(t, 4)
    # two equal-shaped tensors sharing a slot (positions 0 and 2 of 2 slots), swapped: the slot's sum changes
    a, b, c = _tensor(torch.float32, 6, 1), _tensor(torch.float32, 6, 2), _tensor(torch.float32, 6, 3)
    v = fingerprint.local_vector([a, c, b], slots=2, cpu_hash="xxh3")
    swapped = fingerprint.local_vector([b, c, a], slots=2, cpu_hash="xxh3")
    exact = fingerprint._layout(2)[0]
    assert not torch.equal(v[:exact], swapped[:exact])
    # the same tensor at two positions of one slot: no cancellation, each position adds its own hash
    same = fingerprint.local_vector([a, c, a.clone()], slots=2, cpu_hash="xxh3")
    decoded = fingerprint.decode(same, slots=2)
    joined = int(decoded["bits_hi"][0][0]) << 16 | int(decoded["bits_lo"][0][0])
    assert joined == (_hash(a, 0) + _hash(a, 2)) & 0xFFFFFFFF != (2 * _hash(a, 0)) & 0xFFFFFFFF


def test_a_strided_view_hashes_as_its_contiguous_copy():
    base = _tensor(torch.float32, n=24).reshape(4, 6)
    for view in (base.t(), base[:, 1::2], base[1:3], base.reshape(-1)[5:]):
        assert _hash(view, 2) == _hash(view.contiguous(), 2) == _reference(view, 2)
    assert _hash(base.t(), 2) != _hash(base, 2)  # same bytes in another element order: another hash


def test_conjugate_and_negative_views_hash_the_values_they_stand_for():
    z = torch.randn(5, dtype=torch.complex64)
    assert z.conj().is_conj()
    assert _hash(z.conj()) == _hash(z.conj().resolve_conj()) != _hash(z)


def test_negative_zero_nan_payloads_and_quantized_integers_count():
    zero, negative_zero = torch.tensor([0.0, 1.0]), torch.tensor([-0.0, 1.0])
    assert _hash(zero) != _hash(negative_zero)
    nan_a = torch.tensor([0x7FC00000, 0], dtype=torch.int32).view(torch.float32)
    nan_b = torch.tensor([0x7FC00001, 0], dtype=torch.int32).view(torch.float32)
    assert _hash(nan_a) != _hash(nan_b)
    q = torch.quantize_per_tensor(torch.tensor([0.1, 0.5, 1.2]), 0.1, 0, torch.qint8)
    assert fingerprint.xxh3_fields(q, 0)[0] == _reference(q.int_repr(), 0)


def test_value_sums_of_the_pass_are_value_sums():
    for dtype in (torch.float32, torch.float64, torch.bfloat16, torch.float16):
        t = torch.tensor([1.5, -2.25, 4.0, -0.25, 8.0, -16.0, 0.5], dtype=dtype)
        for pass_bytes in (fingerprint.PASS_BYTES, 4):
            _, nonfinite, total, scale = fingerprint.xxh3_fields(t, 0, pass_bytes=pass_bytes)
            assert (float(nonfinite), float(total), float(scale)) == (0.0, -4.5, 32.5), (dtype, pass_bytes)
    t = torch.tensor([1.0, float("nan"), 2.0, float("-inf"), float("inf")])
    _, nonfinite, total, _ = fingerprint.xxh3_fields(t, 0, pass_bytes=8)
    assert float(nonfinite) == 3.0 and math.isnan(float(total))
    q = torch.quantize_per_tensor(torch.tensor([0.1, 0.5, 1.2]), 0.1, 0, torch.qint8)
    assert [float(v) for v in fingerprint.xxh3_fields(q, 0)[1:]] == [float(v) for v in fingerprint.value_sums(q)]
    ints = torch.tensor([3, -4])
    assert [float(v) for v in fingerprint.xxh3_fields(ints, 0)[1:]] == [0.0, 0.0, 0.0]


@pytest.mark.parametrize("values", [[1.5, -2.25, 4.0], [-0.0, -0.0], [0.0, -0.0], [1.0, float("nan")],
                                    [float("-inf"), 2.0], [], [3.0e38, 3.0e38]],
                         ids=["plain", "negative-zero-sum", "mixed-zeros", "nan", "inf", "empty", "overflow"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.float16], ids=str)
def test_a_tensor_of_one_piece_gets_the_same_fields_as_streamed_in_one_piece(values, dtype):
    """The one-piece pass (one hash call, no running total) gives bit for bit what the streamed pass gives the
    same single piece; no sum reads -0.0 (0.0 in both, as in value_sums)."""
    raw = torch.tensor(values, dtype=torch.float32).to(dtype)
    for scale in (True, False):
        one = fingerprint._one_piece(raw, 5, True, scale)
        streamed = fingerprint._streamed([raw], 5, True, scale)
        assert repr(one) == repr(streamed), (one, streamed)
    if values == [-0.0, -0.0]:
        assert math.copysign(1.0, fingerprint.xxh3_fields(raw, 0)[2]) == 1.0
        assert math.copysign(1.0, float(fingerprint.value_sums(raw)[1])) == 1.0


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64], ids=str)
def test_a_tensor_that_fits_one_piece_is_hashed_in_one_call_and_a_larger_one_streamed(monkeypatch, dtype):
    passes = []
    for name in ("_one_piece", "_streamed"):
        real = getattr(fingerprint, name)
        monkeypatch.setattr(fingerprint, name, lambda *args, _name=name, _real=real: passes.append(_name) or
                            _real(*args))
    size = torch.empty(0, dtype=dtype).element_size()
    for n in (1, 4, 5):
        fingerprint.xxh3_fields(_tensor(dtype, n), 0, pass_bytes=4 * size)
    assert passes == ["_one_piece", "_one_piece", "_streamed"]


def test_without_the_scale_the_pass_gives_the_same_hash_count_and_sum_and_no_scale(monkeypatch):
    """``scale=False`` leaves out the sum of |values| (no abs of any piece) and changes nothing else."""
    t = torch.tensor([1.5, -2.25, float("nan"), 4.0, -0.25, float("inf")] * 50)
    for pass_bytes in (fingerprint.PASS_BYTES, 16):
        full = fingerprint.xxh3_fields(t, 3, pass_bytes=pass_bytes)
        monkeypatch.setattr(torch, "abs", None)  # any abs taken fails
        light = fingerprint.xxh3_fields(t, 3, pass_bytes=pass_bytes, scale=False)
        monkeypatch.undo()
        assert light[3] is None and math.isnan(full[3])
        assert light[0] == full[0] and light[1] == full[1] == 100.0 and math.isnan(light[2]) and math.isnan(full[2])
    finite = torch.tensor([1.5, -2.25, 4.0])
    assert fingerprint.xxh3_fields(finite, 0, scale=False) == fingerprint.xxh3_fields(finite, 0)[:3] + (None,)


def test_a_vector_without_the_scale_differs_only_in_its_absent_abs_sums():
    ts = [_tensor(dtype, 9, i) for i, dtype in enumerate((torch.float32, torch.float64, torch.bfloat16))]
    details, kept = {}, {}
    light = fingerprint.decode(fingerprint.local_vector(ts, slots=SLOTS, details=details, scale=False), slots=SLOTS)
    full = fingerprint.decode(fingerprint.local_vector(ts, slots=SLOTS, details=kept), slots=SLOTS)
    assert details == {} and set(kept) == {"hashes", "stats"}
    assert light["abs_sum"].tolist() == [float("-inf")] * SLOTS and bool((full["abs_sum"][:3] > 0).all())
    for name in fingerprint.SLOT_EXACT + ("sum",):
        assert all(torch.equal(a, b) for a, b in zip(light[name], full[name])), name


def _both_vectors(ts, slots_of, step, lanes, scale):
    """(the host path's vector, _assembled's) of the same tensors, slots and header."""
    cpu = torch.device("cpu")
    entries = [(k, slot, t) for k, (slot, t) in enumerate(zip(slots_of, ts))]
    held = tuple((k, slot) + fingerprint.describe(t) for k, slot, t in entries)
    structures = tuple(h[2:] for h in held)
    fast = [fingerprint.xxh3_fields(t, k, scale=scale) for k, _, t in entries]
    hashes, stats = fingerprint._per_tensor_fields(entries, fingerprint.CHUNK, True, cpu, scale, fast)
    header = torch.tensor(fingerprint._header(0, step, len(structures), fingerprint.structure_digest(structures),
                                              lanes, form=fingerprint.FORMAT_XXH3), dtype=torch.float32)
    return (fingerprint._host_vector(fast, held, structures, SLOTS, step, lanes, fingerprint.FORMAT_XXH3, scale),
            fingerprint._assembled(held, hashes, stats, header, SLOTS, cpu, scale))


@pytest.mark.parametrize("scale", [True, False])
def test_the_host_vector_is_bit_for_bit_the_assembled_one(scale):
    """Every field, bit for bit (-0.0 is not 0.0 here): NaN, inf and huge sums, negative zeros, absent slots,
    the header's step and lanes; a second layout and a second step of the first (the cached template)."""
    big = torch.full((3,), 3.3e38)
    cases = [
        ([torch.tensor([1.5, -2.25]), torch.tensor([float("nan"), 1.0]), torch.tensor([-0.0, 0.0]),
          torch.tensor([float("inf"), 2.0], dtype=torch.float64), big, -big, torch.tensor([1, -7]),
          torch.tensor([complex(float("inf"), 1.0)])],  # summed apart (value_sums): its |values| sum is inf
         [0, 2, 3, 5, 6, 7, 1, 4]),
        ([torch.randn(5, 3, generator=torch.Generator().manual_seed(1)), torch.zeros(4, dtype=torch.bfloat16)], [4, 0]),
    ]
    for ts, slots_of in cases:
        for step, lanes in ((None, 1), (70000, 2), (3, 1)):
            quick, slow = _both_vectors(ts, slots_of, step, lanes, scale)
            assert torch.equal(quick.view(torch.int32), slow.view(torch.int32)), (slots_of, step)


def test_local_vector_builds_on_the_host_only_where_each_slot_holds_one_tensor(monkeypatch):
    built = []
    monkeypatch.setattr(fingerprint, "_host_vector", lambda *a: built.append("host") or torch.zeros(1))
    ts = [_tensor(torch.float32, 9, i) for i in range(3)]
    fingerprint.local_vector(ts, slots=SLOTS)
    assert built == ["host"]
    shared = [(0, 1, ts[0]), (1, 1, ts[1])]  # two tensors in one slot: their fields are added up by _assembled
    assert fingerprint.local_vector(shared, slots=SLOTS).numel() == fingerprint.vector_length(SLOTS)
    assert built == ["host"]


def test_tensor_subclasses_and_other_devices_are_hashed_elementwise():
    class Marked(torch.Tensor):
        pass

    t = _tensor(torch.float32, n=6)
    marked = t.as_subclass(Marked)
    assert fingerprint.hashed_bytes(marked) is None and fingerprint.hashed_bytes(t.to("meta")) is None
    assert int(fingerprint.tensor_hash(marked, 1, cpu_hash="xxh3")) == int(fingerprint.bit_hash(t, 1))
    assert int(fingerprint.tensor_hash(t, 1, cpu_hash="xxh3")) != int(fingerprint.bit_hash(t, 1))
    # one vector holding both: each tensor gets its own hash in its own slot
    decoded = fingerprint.decode(fingerprint.local_vector([t, marked], slots=SLOTS, cpu_hash="xxh3"), slots=SLOTS)
    joined = [int(decoded["bits_hi"][0][k]) << 16 | int(decoded["bits_lo"][0][k]) for k in (0, 1)]
    assert joined == [_hash(t, 0), fingerprint.unsigned32(int(fingerprint.bit_hash(t, 1)))]


def test_the_vector_says_which_hash_its_cpu_tensors_got(monkeypatch):
    """The XXH3 vector and the elementwise one share every field but the format and the bit hashes; a MAX of
    the two reads as two formats (unverified), never as tensors that differ."""
    ts = [_tensor(torch.float32, 5, 1), _tensor(torch.bfloat16, 3, 2)]
    fast = fingerprint.local_vector(ts, slots=SLOTS, cpu_hash="xxh3")
    slow = fingerprint.local_vector(ts, slots=SLOTS, cpu_hash="elementwise")
    a, b = fingerprint.decode(fast, slots=SLOTS), fingerprint.decode(slow, slots=SLOTS)
    assert a["format"][0] == fingerprint.FORMAT_XXH3 and b["format"][0] == fingerprint.FORMAT
    for field in ("present", "shape_hi", "shape_lo", "dtype_hi", "dtype_lo", "nonfinite"):
        assert torch.equal(a[field][0], b[field][0]), field
    assert torch.allclose(a["sum"][0][:2], b["sum"][0][:2]) and a["digest"] == b["digest"]
    assert not torch.equal(a["bits_lo"][0][:2], b["bits_lo"][0][:2])
    mixed = fingerprint.decode(torch.maximum(fast, slow), slots=SLOTS)
    assert mixed["format"] == (float(fingerprint.FORMAT_XXH3), float(fingerprint.FORMAT))
    failed = fingerprint.decode(fingerprint.failed_vector(slots=SLOTS, cpu_hash="xxh3"), slots=SLOTS)
    assert failed["format"][0] == fingerprint.FORMAT_XXH3  # a failed replica still reads as its own format


def test_without_xxhash_the_vector_is_the_elementwise_one(monkeypatch):
    ts = [_tensor(torch.float32, 5, 1), _tensor(torch.int64, 3, 2)]
    monkeypatch.setattr(fingerprint, "_xxhash", [None])
    assert not fingerprint.uses_xxh3() and fingerprint.vector_format() == fingerprint.FORMAT
    fallback = fingerprint.local_vector(ts, slots=SLOTS)
    assert torch.equal(fallback, fingerprint.local_vector(ts, slots=SLOTS, cpu_hash="elementwise"))
    assert fallback.numel() == fingerprint.vector_length(SLOTS)
    with pytest.raises(ValueError, match="pip install 'xxhash>=3.0'"):
        fingerprint.local_vector(ts, slots=SLOTS, cpu_hash="xxh3")


def test_an_unknown_cpu_hash_is_refused_naming_the_accepted_values():
    with pytest.raises(ValueError, match="cpu_hash must be None, 'xxh3' or 'elementwise'; got 'sha1'"):
        fingerprint.local_vector([torch.ones(2)], cpu_hash="sha1")


def test_a_floating_point_tensor_is_read_in_one_pass(monkeypatch):
    """Plain float tensors get their sums in the hashing pass: neither the elementwise hash nor a second pass
    of value_sums runs for them (a NaN among the values adds the count's pass, as in value_sums)."""
    def refused(*args, **kwargs):
        raise AssertionError("a second pass over a plain floating-point tensor")

    monkeypatch.setattr(fingerprint, "value_sums", refused)
    monkeypatch.setattr(fingerprint, "bit_hash", refused)
    ts = [_tensor(dtype, 9, i) for i, dtype in enumerate((torch.float32, torch.float64, torch.bfloat16,
                                                          torch.float16))]
    decoded = fingerprint.decode(fingerprint.local_vector(ts, slots=SLOTS, cpu_hash="xxh3"), slots=SLOTS)
    assert decoded["format"][0] == fingerprint.FORMAT_XXH3 and bool(decoded["compared"][:4].all())
