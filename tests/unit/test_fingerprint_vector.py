"""The fingerprint's guarantees, read on the WHOLE vector (fingerprint.local_vector, after decode), not on one
field: one changed word always changes it, each 32-bit value survives its two 16-bit halves, the value sums
and their scale are what they say, and edge tensors (empty, finite values whose sum overflows float32) are
fingerprinted as such. test_fingerprint_dtypes.py covers every dtype; this file the vector's fields."""
import itertools

import pytest

torch = pytest.importorskip("torch", reason="the fingerprint hashes torch tensors: no torch here")

from tpu_closure_fix.synccheck import fingerprint  # noqa: E402  (after the skip: needs torch)
from support.hash_paths import hash_path  # noqa: E402,F401  (autouse: every test on both CPU hashes)

SLOTS = 8


def _vector(tensors, **kwargs):
    kwargs.setdefault("slots", SLOTS)
    return fingerprint.local_vector(list(tensors), **kwargs)


def _decoded(tensors, **kwargs):
    return fingerprint.decode(_vector(tensors, **kwargs), slots=kwargs.get("slots", SLOTS))


def _joined(decoded, field, slot):
    """The 32-bit value of a per-slot hash field (its max copy), joined from its halves."""
    hi, lo = decoded[field + "_hi"][0][slot], decoded[field + "_lo"][0][slot]
    return int(hi) << 16 | int(lo)


def _random(dtype, n, seed):
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(n, generator=gen).to(dtype)


@pytest.mark.parametrize("position", [0, 1], ids=["first-tensor", "second-tensor"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.int64],
                         ids=str)
def test_one_changed_word_always_changes_the_whole_vector(dtype, position):
    """Every bit of every word of a tensor: flipped alone, the vector differs (in its exact part). The first
    tensor's first word has key 0: its multiplier must still be odd (never 0)."""
    t = _random(dtype, 3, 1) if dtype.is_floating_point else torch.tensor([5, -7, 1 << 40], dtype=dtype)
    others = [_random(torch.float32, 2, 2)][:position]
    base = _vector(others + [t])
    exact = fingerprint._layout(SLOTS)[0]
    raw = t.view(torch.uint8)
    for byte, bit in itertools.product(range(raw.numel()), range(8)):
        changed = t.clone()
        changed.view(torch.uint8)[byte] ^= 1 << bit
        other = _vector(others + [changed])
        assert not torch.equal(base[:exact], other[:exact]), (dtype, byte, bit)
        assert not torch.equal(base[exact:2 * exact], other[exact:2 * exact]), (dtype, byte, bit)  # the -v copy


def test_identical_tensors_give_identical_vectors():
    ts = [_random(torch.float32, 5, 3), _random(torch.float64, 4, 4)]
    assert torch.equal(_vector(ts), _vector([t.clone() for t in ts]))


def test_each_slots_bit_hash_is_carried_whole_in_its_halves():
    """Every bit of the 32-bit hash (bit 0 and bit 16 included) reaches the vector: the halves join back to
    exactly the tensor's bit hash, for hashes whose bits take both values."""
    tensors = [_random(torch.float32, 6, seed) for seed in range(SLOTS)]
    decoded = _decoded(tensors)
    hashes = [fingerprint.unsigned32(int(fingerprint.tensor_hash(t, k))) for k, t in enumerate(tensors)]
    for bit in (0, 15, 16, 31):  # the test itself: these bits vary among the hashes
        assert len({h >> bit & 1 for h in hashes}) == 2, bit
    assert [_joined(decoded, "bits", k) for k in range(SLOTS)] == hashes
    low = -_vector(tensors)[fingerprint._layout(SLOTS)[0]:fingerprint._layout(SLOTS)[1]]  # the min copy
    assert torch.equal(low, _vector(tensors)[:fingerprint._layout(SLOTS)[0]])


def test_halves_keep_every_bit():
    for bit in range(32):
        hi, lo = fingerprint._halves(1 << bit)
        assert (int(hi) << 16 | int(lo)) == 1 << bit and hi < 65536 and lo < 65536
    assert fingerprint._halves(-1) == (65535.0, 65535.0)


def test_the_structure_digest_reaches_the_header_whole():
    ts = [_random(torch.float32, 3, 0), torch.zeros(2, 2, dtype=torch.float64)]
    structures = tuple(fingerprint.describe(t) for t in ts)
    digest = fingerprint.structure_digest(structures)
    decoded = _decoded(ts)
    assert decoded["digest"] == (digest, digest)
    for bit in range(32):  # a digest differing in any one bit (bit 16 included) reads differently
        other = fingerprint._header(0, None, 2, digest ^ (1 << bit), 1)
        assert other != fingerprint._header(0, None, 2, digest, 1), bit
    assert decoded["count"] == (2.0, 2.0) and decoded["format"] == (fingerprint.vector_format(),) * 2


def test_the_step_reaches_the_header_whole():
    for step in (0, 1, 65535, 65536, 65537, (1 << 31) + 3):
        assert _decoded([torch.ones(2)], step=step)["step"] == (step, step)


