"""Parameter fingerprints for SyncCheck: one fixed-length float32 vector per replica and check.

What a replica contributes to a check is :func:`local_vector`; after ONE all-reduce with MAX of that
vector across replicas, :func:`decode` tells, for every field, its largest and smallest value over
the replicas. The comparison logic (outcomes, messages) is in :mod:`tpu_closure_fix.synccheck`.

The bit hash of one tensor
--------------------------
The tensor's raw bits are read as 32-bit words: 4-byte elements are one word, 8-byte elements two
words, 2-byte elements (bf16, fp16) and 1-byte elements are widened bit-for-bit to one word each
(their bit pattern is kept; only the padding is added). Word ``w`` at word index ``i`` of the tensor
with position ``k`` in the model contributes ``mix(w XOR key) * (key * P3 OR 1)`` where ``key = i * P1
+ k * P2`` and ``mix`` is the "lowbias32" integer hash (xorshift-multiply rounds), a bijection of 32-bit
words; all mod 2^32. The tensor's hash is the sum of the contributions mod 2^32 (int32 arithmetic that
wraps around). The position-dependent odd multiplier decorrelates the changes of different words:
without it, the same bit change at two positions (e.g. both signs flipped, or one ulp up here and one
down there) cancelled about 15 times more often than 2^-32 (benchmarks/synccheck_collisions.py).

Guarantee:

* identical bits give identical hashes (the computation is exact integer arithmetic, the same on
  CPU and on XLA: tests/xla checks the XLA lowering bit for bit against the CPU result);
* a change of any ONE word (one element off by one ulp, a flipped sign, a NaN payload) always
  changes the hash: ``XOR key``, ``mix`` and the odd multiplier are bijections, so that word's
  contribution changes and nothing else does;
* a difference in two or more words goes unseen only if the changed contributions happen to cancel
  mod 2^32; for the mix's pseudo-random contributions that has probability about 2^-32 (2.3e-10)
  per differing tensor, also for sum-preserving changes (+e on one element, -e on another) and for
  permuted rows, whose words move to other keys. benchmarks/synccheck_collisions.py measures it.

The vector
----------
The model's tensors go to ``SLOTS`` slots (tensor ``k`` to slot ``k % SLOTS``); a model with more
tensors than slots hashes several tensors into one slot (their hashes add up mod 2^32), so a
difference is then located to a slot's group of tensors. Fields, all exact small integers or floats:

* header: format version, a "this replica could not fingerprint" flag, the tensor count and a
  32-bit digest of the model's structure (every tensor's shape and dtype, in order);
* per slot: a 32-bit hash of the shapes and one of the dtypes of its tensors, the 32-bit bit hash,
  the count of non-finite elements, the float32 sum of the values (for "by how much") and the sum of
  their absolute values (the scale of that sum).

32-bit hashes travel as two 16-bit halves, exact in float32. Every exact field ``v`` is stored
twice, as ``v`` and ``-v``: after a MAX all-reduce the first gives the largest value over the
replicas and the second minus the smallest, so ONE collective says, for every field, whether the
replicas agree (``max == min``). A replica with no parameters sends the same fixed-length vector
(count 0), so every replica always joins the same collective.

On CPU the words are processed in chunks of ``CHUNK`` elements, so a check needs a few chunk-sized
buffers beyond the parameters, whatever the model's size; on other devices each tensor is hashed
whole (one lazily traced expression on XLA).

The CPU hash: XXH3
------------------
Where the ``xxhash`` package imports, a vector computed on the CPU hashes each CPU tensor's raw bytes
(memory order of its contiguous form, read in place: no copy of a contiguous tensor) with XXH3-64,
seeded with the tensor's position in the model, and folds the 64-bit digest to the slot's 32-bit field
(high half XOR low half). The bytes are read once: each ``PASS_BYTES`` piece is hashed, then summed
while it is still in the processor's cache. Where XXH3 is in use, every vector (also one computed on XLA,
whose tensors it does not concern, and a failed replica's) carries ``FORMAT_XXH3`` in its header, so a
replica that hashes elementwise (no ``xxhash`` there) reads as another format: ``unverified``, never a
false difference. XXH3 is not a bijection of a word: ANY difference, one word or many, goes unseen
with probability about 2^-32 per differing tensor and check (the folded digest of different bytes
matches by chance), the bound the elementwise hash has for two or more changed words. On XLA and other
devices the elementwise hash above stays on the device.
"""
import ctypes
import hashlib
import math

