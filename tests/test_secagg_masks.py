"""SecAgg+'s mask generator and quantization (fedweave.flower_patches.secagg_masks).

Needs numpy, cryptography and Flower only (no torch), so tests/test_python_versions.py also
runs it on every Python version the project claims.
"""

from __future__ import annotations

import hashlib

import numpy as np
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

from fedweave.flower_patches import secagg_masks
from fedweave.flower_patches.secagg_masks import (
    FAST_MODULUS,
    _make_prg,
    keystream_uint32,
    quantize_flat,
    unflatten,
)


def test_quantize_flat_is_one_uint32_vector_a_function_of_the_update():
    rng = np.random.default_rng(3)
    update = [rng.normal(size=(7, 5)).astype(np.float32), rng.normal(size=11), np.zeros(())]
    clip, levels = 2.0, 2**20
    first = quantize_flat(update, clip, levels)
    assert len(first) == 1 and first[0].dtype == np.uint32 and first[0].size == 35 + 11 + 1
    assert np.array_equal(first[0], quantize_flat(update, clip, levels)[0])
    assert int(first[0].max()) <= levels
    # within one quantization step of the exact value (clipped to the range)
    exact = (np.clip(np.concatenate([np.ravel(a) for a in update]), -clip, clip) + clip) * (
        levels / (2 * clip)
    )
    assert np.all(np.abs(first[0] - exact) <= 1.0)
    changed = [update[0], update[1] + 1e-3, update[2]]
    assert not np.array_equal(first[0], quantize_flat(changed, clip, levels)[0])


def test_quantize_flat_rounds_without_bias():
    clip, levels = 8.0, 2**22
    step = 2 * clip / levels
    rounded = quantize_flat([np.full(100_000, -clip + 0.25 * step)], clip, levels)[0]
    assert set(np.unique(rounded)) <= {0, 1}
    assert abs(float(rounded.mean()) - 0.25) < 0.01


def _whole_vector_quantize(parameters, clipping_range, target_range):
    """``quantize_flat`` as it was written before it went a part at a time (issue 36): the
    update in float64 whole, its digest, all its noise in one draw."""
    scaled = np.concatenate([np.ravel(array) for array in parameters], dtype=np.float64)
    digest = hashlib.blake2b(scaled.data, digest_size=16).digest()
    noise = np.random.default_rng(int.from_bytes(digest, "big")).random(scaled.size)
    np.clip(scaled, -clipping_range, clipping_range, out=scaled)
    scaled += clipping_range
    scaled *= target_range / (2 * clipping_range)
    rounded = np.floor(scaled)
    scaled -= rounded
    rounded += noise < scaled
    return rounded.astype(np.uint32)


def test_quantizing_a_part_at_a_time_gives_the_whole_vectors_values(monkeypatch):
    """Seeded runs repeat their recorded numbers: the digest, the noise and every rounded
    value are those of the whole-vector computation, for parts that split arrays and span
    them, a Fortran-ordered array and a 0-d one among them."""
    rng = np.random.default_rng(4)
    update = [
        (3 * rng.normal(size=(13, 7))).astype(np.float32),
        np.asfortranarray(rng.normal(size=(6, 9)).astype(np.float32)),
        rng.normal(size=()),
        (20 * rng.normal(size=50)).astype(np.float32),  # clipped, some of it
    ]
    expected = _whole_vector_quantize(update, 8.0, 2**22)
    for chunk in (1, 7, 64, 10_000):
        monkeypatch.setattr(secagg_masks, "QUANTIZE_CHUNK", chunk)
        got = quantize_flat(update, 8.0, 2**22)[0]
        assert got.dtype == np.uint32 and np.array_equal(got, expected), chunk


def test_keystream_is_aes256_ctr_keyed_by_the_seed_digest(monkeypatch):
    seed = bytes(range(32))
    key = hashlib.sha256(seed).digest()
    expected = (
        Cipher(algorithms.AES(key), modes.CTR(b"\0" * 16)).encryptor().update(bytes(4 * 1001))
    )
    for chunk in (4, 5, 256, 1 << 20):  # encrypted into the result a part at a time
        monkeypatch.setattr(secagg_masks, "_ZEROS", memoryview(bytes(4 * chunk)))
        stream = keystream_uint32(seed, 1001)
        assert stream.dtype == np.uint32 and stream.size == 1001
        assert stream.tobytes() == expected, chunk
    assert not np.array_equal(stream, keystream_uint32(b"another seed", 1001))