def test_shape_and_dtype_hashes_per_slot():
    ts = [torch.zeros(2, 3), torch.zeros(6, dtype=torch.float64)]
    decoded = _decoded(ts)
    assert _joined(decoded, "shape", 0) == fingerprint.shape_hash(0, (2, 3))
    assert _joined(decoded, "dtype", 1) == fingerprint.dtype_hash(1, "float64")
    # same bits, another shape: the vector differs in that slot's shape hash only among the per-slot hashes
    reshaped = _decoded([torch.zeros(3, 2), ts[1]])
    assert _joined(reshaped, "shape", 0) != _joined(decoded, "shape", 0)
    assert _joined(reshaped, "bits", 0) == _joined(decoded, "bits", 0)


def test_several_tensors_in_one_slot_add_their_hashes():
    ts = [_random(torch.float32, 3, seed) for seed in range(3)]
    decoded = _decoded(ts, slots=2)  # tensors 0 and 2 share slot 0
    expected = fingerprint.unsigned32(int(fingerprint.tensor_hash(ts[0], 0))
                                      + int(fingerprint.tensor_hash(ts[2], 2)))
    assert _joined(decoded, "bits", 0) == expected
    assert float(decoded["sum"][0][0]) == pytest.approx(float(ts[0].sum() + ts[2].sum()), rel=1e-6)
    for field, hashed, described in (("shape", fingerprint.shape_hash, (3,)), ("dtype", fingerprint.dtype_hash,
                                                                               "float32")):
        assert _joined(decoded, field, 0) == fingerprint.unsigned32(hashed(0, described) + hashed(2, described))


def test_value_sum_and_its_scale():
    t = torch.tensor([1.5, -2.25, 4.0, -0.25])
    decoded = _decoded([t])
    assert float(decoded["sum"][0][0]) == float(decoded["sum"][1][0]) == 3.0
    assert float(decoded["abs_sum"][0]) == 8.0
    assert float(decoded["nonfinite"][0][0]) == 0.0


@pytest.mark.parametrize("chunk", [2, 3, 1 << 18])
def test_value_sums_are_the_same_whatever_the_chunk(chunk):
    t = torch.tensor([1.0, -2.0, 3.0, float("nan"), 5.0, float("inf"), -7.0])
    nonfinite, total, scale = fingerprint.value_sums(t, chunk=chunk)
    assert float(nonfinite) == 2.0 and torch.isnan(total)
    finite = torch.tensor([1.0, -2.0, 3.0, -4.0, 5.0])
    nonfinite, total, scale = fingerprint.value_sums(finite, chunk=chunk)
    assert (float(nonfinite), float(total), float(scale)) == (0.0, 3.0, 15.0)


def test_the_bit_hash_is_the_same_whatever_the_chunk():
    t = _random(torch.float64, 7, 5)
    assert int(fingerprint.bit_hash(t, 3, chunk=4)) == int(fingerprint.bit_hash(t, 3, chunk=1 << 18))
    assert int(fingerprint.bit_hash(t, 3)) != int(fingerprint.bit_hash(t, 4))  # the position is in the key


def test_a_finite_sum_that_overflows_float32_is_not_called_non_finite():
    t = torch.tensor([3.0e38, 3.0e38, -1.0], dtype=torch.float32)
    nonfinite, total, scale = fingerprint.value_sums(t)
    assert float(nonfinite) == 0.0 and torch.isinf(total)
    decoded = _decoded([t])
    assert float(decoded["nonfinite"][0][0]) == 0.0
    clamp = float(torch.tensor(3.0e38, dtype=torch.float32))  # an infinite sum travels as this finite bound
    assert float(decoded["sum"][0][0]) == clamp and float(decoded["abs_sum"][0]) == clamp


def test_non_finite_values_are_counted():
    t = torch.tensor([1.0, float("nan"), float("-inf"), 2.0])
    decoded = _decoded([t])
    assert float(decoded["nonfinite"][0][0]) == 2.0
    assert float(decoded["sum"][0][0]) == 0.0  # NaN sum travels as 0 (the count says it)


def test_an_empty_floating_point_parameter_is_fingerprinted():
    empty = torch.zeros(0, dtype=torch.float32)
    assert [float(v) for v in fingerprint.value_sums(empty)] == [0.0, 0.0, 0.0]
    assert int(fingerprint.bit_hash(empty, 0)) == 0
    decoded = _decoded([empty, torch.ones(2)])
    assert decoded["count"] == (2.0, 2.0)
    assert bool(decoded["compared"][0]) and bool(decoded["compared"][1])
    assert _joined(decoded, "shape", 0) == fingerprint.shape_hash(0, (0,))
    assert not torch.equal(_vector([empty, torch.ones(2)]), _vector([torch.zeros(1), torch.ones(2)]))