#: Format of the vector; replicas with another format disagree on the header (never crash). ``FORMAT``:
#: every tensor hashed elementwise; ``FORMAT_XXH3``: the vector was computed on the CPU, whose tensors
#: are hashed with XXH3 (same layout, other hash values).
FORMAT = 2
FORMAT_XXH3 = 3
#: Slots of the vector: a model with more tensors hashes several tensors per slot.
SLOTS = 1024
#: Words hashed at a time on CPU: the temporary buffers of a check (a few times 1 MiB) stay in the
#: processor's cache, which made hashing 100 M words about 10 % faster than with 4 MiB chunks.
CHUNK = 1 << 18
#: Bytes of a CPU tensor hashed with XXH3 and then summed at a time: each piece is read from memory once
#: and summed from the processor's cache (pieces of 256 KiB to 512 KiB measured fastest here).
PASS_BYTES = 1 << 19
#: Accepted values of ``local_vector``'s ``cpu_hash``: None (XXH3 where ``xxhash`` imports), or one of these.
CPU_HASHES = ("xxh3", "elementwise")

# lowbias32 (two xorshift-multiply rounds and a last xorshift; constants from Chris Wellons's
# hash-prospector: with the position multiplier it measured as uniform as 2^-32 where the three-round
# triple32 alone did not, in 16 tensor operations per chunk), the two odd multipliers of the position key
# and the one of the contribution's multiplier. Multipliers
# are applied as signed int32 values: torch multiplies int32 with wrap-around.
_ROUNDS = ((16, 0x7FEB352D), (15, 0x846CA68B))
_LAST_SHIFT = 16
_P1 = 0x9E3779B1
_P2 = 0x85EBCA77
_P3 = 0x2C1B3C6D

_MASK32 = 0xFFFFFFFF

# Header fields, then per-slot exact fields (each SLOTS long), in this order.
HEADER = ("format", "failed", "step_hi", "step_lo", "count", "digest_hi", "digest_lo", "lanes")
SLOT_EXACT = ("present", "shape_hi", "shape_lo", "dtype_hi", "dtype_lo", "bits_hi", "bits_lo", "nonfinite")
SLOT_FLOAT = ("sum",)  # stored as v and -v: max and min over the replicas
SLOT_SCALE = ("abs_sum",)  # stored once: max over the replicas


def signed32(value):
    """``value`` mod 2^32 as a signed 32-bit integer (what an int32 tensor holds)."""
    value &= _MASK32
    return value - (1 << 32) if value >= (1 << 31) else value


def unsigned32(value):
    return int(value) & _MASK32


def vector_length(slots=SLOTS):
    exact = len(HEADER) + len(SLOT_EXACT) * slots
    return 2 * exact + 2 * len(SLOT_FLOAT) * slots + len(SLOT_SCALE) * slots


# --------------------------------------------------------------------------- the bit hash
def words(tensor):
    """The tensor's raw bits as a flat int32 tensor of 32-bit words (on the tensor's device)."""
    import torch

    t = tensor.detach()
    if t.is_quantized:  # the stored integers (scale and zero point are the same on every replica that agrees)
        t = t.int_repr()
    if t.is_complex():
        t = torch.view_as_real(t)
    t = t.contiguous().reshape(-1)
    if t.dtype == torch.bool:
        t = t.view(torch.uint8) if t.device.type != "xla" else t.to(torch.int32)  # stored as 0 / 1
    if t.device.type == "xla":
        traced = _xla_words(t)
        if traced is not None:
            return traced
    size = t.element_size()
    if size == 4:
        return t.view(torch.int32)
    if size == 8:
        return t.view(torch.int32)  # two words per element
    if size == 2:
        return t.view(torch.int16).to(torch.int32)  # sign extension: injective, bit pattern kept
    if size == 1:
        return t.view(torch.uint8).to(torch.int32)
    raise TypeError("cannot fingerprint a tensor of dtype %s (element size %d)" % (t.dtype, size))


#: dtype -> XLA element type of the same width whose bits are the words (before widening to int32):
#: filled at the first XLA check, None where torch_xla has no user computations.
_xla_bitcast = {}


def _xla_words(t):
    """``words`` of a flat XLA tensor inside the lazy graph, or None where that is not possible.

    ``Tensor.view(dtype)`` has no XLA lowering: torch_xla runs it on the CPU (an execution and a copy to
    the host and back per tensor). XLA's own BitcastConvert, called as a user computation, is the same
    reinterpretation traced into the check's graph; an 8-byte element gives its two words in the order
    ``view`` gives them on the host (tests/xla compares every dtype against the CPU result)."""
    import torch

    if t.dtype == torch.int32:
        return t
    if t.dtype in (torch.int16, torch.uint8):
        return t.to(torch.int32)  # widening an integer is the widening of its bits
    op, target = _xla_bitcast_of(t)
    if op is None:
        return None
    try:
        w = op(t, to=target).reshape(-1)
    except Exception:  # a torch_xla whose builder refuses this dtype: the host round trip of ``view``
        return None
    return w if w.dtype == torch.int32 else w.to(torch.int32)