def test_mask_generator_shapes_the_stream_and_keeps_flower_for_other_moduli():
    calls = []

    def flower_prg(seed, num_range, dimensions_list):
        calls.append(num_range)
        return ["flower"]

    prg = _make_prg(flower_prg)
    dims = [(3, 4), (5,), ()]
    masks = prg(b"seed", FAST_MODULUS, dims)
    assert [m.shape for m in masks] == [(3, 4), (5,), ()]
    assert np.array_equal(
        np.concatenate([np.ravel(m) for m in masks]), keystream_uint32(b"seed", 18)
    )
    assert calls == []
    assert prg(b"seed", 2**16, dims) == ["flower"] and calls == [2**16]


def test_unflatten_restores_the_model_shapes_and_dtypes():
    like = [np.zeros((2, 3), np.float32), np.zeros(4, np.float64)]
    flat = [np.arange(10, dtype=np.float64)]
    back = unflatten(flat, like)
    assert [b.shape for b in back] == [(2, 3), (4,)]
    assert [b.dtype for b in back] == [np.float32, np.float64]
    assert back[1].tolist() == [6.0, 7.0, 8.0, 9.0]
    assert unflatten(flat, like[:1]) is flat  # not a flat aggregate of these shapes


def test_the_sites_masking_steps_in_place_give_flowers_values_and_dtypes(monkeypatch):
    """The site's ``_collect_masked_vectors`` steps, done into the vector it makes: the same
    values and dtypes as Flower's functions, and no new vector where the dtype allows. Its
    masks (``_make_lazy_prg``: ``MaskPart`` s) are generated where they are added, a part
    at a time; its update is scaled where it is quantized (``ScaledArray``)."""
    from flwr.common.secure_aggregation.ndarrays_arithmetic import (
        parameters_addition,
        parameters_mod,
        parameters_multiply,
        parameters_subtraction,
    )

    from fedweave.flower_patches.secagg_masks import (
        MaskPart,
        _make_lazy_prg,
        added_in_place,
        modulo_in_place,
        scaled_lazily,
        subtracted_in_place,
    )

    monkeypatch.setattr(secagg_masks, "QUANTIZE_CHUNK", 7)  # every part edge crossed
    rng = np.random.default_rng(5)

    def vector():  # the weight factor and one flat vector, as a site masks them
        return [np.array([2**31 + 5], np.int64), rng.integers(0, 2**32, 500, dtype=np.uint32)]

    shapes = [(1,), (500,)]
    eager = _make_prg(lambda *a: None)(b"s" * 32, FAST_MODULUS, shapes)
    lazy = _make_lazy_prg(lambda *a: None)(b"s" * 32, FAST_MODULUS, shapes)
    assert [type(m) for m in lazy] == [MaskPart, MaskPart]
    assert all(np.array_equal(m.whole(), e) for m, e in zip(lazy, eager))
    cases = [
        (parameters_addition, added_in_place, vector, eager, lazy),
        (parameters_subtraction, subtracted_in_place, vector, eager, lazy),
        (parameters_mod, modulo_in_place, vector, 2**32, 2**32),
        (parameters_mod, modulo_in_place, vector, 3 * 2**20, 3 * 2**20),  # not a power of 2
    ]
    for flowers, ours, make, theirs, other in cases:
        state = rng.bit_generator.state
        expected = flowers(make(), theirs)
        rng.bit_generator.state = state
        given = make()
        got = ours(given, other)
        for g, e in zip(got, expected):
            assert g.dtype == e.dtype and np.array_equal(g, e), (ours.__name__, g.dtype)
        in_place = [g is a for g, a in zip(got, given)]
        assert all(in_place) == (other != 3 * 2**20), ours.__name__  # that modulo: Flower's
    read_only = [np.frombuffer(a.tobytes(), a.dtype) for a in vector()]
    np.testing.assert_array_equal(added_in_place(read_only, lazy)[1],
                                  parameters_addition(read_only, eager)[1])  # fmt: skip

    # scaled where quantized: Flower's product in each array's dtype, an int one included
    update = [
        (3 * rng.normal(size=(4, 3))).astype(np.float32),
        np.array(7, np.int64),
        np.asfortranarray(rng.normal(size=(3, 5))),
    ]
    factor = 0.37
    expected = _whole_vector_quantize(parameters_multiply(update, factor), 8.0, 2**22)
    got = quantize_flat(scaled_lazily(update, factor), 8.0, 2**22)[0]
    assert got.dtype == np.uint32 and np.array_equal(got, expected)