def test_integer_tensors_have_no_value_sums_but_their_bits():
    t = torch.tensor([3, -4], dtype=torch.int32)
    assert [float(v) for v in fingerprint.value_sums(t)] == [0.0, 0.0, 0.0]
    other = torch.tensor([3, -5], dtype=torch.int32)
    assert int(fingerprint.tensor_hash(t, 0)) != int(fingerprint.tensor_hash(other, 0))


def test_absent_slots_are_minus_infinity_in_every_copy():
    decoded = _decoded([torch.ones(2)])
    assert bool(decoded["compared"][0]) and not bool(decoded["compared"][1:].any())
    assert float(decoded["bits_hi"][0][1]) == float("-inf") and float(decoded["bits_hi"][1][1]) == float("inf")
    assert float(decoded["abs_sum"][1]) == float("-inf")
    assert fingerprint.slots_differing(decoded, "bits_hi", "bits_lo").tolist() == [False] * SLOTS


def test_a_max_reduction_of_two_replicas_reads_both_extremes():
    a, b = torch.tensor([1.0, 2.0]), torch.tensor([1.0, 3.0])
    reduced = torch.maximum(_vector([a]), _vector([b]))
    decoded = fingerprint.decode(reduced, slots=SLOTS)
    assert decoded["sum"][0][0] == 4.0 and decoded["sum"][1][0] == 3.0
    assert fingerprint.slots_differing(decoded, "bits_hi", "bits_lo").tolist() == [True] + [False] * (SLOTS - 1)
    same = fingerprint.decode(torch.maximum(_vector([a]), _vector([a.clone()])), slots=SLOTS)
    assert not fingerprint.slots_differing(same, "bits_hi", "bits_lo", "nonfinite").any()


def test_a_failed_replica_vector_says_so_with_its_step():
    v = fingerprint.failed_vector(slots=SLOTS, step=70000, lanes=2)
    decoded = fingerprint.decode(v, slots=SLOTS)
    assert decoded["failed"] == (1.0, 1.0) and decoded["step"] == (70000, 70000)
    assert decoded["lanes"] == (2.0, 2.0) and decoded["count"] == (0.0, 0.0)
    assert not bool(decoded["compared"].any())
    assert v.numel() == fingerprint.vector_length(SLOTS)


def test_vector_length_counts_every_field():
    v = _vector([torch.ones(1)])
    assert v.numel() == fingerprint.vector_length(SLOTS) == (2 * (len(fingerprint.HEADER) + 8 * SLOTS)
                                                            + 2 * SLOTS + SLOTS)


def test_signed32_and_unsigned32_are_inverse_mod_2_32():
    for value in (0, 1, (1 << 31) - 1, 1 << 31, (1 << 32) - 1, 1 << 32, -1):
        s = fingerprint.signed32(value)
        assert -(1 << 31) <= s < (1 << 31) and fingerprint.unsigned32(s) == value & 0xFFFFFFFF


def test_replicas_with_different_structures_read_two_digests():
    a = _vector([torch.zeros(2, 3)])
    b = _vector([torch.zeros(3, 2)])
    decoded = fingerprint.decode(torch.maximum(a, b), slots=SLOTS)
    high, low = decoded["digest"]
    assert high != low  # max and min of each half differ: "the replicas disagree on the structure"
    same = fingerprint.decode(torch.maximum(a, a.clone()), slots=SLOTS)["digest"]
    assert same[0] == same[1] == fingerprint.structure_digest(((((2, 3)), "float32"),))


def test_a_slot_differs_when_any_field_differs():
    t = torch.tensor
    decoded = {"a": (t([1.0, 0.0, 2.0]), t([0.0, 0.0, 2.0])), "b": (t([0.0, 5.0, 2.0]), t([0.0, 4.0, 2.0])),
               "compared": t([True, True, True])}
    assert fingerprint.slots_differing(decoded, "a", "b").tolist() == [True, True, False]
    assert fingerprint.slots_differing(decoded, "a").tolist() == [True, False, False]
    decoded["compared"] = t([False, True, True])  # a slot no replica holds never differs
    assert fingerprint.slots_differing(decoded, "a", "b").tolist() == [False, True, False]


@pytest.mark.parametrize("position, offset", [(0, 0), (3, 0), (7, 1000), (123456, (1 << 31) + 5)])
def test_keyed_contributions_of_position_keys_are_the_hash_s_contributions(position, offset):
    """benchmarks/synccheck_collisions.py studies the hash one word at a time through ``position_keys`` and
    ``keyed_contributions``: word for word they give what ``contributions`` gives (offsets past 2**31
    included, where the keys wrap into negative int32)."""
    gen = torch.Generator().manual_seed(position)
    chunk = torch.randint(-(1 << 31), 1 << 31, (64,), dtype=torch.int64, generator=gen).to(torch.int32)
    keys = fingerprint.position_keys(torch.arange(offset, offset + 64, dtype=torch.int64), position)
    assert keys.dtype == torch.int32
    assert torch.equal(fingerprint.keyed_contributions(chunk, keys), fingerprint.contributions(chunk, offset, position))