def _xla_bitcast_of(t):
    """(registered bitcast op, XLA element type) for ``t``'s element size, or (None, None)."""
    size = t.element_size()
    if "op" not in _xla_bitcast:
        try:
            import torch_xla.core.xla_builder as xb
            import torch_xla.core.xla_op_registry as xor

            _xla_bitcast["op"] = xor.register("tpu_closure_fix_bitcast", lambda x, to: x.bitcast(to))
            _xla_bitcast.update({4: xb.Type.S32, 8: xb.Type.S32, 2: xb.Type.S16, 1: xb.Type.U8})
        except Exception:  # no user computations in this torch_xla: the host round trip of ``view``
            _xla_bitcast["op"] = None
    target = _xla_bitcast.get(size)
    return (_xla_bitcast["op"], target) if target is not None and _xla_bitcast["op"] is not None else (None, None)


def _shift_xor_(x, shift, scratch):
    """``x ^= x >>> shift`` in place (logical shift of int32 words). ``torch.bitwise_right_shift`` is
    arithmetic, hence the mask; the ``>>`` operator is not used: torch_xla 2.1 lowers it as a
    truncating division (-5 >> 17 == 0 there)."""
    import torch

    torch.bitwise_right_shift(x, shift, out=scratch)
    scratch.bitwise_and_((1 << (32 - shift)) - 1)
    x.bitwise_xor_(scratch)


def mix_(x, scratch):
    """lowbias32 of every int32 word of ``x``, in place (``scratch``: a buffer of x's shape and dtype)."""
    for shift, multiplier in _ROUNDS:
        _shift_xor_(x, shift, scratch)
        x.mul_(signed32(multiplier))
    _shift_xor_(x, _LAST_SHIFT, scratch)
    return x


_key_bases = {}


def _key_base(length, device):
    """``arange(length) * P1`` as int32 on ``device``, cached on CPU (the chunks reuse it). Elsewhere it is
    made anew in each check's graph: a kept lazy tensor would stay pending after the check and join the
    training's next graph as an extra output, a new compilation of that graph."""
    import torch

    if device.type != "cpu":
        return torch.arange(length, dtype=torch.int32, device=device).mul_(signed32(_P1))
    cache_key = (str(device), length)
    base = _key_bases.get(cache_key)
    if base is None:
        base = torch.arange(length, dtype=torch.int32, device=device).mul_(signed32(_P1))
        if len(_key_bases) > 16:
            _key_bases.clear()
        _key_bases[cache_key] = base
    return base


def contributions(chunk, offset, position):
    """``mix(word XOR key)`` of every word of one run of words starting at word ``offset`` of the
    tensor at ``position`` (int32; benchmarks/synccheck_collisions.py studies them one by one)."""
    import torch

    key, multiplier = _keys_for(chunk.numel(), offset, position, chunk.device)
    x = torch.bitwise_xor(key, chunk)
    return mix_(x, torch.empty_like(x)).mul_(multiplier)


#: Words whose keys and multipliers are kept from one check to the next on CPU (two int32 tensors: at
#: most 16 MiB): a model of up to 2 M parameters then hashes with 14 passes over its words instead of 17.
KEY_CACHE_WORDS = 1 << 21
_keys = {}
_cached_words = [0]


def _keys_for(length, offset, position, device):
    """(key, multiplier) of ``length`` words from word ``offset`` of the tensor at ``position``; kept on
    CPU while the budget lasts (the values depend on these numbers only, so a kept pair is always right)."""
    import torch

    on_cpu = device.type == "cpu"
    found = _keys.get((length, offset, position)) if on_cpu else None
    if found is not None:
        return found
    key = torch.add(_key_base(length, device), signed32(offset * _P1 + position * _P2))
    pair = key, _multiplier(key)
    if on_cpu and _cached_words[0] + length <= KEY_CACHE_WORDS:
        _keys[(length, offset, position)] = pair
        _cached_words[0] += length
    return pair


def _multiplier(key):
    """``key * P3 OR 1`` (a new tensor): odd, so multiplying by it is a bijection."""
    import torch

    return torch.mul(key, signed32(_P3)).bitwise_or_(1)


def position_keys(indices, position):
    """The keys of the words at ``indices`` (an int64 tensor of word indices) of the tensor at ``position``."""
    import torch

    keys = (indices * _P1 + position * _P2) & _MASK32
    return torch.where(keys >= (1 << 31), keys - (1 << 32), keys).to(torch.int32)


def keyed_contributions(chunk, key):
    """``mix(word XOR key) * (key * P3 OR 1)`` per word (int32)."""
    import torch

    x = torch.bitwise_xor(key, chunk)
    return mix_(x, torch.empty_like(x)).mul_(_multiplier(key))


def _hash_words(chunk, offset, position):
    """Sum (int32, wrapping) of the contributions of one run of words."""
    import torch

    return contributions(chunk, offset, position).sum(dtype=torch.int32)


