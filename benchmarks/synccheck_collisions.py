#!/usr/bin/env python
"""How often can two changed words of a tensor go unseen by SyncCheck's bit hash? Measured, not a test.

The bit hash of a tensor (tpu_closure_fix/synccheck/fingerprint.py) is the sum mod 2^32 of one contribution per
32-bit word, ``mix(word XOR key(position))``. One changed word always changes the sum (``mix`` and the
XOR are bijections: this script checks it for every word). Two changed words go unseen exactly when
their contributions' changes cancel: ``d_i + d_j == 0 (mod 2^32)``. For the changes of the "+e on one
element, -e on another" kind (one ulp up at i, one ulp down at j) and for sign flips, that condition
is checked for EVERY pair (i, j) of an n-word tensor at once (sort the changes, count the matches:
n^2 pairs, e.g. 6.9e10 for n = 2^18), so the collision rate is measured against 2^-32 with real
statistics. Swapping two elements (a permutation) changes two contributions that depend on each other;
it is sampled, and its low 16 bits are checked against 2^-16 (is the mix uniform where it can be seen?).

The CPU hash where ``xxhash`` imports (XXH3-64 of the tensor's bytes, seeded with its position, folded to
32 bits) is no sum of per-word contributions: no pair can be counted at once, and one changed word is not
seen by construction but with probability 1 - 2^-32. It is sampled instead (``--xxh3-samples`` changes of
each kind to a 1,024-element float32 tensor at a random position: one ulp at one element, a sign flip, one
word's random bits, +1 ulp at i and -1 ulp at j, two elements swapped): full 32-bit matches with the
unchanged tensor's hash against 2^-32, and low 16 bits against 2^-16.

    python benchmarks/synccheck_collisions.py            # n = 2^18 words per tensor: the figures in docs
    python benchmarks/synccheck_collisions.py --smoke    # n = 2^12, a few seconds: the script works
"""
import argparse
import json
import math
import os
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

MASK = 0xFFFFFFFF


def _unsigned(int32_tensor):
    import torch

    return int32_tensor.to(torch.int64) & MASK


def _contributions(tensor, position=3):
    from tpu_closure_fix.synccheck import fingerprint

    return _unsigned(fingerprint.contributions(fingerprint.words(tensor), 0, position))


def _ulp(tensor, direction):
    import torch

    bits = {4: torch.int32, 2: torch.int16}[tensor.element_size()]
    out = tensor.clone()
    out.view(bits).add_(direction)  # one ulp away from zero (up) / toward zero (down) for every element
    return out


def _count_cancelling(d_first, d_second):
    """Pairs (i, j), i != j, with d_first[i] + d_second[j] == 0 mod 2^32."""
    import torch

    need = (-d_second) & MASK
    ordered, _ = torch.sort(need)
    hits = torch.searchsorted(ordered, d_first, right=True) - torch.searchsorted(ordered, d_first)
    same = int(((d_first + d_second) & MASK == 0).sum())  # i == j is one change, not two
    return int(hits.sum()) - same


def _poisson_interval(k):
    """Approximate 95 % interval of a Poisson mean from k events (exact enough for a report)."""
    if k == 0:
        return 0.0, 3.69
    return max(0.0, k - 1.96 * math.sqrt(k)), k + 1.96 * math.sqrt(k) + 1


def pairwise(name, base, changed_first, changed_second):
    """Every pair of words (i, j) changed as ``changed_first`` at i and ``changed_second`` at j; the same
    change at both counts each unordered pair once."""
    c = _contributions(base)
    d1 = (_contributions(changed_first) - c) & MASK
    d2 = (_contributions(changed_second) - c) & MASK
    n = base.numel()
    symmetric = changed_first is changed_second
    pairs = n * (n - 1) // (2 if symmetric else 1)
    collisions = _count_cancelling(d1, d2) // (2 if symmetric else 1)
    lo, hi = _poisson_interval(collisions)
    return {"case": name, "dtype": str(base.dtype).replace("torch.", ""), "words": n, "pairs": pairs,
            "single_word_unseen": int((d1 == 0).sum()) + int((d2 == 0).sum()),
            "collisions": collisions, "expected_at_2^-32": pairs / 2.0 ** 32,
            "rate": collisions / pairs, "rate_95ci": [lo / pairs, hi / pairs]}


def swaps(base, samples, seed=0):
    """Random swaps of two unequal elements: the hash change, full 32 bits and its low 16 bits."""
    import torch

    from tpu_closure_fix.synccheck import fingerprint

    gen = torch.Generator().manual_seed(seed)
    w = fingerprint.words(base)
    n = w.numel()
    i = torch.randint(0, n, (samples,), generator=gen)
    j = torch.randint(0, n, (samples,), generator=gen)
    keep = w[i] != w[j]
    i, j = i[keep], j[keep]
    c = _contributions(base)

    def contribution_at(word, index):  # the contribution of ``word`` placed at word index ``index``
        return _unsigned(fingerprint.keyed_contributions(word, fingerprint.position_keys(index, 3)))

    delta = (contribution_at(w[j], i) + contribution_at(w[i], j) - c[i] - c[j]) & MASK
    full, low = int((delta == 0).sum()), int(((delta & 0xFFFF) == 0).sum())
    m = int(keep.sum())
    return {"case": "swap two elements", "dtype": str(base.dtype).replace("torch.", ""), "swaps": m,
            "collisions": full, "expected_at_2^-32": m / 2.0 ** 32,
            "low16_collisions": low, "low16_expected_at_2^-16": m / 2.0 ** 16,
            "low16_rate": low / m if m else None}


