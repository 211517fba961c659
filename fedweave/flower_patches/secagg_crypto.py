"""SecAgg+'s key agreement and Shamir sharing at a fraction of Flower's cost, same protocol.

Flower's ``create_shares`` / ``combine_shares`` call PyCryptodome's ``Shamir``, whose GF(2^128)
multiplication runs a 128-step loop that builds two 128-character strings per step. Profiling a
SecAgg+ round with 100 sites (docs/benchmarks.md) found most of it there:

- each site splits a 32-byte seed and its PEM private key into ~21 shares (the key-share
  stage): ~6 ms for the seed, ~27 ms for a 241-byte key;
- the coordinator rebuilds one secret per site from ~21 shares (the unmasking stage): ~45 ms
  each, most of that computing the same Lagrange coefficients again for every site and chunk.

This module computes the same field arithmetic (GF(2^128) modulo x^128 + x^7 + x^2 + x + 1,
128-bit integers with the constant coefficient in the least significant bit, PyCryptodome's
encoding) with carry-less shifts and XORs, splits all 16-byte chunks of a secret at once (each
in its own lane of one integer, ``_Lanes``), and caches the Lagrange coefficients at zero per
set of share indices. Shares are byte-for-byte in Flower's format (4-byte little-endian index,
then 16 bytes per 16-byte chunk of the PKCS#7-padded secret), so a site and a coordinator may
each use either implementation.

Key agreement was the other half of a site's work: two Diffie-Hellman exchanges with every
neighbour a round, on NIST P-384 (0.35 ms each here), each after loading the site's own private
key from PEM again (0.18 ms). Sites here make their key pairs on NIST P-256 (0.05 ms an
exchange; 128-bit security, the curve of the SecAgg paper, Bonawitz et al. 2017), and the last
two private keys stay loaded. Flower's code for everything else (PEM encoding, ECDH, HKDF,
Fernet) is unchanged, but every site of a round must use the same curve, so this module is
installed with the masks (``use_fedweave_secagg``), never skipped.

Timing: when splitting, every multiplication is by a share index, a small public number, so the
steps taken depend only on public values; when combining, the loops run over the bits of the
Lagrange coefficients, which follow from the public share indices alone.
"""

from __future__ import annotations

import os
from functools import lru_cache

from Crypto.Util.Padding import pad, unpad
from cryptography.hazmat.primitives.asymmetric import ec

_BITS = 128
_LOW = (1 << _BITS) - 1
_CHUNK = 16
_INDEX_BYTES = 4


def _reduce(product: int) -> int:
    """``product`` (degree < 255) modulo x^128 + x^7 + x^2 + x + 1."""
    for _ in range(2):  # the first fold leaves at most 7 bits above 2^128, the second none
        high = product >> _BITS
        product = (product & _LOW) ^ high ^ (high << 1) ^ (high << 2) ^ (high << 7)
    return product


def gf_mul(value: int, public: int) -> int:
    """``value * public`` in GF(2^128); the loop runs over the bits of ``public``."""
    return _reduce(_clmul(value, public))


def gf_inverse(value: int) -> int:
    """The multiplicative inverse of a nonzero ``value`` (extended Euclid over GF(2)[x])."""
    if value == 0:
        raise ValueError("zero has no inverse")
    r0, r1 = value, (1 << _BITS) | 0b10000111
    s0, s1 = 1, 0
    while r1:
        quotient = 0
        remainder = r0
        while remainder.bit_length() >= r1.bit_length():
            shift = remainder.bit_length() - r1.bit_length()
            quotient ^= 1 << shift
            remainder ^= r1 << shift
        r0, r1 = r1, remainder
        s0, s1 = s1, s0 ^ _clmul(quotient, s1)
    return s0


def _clmul(a: int, b: int) -> int:
    """Carry-less product of two polynomials over GF(2), unreduced; the loop runs over the
    bits of ``b``."""
    product, shift = 0, 0
    while b:
        if b & 1:
            product ^= a << shift
        b >>= 1
        shift += 1
    return product


@lru_cache(maxsize=256)
def lagrange_at_zero(indices: tuple[int, ...]) -> tuple[int, ...]:
    """The coefficients c_j with p(0) = sum c_j p(x_j) for the points ``indices``."""
    coefficients = []
    for j, x_j in enumerate(indices):
        numerator, denominator = 1, 1
        for m, x_m in enumerate(indices):
            if m != j:
                numerator = gf_mul(numerator, x_m)
                denominator = gf_mul(denominator, x_j ^ x_m)
        coefficients.append(gf_mul(numerator, gf_inverse(denominator)))
    return tuple(coefficients)