def bit_hash(tensor, position, chunk=CHUNK):
    """The tensor's 32-bit bit hash (an int32 scalar tensor on its device); ``position`` is the
    tensor's index in the model. On CPU the words go ``chunk`` at a time."""
    import torch

    w = words(tensor)
    n = w.numel()
    if n == 0:
        return torch.zeros((), dtype=torch.int32, device=w.device)
    if w.device.type != "cpu" or n <= chunk:
        return _hash_words(w, 0, position)
    total = torch.zeros((), dtype=torch.int32)
    for start in range(0, n, chunk):
        total += _hash_words(w[start:start + chunk], start, position)
    return total


def value_sums(tensor, chunk=CHUNK):
    """(non-finite element count, float32 sum, float32 sum of absolute values) as scalar tensors on the
    tensor's device; zeros for tensors that are not floating point (their bits are in the hash).

    On CPU the non-finite elements are counted only when the sum is not finite (a NaN or inf among
    the values always makes it so): one pass less for every healthy tensor."""
    import torch

    t = tensor.detach()
    if t.is_quantized:
        t = t.dequantize()
    if t.is_complex():
        t = torch.view_as_real(t)
    if not t.is_floating_point():
        zero = torch.zeros((), dtype=torch.float32, device=t.device)
        return zero, zero, zero
    if t.element_size() == 1:  # float8 (e4m3fn, e5m2, ...): torch has no sum over them; exact in float32
        try:
            t = t.to(torch.float32)
        except (NotImplementedError, RuntimeError):  # packed formats with no conversion (float4_e2m1fn_x2)
            zero = torch.zeros((), dtype=torch.float32, device=t.device)
            return zero, zero, zero  # their bits are in the hash; no value sums ("by how much") for them
    t = t.reshape(-1)
    if t.device.type != "cpu":
        return _nonfinite_count(t), t.sum(dtype=torch.float32), _abs_sum(t)
    pieces = [t[i:i + chunk] for i in range(0, t.numel(), chunk)] or [t]
    total = sum(piece.sum(dtype=torch.float32) for piece in pieces)
    scale = sum(_abs_sum(piece) for piece in pieces)
    if bool(torch.isfinite(total)):
        nonfinite = torch.zeros((), dtype=torch.float32)
    else:
        nonfinite = sum(_nonfinite_count(piece) for piece in pieces)
    return nonfinite, torch.as_tensor(total, dtype=torch.float32), torch.as_tensor(scale, dtype=torch.float32)


def _nonfinite_count(t):
    import torch

    return (t.numel() - torch.isfinite(t).sum()).to(torch.float32)


def _abs_sum(t):
    import torch

    # vector_norm fuses abs and sum (no temporary); it refuses to narrow float64 through ``dtype``.
    if t.dtype == torch.float64:
        return torch.linalg.vector_norm(t, 1).to(torch.float32)
    return torch.linalg.vector_norm(t, 1, dtype=torch.float32)


# --------------------------------------------------------------------------- the CPU hash (XXH3)
_xxhash = []


def xxhash_module():
    """The ``xxhash`` module where it imports and has XXH3, else None (then every tensor is hashed elementwise).
    Looked up once per process: every vector of a process is of one format."""
    if not _xxhash:
        try:
            import xxhash

            _xxhash.append(xxhash if hasattr(xxhash, "xxh3_64") else None)
        except Exception:  # not installed, or a build that does not load: the elementwise hash always works
            _xxhash.append(None)
    return _xxhash[0]


def uses_xxh3(cpu_hash=None):
    """Whether CPU tensors are hashed with XXH3. ``cpu_hash``: None (XXH3 where ``xxhash`` imports),
    ``"xxh3"`` or ``"elementwise"``."""
    if cpu_hash is not None and cpu_hash not in CPU_HASHES:
        raise ValueError("cpu_hash must be None, %s; got %r" % (" or ".join(repr(h) for h in CPU_HASHES), cpu_hash))
    if cpu_hash == "elementwise":
        return False
    if xxhash_module() is not None:
        return True
    if cpu_hash == "xxh3":
        raise ValueError("cpu_hash='xxh3' needs the xxhash package, which does not import here: "
                         "pip install 'xxhash>=3.0'")
    return False


def vector_format(cpu_hash=None):
    """The format a vector of this process carries: ``FORMAT_XXH3`` where CPU tensors are hashed with XXH3."""
    return FORMAT_XXH3 if uses_xxh3(cpu_hash) else FORMAT


def fold64(digest):
    """A 64-bit digest folded to 32 bits: its high half XOR its low half."""
    return ((digest >> 32) ^ digest) & _MASK32


def hashed_bytes(tensor):
    """A flat contiguous CPU tensor whose memory holds ``tensor``'s raw bits in element order (``tensor``'s own
    memory when it is contiguous: no copy), or None where they are not plain memory of this process (other
    devices, tensor subclasses, sparse layouts): those are hashed elementwise."""
    import torch

    t = tensor.detach()
    if type(t) is not torch.Tensor or t.device.type != "cpu" or t.layout != torch.strided:
        return None
    t = _resolved(t)
    if t.is_quantized:  # the stored integers, as the elementwise hash reads them
        t = t.int_repr()
    return t.contiguous().reshape(-1)