def xxh3_sampled(samples, words=1024, position=0, seed=0):
    """Sampled changes of a float32 tensor's words under the XXH3 hash: per kind, the changes whose folded
    32-bit hash equals the unchanged tensor's (and those whose low 16 bits do)."""
    import random
    import struct

    from tpu_closure_fix.synccheck import fingerprint

    xxhash = fingerprint.xxhash_module()
    rng = random.Random(seed)
    base = bytearray(struct.pack("<%df" % words, *[rng.uniform(0.5, 1.5) for _ in range(words)]))

    def folded(data, seed):
        return fingerprint.fold64(xxhash.xxh3_64_intdigest(bytes(data), seed=seed))

    def word(data, i):
        return struct.unpack_from("<I", data, 4 * i)[0]

    def put(data, i, value):
        struct.pack_into("<I", data, 4 * i, value & MASK)

    def one_ulp(data):
        i = rng.randrange(words)
        put(data, i, word(data, i) + 1)

    def sign(data):
        i = rng.randrange(words)
        put(data, i, word(data, i) ^ 0x80000000)

    def up_down(data):
        i, j = rng.sample(range(words), 2)
        put(data, i, word(data, i) + 1)
        put(data, j, word(data, j) - 1)

    def swap(data):
        i, j = rng.sample(range(words), 2)
        a, b = word(data, i), word(data, j)
        put(data, i, b)
        put(data, j, a)

    def random_bits(data):
        i = rng.randrange(words)
        put(data, i, word(data, i) ^ rng.randrange(1, 1 << 32))

    results = []
    for name, change in (("one ulp at one element", one_ulp), ("sign flipped at one element", sign),
                         ("one word, random bits changed", random_bits), ("+1 ulp at i, -1 ulp at j", up_down),
                         ("two elements swapped", swap)):
        full = low = 0
        for _ in range(samples):
            # a random position (the seed) per sample: one tensor gives only 1,024 one-element changes
            seed = rng.randrange(position, 1 << 24)
            reference = folded(base, seed)
            data = bytearray(base)
            change(data)
            h = folded(data, seed)
            full += h == reference
            low += (h & 0xFFFF) == (reference & 0xFFFF)
        results.append({"case": "XXH3: " + name, "dtype": "float32", "samples": samples, "collisions": full,
                        "expected_at_2^-32": samples / 2.0 ** 32, "low16_collisions": low,
                        "low16_expected_at_2^-16": samples / 2.0 ** 16})
    return results


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--smoke", action="store_true", help="small sizes: check the script runs")
    parser.add_argument("--log2-words", type=int, default=18, help="words per tensor, log2 (default 18)")
    parser.add_argument("--swaps", type=int, default=10_000_000, help="sampled swaps (default 1e7)")
    parser.add_argument("--xxh3-samples", type=int, default=2_000_000,
                        help="sampled changes of each kind under the XXH3 hash (default 2e6)")
    parser.add_argument("--json", help="also write the results here")
    args = parser.parse_args(argv)
    import torch

    torch.manual_seed(0)
    n = 1 << (12 if args.smoke else args.log2_words)
    samples = 100_000 if args.smoke else args.swaps
    results = []
    for dtype in (torch.float32, torch.bfloat16):
        base = (torch.rand(n) + 0.5).to(dtype)  # positive, normal: one ulp up/down stays in range
        results.append(pairwise("+1 ulp at i, -1 ulp at j", base, _ulp(base, 1), _ulp(base, -1)))
        flipped = -base
        results.append(pairwise("sign flipped at i and at j", base, flipped, flipped))
        results.append(swaps(base, samples))
    from tpu_closure_fix.synccheck import fingerprint

    if fingerprint.xxhash_module() is not None:
        results += xxh3_sampled(10_000 if args.smoke else args.xxh3_samples)
    else:
        print("XXH3: not measured, the xxhash package does not import here (pip install 'xxhash>=3.0')")
    for r in results:
        if "pairs" in r:
            print("%-28s %-9s %d words: %.3g pairs, %d collisions (%.2f expected at 2^-32), rate %.3g "
                  "[95%% %.2g..%.2g]; one-word changes unseen: %d"
                  % (r["case"], r["dtype"], r["words"], r["pairs"], r["collisions"], r["expected_at_2^-32"],
                     r["rate"], r["rate_95ci"][0], r["rate_95ci"][1], r["single_word_unseen"]))
        elif "samples" in r:
            print("%-36s %d changes: %d unseen (%.2g expected); low 16 bits equal: %d (%.1f expected)"
                  % (r["case"], r["samples"], r["collisions"], r["expected_at_2^-32"], r["low16_collisions"],
                     r["low16_expected_at_2^-16"]))
        else:
            print("%-28s %-9s %d swaps: %d collisions (%.2g expected at 2^-32); low 16 bits: %d "
                  "(%.1f expected at 2^-16)" % (r["case"], r["dtype"], r["swaps"], r["collisions"],
                                                r["expected_at_2^-32"], r["low16_collisions"],
                                                r["low16_expected_at_2^-16"]))
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(results, handle, indent=1)
    if any(r.get("single_word_unseen") for r in results):
        print("a single changed word went unseen: the hash is broken", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