def create_shares(secret: bytes, threshold: int, num: int) -> list[bytes]:
    """``num`` shares of ``secret``, any ``threshold`` of which rebuild it (Flower's format).

    Every 16-byte chunk of the padded secret gets its own random polynomial; all chunks are
    evaluated at once, each in its own lane of one integer (``_Lanes``).
    """
    if not 1 <= threshold <= num < 2 ** (8 * _INDEX_BYTES):
        raise ValueError(f"cannot make {num} shares with threshold {threshold}")
    padded = pad(secret, _CHUNK)
    lanes = _Lanes(len(padded) // _CHUNK, max_factor=num)
    # p(x) = secret chunk + c_1 x + ... + c_{t-1} x^{t-1}, random c_i, lane by lane
    coefficients = [lanes.pack(os.urandom(len(padded))) for _ in range(threshold - 1)]
    coefficients.append(lanes.pack(padded))
    shares = []
    for index in range(1, num + 1):
        value = 0
        for coefficient in coefficients:  # Horner's method
            value = lanes.times_small(value, index) ^ coefficient
        shares.append(index.to_bytes(_INDEX_BYTES, "little") + lanes.unpack(value))
    return shares


class _Lanes:
    """Many GF(2^128) elements side by side in one integer, ``width`` bits apart, so that one
    shift and XOR acts on all of them; the spare bits above each element's 128 take the
    overflow of a multiplication by a factor below ``2**(width - 128)``."""

    def __init__(self, count: int, max_factor: int) -> None:
        self.count = count
        self.spare = max(8, max_factor.bit_length())
        self.width = _BITS + self.spare
        self.low = sum(_LOW << (lane * self.width) for lane in range(count))
        spare_bits = (1 << self.spare) - 1
        self.high = sum(spare_bits << (lane * self.width + _BITS) for lane in range(count))

    def pack(self, data: bytes) -> int:
        return sum(
            int.from_bytes(data[lane * _CHUNK : (lane + 1) * _CHUNK], "big") << (lane * self.width)
            for lane in range(self.count)
        )

    def unpack(self, packed: int) -> bytes:
        return b"".join(
            ((packed >> (lane * self.width)) & _LOW).to_bytes(_CHUNK, "big")
            for lane in range(self.count)
        )

    def times_small(self, packed: int, factor: int) -> int:
        """Every lane times ``factor`` (< 2**spare): the loop runs over the bits of
        ``factor``; the overflow (< 2**spare, so its x^7 fold stays below 2^128) folds once."""
        product = _clmul(packed, factor)
        high = (product & self.high) >> _BITS
        return (product & self.low) ^ high ^ (high << 1) ^ (high << 2) ^ (high << 7)


def _share_index(share: bytes) -> int:
    return int.from_bytes(share[:_INDEX_BYTES], "little")


def combine_shares(share_list: list[bytes]) -> bytes:
    """The secret that ``share_list`` (at least the threshold's worth) shares."""
    if not share_list or len({len(share) for share in share_list}) != 1:
        raise ValueError("Failed to combine shares")
    chunks = (len(share_list[0]) - _INDEX_BYTES) // _CHUNK
    share_list = sorted(share_list, key=_share_index)  # one coefficient set per index set
    indices = tuple(_share_index(share) for share in share_list)
    if len(set(indices)) != len(indices) or 0 in indices:
        raise ValueError("Duplicate share")
    coefficients = lagrange_at_zero(indices)
    secret = bytearray()
    for chunk in range(chunks):
        start = _INDEX_BYTES + chunk * _CHUNK
        value = 0
        for share, coefficient in zip(share_list, coefficients):
            value ^= gf_mul(int.from_bytes(share[start : start + _CHUNK], "big"), coefficient)
        secret += value.to_bytes(_CHUNK, "big")
    try:
        return unpad(bytes(secret), _CHUNK)
    except ValueError:
        raise ValueError("Failed to combine shares") from None


KEY_CURVE = ec.SECP256R1


def generate_key_pairs() -> tuple[ec.EllipticCurvePrivateKey, ec.EllipticCurvePublicKey]:
    """A site's SecAgg+ key pair, on ``KEY_CURVE``."""
    private_key = ec.generate_private_key(KEY_CURVE())
    return private_key, private_key.public_key()


def install() -> None:
    """Swap these into Flower's SecAgg+ site mod and coordinator workflow (the version guard
    and idempotence are the caller's: ``fedweave.flower_patches``)."""
    import importlib

    secaggplus_mod = importlib.import_module("flwr.client.mod.secure_aggregation.secaggplus_mod")
    secaggplus_workflow = importlib.import_module(
        "flwr.server.workflow.secure_aggregation.secaggplus_workflow"
    )
    secaggplus_mod.create_shares = create_shares
    secaggplus_mod.generate_key_pairs = generate_key_pairs
    # the stage loops load the same key for every neighbour; two: sk1 and sk2 of one round
    secaggplus_mod.bytes_to_private_key = lru_cache(maxsize=2)(secaggplus_mod.bytes_to_private_key)
    secaggplus_workflow.combine_shares = combine_shares