def _resolved(t):
    """``t`` itself, or for a lazily conjugated or negated view the values it stands for (not the memory it
    shares with the tensor it views)."""
    if getattr(t, "is_conj", None) is not None and t.is_conj():
        t = t.resolve_conj()
    if getattr(t, "is_neg", None) is not None and t.is_neg():
        t = t.resolve_neg()
    return t


def _memory(piece):
    """The bytes of a contiguous CPU tensor in place: a ctypes array over its memory (no copy, no numpy)."""
    size = piece.numel() * piece.element_size()
    if size == 0:
        return b""
    return (ctypes.c_ubyte * size).from_address(piece.data_ptr())


def _sums_in_the_pass(tensor, raw):
    """Whether ``raw``'s elements are the values whose sums the vector carries (plain floating point of two
    bytes or more); otherwise :func:`value_sums` takes them apart (quantized, complex, float8, integers)."""
    return raw.dtype == tensor.dtype and raw.is_floating_point() and raw.element_size() >= 2


def xxh3_fields(tensor, position, pass_bytes=PASS_BYTES, scale=True):
    """``(32-bit hash, non-finite count, float32 sum, float32 sum of |values|)`` of a CPU tensor as Python
    numbers, its bytes read from memory once: each ``pass_bytes`` piece is hashed (XXH3-64, seed
    ``position``, streamed: the same digest as the whole bytes at once), then summed while it is in the
    cache (the sums are :func:`value_sums`'). ``scale=False``: the sum of |values| is not computed (None;
    it took half the pass: 4.2 against 9.1 ms at 16.8 M float32 values). None where the tensor's bits are not
    plain memory (:func:`hashed_bytes`)."""
    raw = hashed_bytes(tensor)
    if raw is None:
        return None
    summed = _sums_in_the_pass(tensor, raw)
    step = max(1, pass_bytes // raw.element_size())
    if raw.numel() <= step:
        pieces = [raw]
        digest, total, magnitude = _one_piece(raw, position, summed, scale)
    else:
        pieces = [raw[start:start + step] for start in range(0, raw.numel(), step)]
        digest, total, magnitude = _streamed(pieces, position, summed, scale)
    if not summed:
        return (digest,) + tuple(float(v) for v in value_sums(_resolved(tensor.detach())))
    # non-finite elements are counted only when the sum is not: a NaN or inf among the values makes it so
    nonfinite = 0.0 if math.isfinite(total) else float(sum(float(_nonfinite_count(piece)) for piece in pieces))
    return digest, nonfinite, total, magnitude


def _one_piece(raw, position, summed, scale):
    """:func:`xxh3_fields`' (digest, sum, sum of |values|) of a tensor that fits one piece: hashed in one call and
    each sum in one operation, with no running total (half the time of a small tensor's streamed pass; a model's
    many small tensors cost this per tensor)."""
    import torch

    digest = fold64(xxhash_module().xxh3_64_intdigest(_memory(raw), seed=position))
    if not summed:
        return digest, None, None
    total = float(raw.sum(dtype=torch.float32))
    magnitude = float(torch.abs(raw).sum(dtype=torch.float32)) if scale else None
    return digest, total, magnitude


def _streamed(pieces, position, summed, scale):
    """:func:`xxh3_fields`' (digest, sum, sum of |values|) piece by piece: each piece hashed (streamed: the
    digest of the whole bytes), then summed while it is in the cache."""
    import torch

    hasher = xxhash_module().xxh3_64(seed=position)
    scratch = torch.empty(pieces[0].numel(), dtype=pieces[0].dtype) if summed and scale else None
    total = magnitude = 0.0
    for piece in pieces:
        hasher.update(_memory(piece))
        if summed:
            total = piece.sum(dtype=torch.float32) + total  # float32 additions, in the order of value_sums
            if scratch is not None:  # abs into a buffer, then sum: a third of vector_norm's time here
                magnitude = torch.abs(piece, out=scratch[:piece.numel()]).sum(dtype=torch.float32) + magnitude
    digest = fold64(hasher.intdigest())
    if not summed:
        return digest, None, None
    return digest, float(total), float(magnitude) if scale else None


def tensor_hash(tensor, position, chunk=CHUNK, cpu_hash=None):
    """The 32-bit hash of one tensor as the vector carries it (an int32 scalar tensor on the tensor's device):
    XXH3 for a CPU tensor where :func:`uses_xxh3`, else :func:`bit_hash`."""
    return _per_tensor_fields([(position, 0, tensor)], chunk, uses_xxh3(cpu_hash), tensor.device)[0][0]


def _per_tensor_fields(entries, chunk, xxh3, device, scale=True, fast=None):
    """(int32 hashes, float32 [non-finite count, sum, sum of |values|] rows) of the entries, on ``device``.
    Tensors hashed with XXH3 give Python numbers, made into tensors at once (one call, not one per tensor);
    with ``scale=False`` their sums of |values| are not computed (-inf: unknown). ``fast``: the entries'
    :func:`xxh3_fields` where already computed."""
    import torch

    if fast is None:
        fast = [xxh3_fields(t, k, scale=scale) if xxh3 else None for k, _, t in entries]
    if all(found is not None for found in fast):
        hashes = torch.tensor([signed32(found[0]) for found in fast], dtype=torch.int32)
        stats = torch.tensor([found[1:3] + (ABSENT if found[3] is None else found[3],) for found in fast],
                             dtype=torch.float32).reshape(len(fast), 3)
        return hashes.to(device), stats.to(device)
    hashes, stats = [], []
    for found, (k, _, t) in zip(fast, entries):
        if found is None:
            hashes.append(bit_hash(t, k, chunk).to(device))
            stats.append(torch.stack([v.to(device) for v in value_sums(t, chunk)]))
        else:
            hashes.append(torch.tensor(signed32(found[0]), dtype=torch.int32, device=device))
            stats.append(torch.tensor(found[1:3] + (ABSENT if found[3] is None else found[3],),
                                      dtype=torch.float32, device=device))
    return torch.stack(hashes), torch.stack(stats)


# --------------------------------------------------------------------------- structure hashes (host)
def _hash32(text):
    return int.from_bytes(hashlib.sha256(text.encode("utf-8")).digest()[:4], "little")


def describe(tensor):
    """``(shape tuple, dtype name)`` of a tensor: what the structure digest covers."""
    return tuple(int(d) for d in tensor.shape), str(tensor.dtype).replace("torch.", "")


def structure_digest(structures):
    """32-bit digest of the model's structure: every tensor's shape and dtype, in order."""
    return _hash32(repr(list(structures)))


def shape_hash(position, shape):
    return _hash32("shape|%d|%r" % (position, tuple(shape)))


def dtype_hash(position, dtype):
    return _hash32("dtype|%d|%s" % (position, dtype))


# --------------------------------------------------------------------------- the vector
ABSENT = float("-inf")


def _halves(value):
    value = unsigned32(value)
    return float(value >> 16), float(value & 0xFFFF)


def _layout(slots):
    exact = len(HEADER) + len(SLOT_EXACT) * slots
    return exact, 2 * exact, 2 * exact + 2 * slots


def _header(failed, step, count, digest, lanes, form=FORMAT):
    step = 0 if step is None else int(step)
    return ([float(form), float(failed)] + list(_halves(step)) + [float(count)] + list(_halves(digest))
            + [float(lanes)])


def failed_vector(device=None, slots=SLOTS, step=None, lanes=1, cpu_hash=None):
    """The vector of a replica that could not fingerprint its parameters: it still joins the check, with
    its header (this process's format, the failure flag, its step) and every slot absent."""
    import torch

    exact, floats, _ = _layout(slots)
    v = torch.full((vector_length(slots),), ABSENT, dtype=torch.float32)
    header = torch.tensor(_header(1, step, 0, 0, lanes, form=vector_format(cpu_hash)), dtype=torch.float32)
    v[:len(HEADER)] = header
    v[exact:exact + len(HEADER)] = -header
    return v if device is None else v.to(device)


_slot_cache = {}
#: The fields of a slot that its tensors' structure alone gives (the first of SLOT_EXACT).
SLOT_STRUCTURE = ("present", "shape_hi", "shape_lo", "dtype_hi", "dtype_lo")


def _slot_structure(held):
    """{slot: the values of its SLOT_STRUCTURE fields} for each slot some tensor of ``held`` goes to (present;
    the sums of its tensors' shape and dtype hashes, each as two halves)."""
    shape_sums, dtype_sums = {}, {}
    for position, slot, shape, dtype in held:
        shape_sums[slot] = shape_sums.get(slot, 0) + shape_hash(position, shape)
        dtype_sums[slot] = dtype_sums.get(slot, 0) + dtype_hash(position, dtype)
    return {slot: (1.0,) + _halves(shape_sums[slot]) + _halves(dtype_sums[slot]) for slot in shape_sums}


def _slot_fields(held, slots):
    """Host-side per-slot fields (present, shape and dtype hashes) as a float32 CPU tensor of
    ``5 * slots`` values, and the present mask; cached for the last layout seen (a model keeps its
    structure from one check to the next). ``held``: ((position, slot, shape, dtype), ...)."""
    import torch

    cached = _slot_cache.get((held, slots))
    if cached is not None:
        return cached
    fields = torch.zeros(len(SLOT_STRUCTURE), slots, dtype=torch.float32)  # the slots held by none: all 0
    for slot, values in _slot_structure(held).items():
        fields[:, slot] = torch.tensor(values)
    made = fields.reshape(-1), fields[0] > 0
    _slot_cache.clear()  # replica threads of one process may fingerprint at once: each returns its own
    _slot_cache[(held, slots)] = made
    return made


def local_vector(entries, structures=None, device=None, slots=SLOTS, chunk=CHUNK, step=None, lanes=1,
                 cpu_hash=None, details=None, scale=True):
    """This replica's vector (float32, length :func:`vector_length`).

    ``entries``: the tensors this replica holds, as ``(position, slot, tensor)`` (position: the tensor's
    index in the model, slot: where its fields go) or, for the plain layout, just the tensors in model
    order (tensor ``k`` at position ``k``, slot ``k % slots``). ``structures``: the model-wide description
    of every tensor in order (what the count and the structure digest cover; default: the held tensors'
    shapes and dtypes). Slots no entry goes to are absent: ``-inf`` in every copy of their fields, so the
    MAX all-reduce gives each slot's largest and smallest value over the replicas that hold it.
    Built on ``device`` (default: the first tensor's, else CPU). ``cpu_hash``: how CPU tensors are hashed
    (:func:`uses_xxh3`); tensors on other devices are hashed elementwise there. ``details``: a dict that
    receives each entry's own bit hash (``hashes``) and value sums (``stats``), in entry order, computed by
    the same pass. ``scale=False``: the sums of |values| of tensors hashed with XXH3 are not computed (the
    verdict never reads them; naming a difference does, and a caller that can read the tensors again then
    computes them): their ``abs_sum`` field is absent (-inf) and ``details`` is left empty."""
    import torch

    xxh3 = uses_xxh3(cpu_hash)

    entries = [e if isinstance(e, tuple) else (k, k % slots, e) for k, e in enumerate(entries)]
    held = tuple((k, s) + describe(t) for k, s, t in entries)
    if structures is None:
        structures = tuple(h[2:] for h in held)
    if device is None:
        device = entries[0][2].device if entries else torch.device("cpu")
    form = FORMAT_XXH3 if xxh3 else FORMAT
    fast = [xxh3_fields(t, k, scale=scale) if xxh3 else None for k, _, t in entries]
    if details is not None and scale and entries:
        details["hashes"], details["stats"] = _per_tensor_fields(entries, chunk, xxh3, device, scale, fast)
    if (device.type == "cpu" and entries and None not in fast
            and len(set(slot for _, slot, _ in entries)) == len(entries)):
        return _host_vector(fast, held, structures, slots, step, lanes, form, scale)
    header = torch.tensor(_header(0, step, len(structures), structure_digest(structures), lanes, form=form),
                          dtype=torch.float32)
    per_tensor = per_stats = None
    if entries:
        kept = details or {}
        per_tensor, per_stats = kept.get("hashes"), kept.get("stats")
        if per_tensor is None or per_stats is None:
            per_tensor, per_stats = _per_tensor_fields(entries, chunk, xxh3, device, scale, fast)
    return _assembled(held, per_tensor, per_stats, header, slots, device, scale)


def warm():
    """Pay the fingerprint's first-call costs (torch's first call of each operation it uses, the hash module's) on
    a small CPU tensor, away from any check: a process's first check then holds its training thread about as long
    as a later one (1-2 ms less)."""
    import torch

    with torch.no_grad():
        local_vector([torch.zeros(4)], step=0, details={})


def _assembled(held, per_tensor, per_stats, header, slots, device, scale):
    """The vector from each held tensor's hash (int32) and [non-finite count, sum, sum of |values|] row, on
    ``device``: the fields of each slot added up, the absent slots -inf."""
    import torch

    slot_host, present = _slot_fields(held, slots)
    hashes = torch.zeros(slots, dtype=torch.int32, device=device)
    stats = torch.zeros(slots, 3, dtype=torch.float32, device=device)
    if held:
        index = torch.tensor([s for _, s, _, _ in held], dtype=torch.int64).to(device)
        hashes.index_add_(0, index, per_tensor)
        stats.index_add_(0, index, per_stats)
    hi = torch.bitwise_right_shift(hashes, 16).bitwise_and_(0xFFFF).to(torch.float32)
    lo = hashes.bitwise_and(0xFFFF).to(torch.float32)
    sums = torch.nan_to_num(stats[:, 1], nan=0.0, posinf=3.0e38, neginf=-3.0e38)
    # a NaN or inf sum of |values| is huge; an uncomputed one (scale=False) stays -inf: absent
    magnitude = torch.nan_to_num(stats[:, 2], nan=3.0e38, posinf=3.0e38, neginf=3.0e38 if scale else ABSENT)
    absent = (~present).to(device)
    slot_exact = torch.cat([slot_host.to(device), hi, lo, stats[:, 0]]).reshape(len(SLOT_EXACT), slots)
    positive = torch.cat([header.to(device), slot_exact.masked_fill(absent, ABSENT).reshape(-1)])
    negative = torch.cat([-header.to(device), (-slot_exact).masked_fill(absent, ABSENT).reshape(-1)])
    return torch.cat([positive, negative, sums.masked_fill(absent, ABSENT), (-sums).masked_fill(absent, ABSENT),
                      magnitude.masked_fill(absent, ABSENT)])


_host_cache = {}


def _host_vector(fast, held, structures, slots, step, lanes, form, scale):
    """The vector of CPU tensors whose fields are Python numbers (:func:`xxh3_fields`), each in a slot of its
    own: a copy of the layout's template (what :func:`_assembled` builds with every hash, count and sum 0,
    cached for the last layout seen) with this check's header and values written at their places -- bit for bit
    the vector :func:`_assembled` builds (tests/unit/test_fingerprint_xxh3.py), in a few tensor operations
    instead of some thirty (most of a small model's fingerprint)."""
    import torch

    key = (held, slots)
    cached = _host_cache.get(key)
    if cached is None:
        exact, floats, scales = _layout(slots)
        bits_hi, bits_lo, nonfinite = (len(HEADER) + SLOT_EXACT.index(name) * slots
                                       for name in ("bits_hi", "bits_lo", "nonfinite"))
        places = []
        for _, slot, _, _ in held:
            places += [bits_hi + slot, bits_lo + slot, nonfinite + slot, exact + bits_hi + slot,
                       exact + bits_lo + slot, exact + nonfinite + slot, floats + slot, floats + slots + slot,
                       scales + slot]
        places += list(range(len(HEADER))) + list(range(exact, exact + len(HEADER)))
        cached = (_template(held, slots), torch.tensor(places, dtype=torch.int64))
        _host_cache.clear()  # replica threads of one process may fingerprint at once: each returns its own
        _host_cache[key] = cached
    template, places = cached
    values = []
    for digest, count, total, magnitude in fast:
        hi, lo = _halves(digest)
        if not math.isfinite(total):  # as _assembled's nan_to_num
            total = 0.0 if math.isnan(total) else math.copysign(3.0e38, total)
        if magnitude is None:  # not computed (scale=False): absent
            magnitude = ABSENT
        elif not math.isfinite(magnitude) and (scale or magnitude != ABSENT):
            magnitude = 3.0e38
        values += [hi, lo, count, -hi, -lo, -count, total, -total, magnitude]
    header = _header(0, step, len(structures), structure_digest(structures), lanes, form=form)
    values += header + [-v for v in header]
    vector = template.clone()
    vector[places] = torch.tensor(values, dtype=torch.float32)
    return vector


def _template(held, slots):
    """The vector of :func:`_host_vector` before its values are written: every field absent (-inf) but the
    structure fields of the held slots (and their negatives), written by index (no other tensor operation:
    each one's first use in a process costs torch a few tenths of a millisecond, on an optimizer's first check)."""
    import torch

    exact = _layout(slots)[0]
    places, values = [], []
    for slot, fields in _slot_structure(held).items():
        for index, value in enumerate(fields):
            place = len(HEADER) + index * slots + slot
            places += [place, exact + place]
            values += [value, -value]
    template = torch.full((vector_length(slots),), ABSENT, dtype=torch.float32)
    template[torch.tensor(places, dtype=torch.int64)] = torch.tensor(values, dtype=torch.float32)
    return template


def decode(reduced, slots=SLOTS):
    """Read a MAX-reduced vector (a tensor, or a list of floats). Header fields: ``{field: (max, min)}``
    as floats; slot fields: ``{field: (max tensor, min tensor)}`` over the slots (``abs_sum``: the max
    tensor only; an absent slot reads max ``-inf``, min ``+inf``); ``digest`` and ``step``: the 32-bit
    values' (max, min) joined from their halves; ``compared``: the slots some replica holds."""
    import torch

    v = torch.as_tensor(reduced, dtype=torch.float32).detach().cpu()
    exact, floats, scales = _layout(slots)
    high, low = v[:exact], -v[exact:floats]
    # the header read in one conversion each (read value by value it costs a tensor index each)
    out = dict(zip(HEADER, zip(high[:len(HEADER)].tolist(), low[:len(HEADER)].tolist())))
    for f, name in enumerate(SLOT_EXACT):
        start = len(HEADER) + f * slots
        out[name] = (high[start:start + slots], low[start:start + slots])
    out["sum"] = (v[floats:floats + slots], -v[floats + slots:scales])
    out["abs_sum"] = v[scales:scales + slots]
    for joined in ("digest", "step"):
        out[joined] = tuple(int(out[joined + "_hi"][i]) << 16 | int(out[joined + "_lo"][i]) for i in (0, 1))
    out["compared"] = out["present"][0] > 0
    return out


def slots_differing(decoded, *fields):
    """A bool tensor over the slots: true where any of ``fields`` is not the same on every replica that
    holds the slot (absent slots are never differing)."""
    mask = None
    for name in fields:
        high, low = decoded[name]
        bad = high != low
        mask = bad if mask is None else mask | bad
    return mask & decoded["compared"]
