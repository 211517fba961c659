"""The checks every update passes before it enters an aggregate (``fedweave.learning.validation``):
the verdicts, and the memory they take beside a large update (issue 36: the norm bound made a
float64 copy of the largest tensor, 537 MB for an 8192 x 8192 layer)."""

from __future__ import annotations

import tracemalloc

import numpy as np

from fedweave.learning.validation import CHECK_CHUNK, clipped_fraction, update_problem


def _model(rng: np.random.Generator, scale: float = 1.0) -> list[np.ndarray]:
    # one tensor of several chunks and a ragged end, a small one, an integer counter
    return [
        (rng.standard_normal((3 * CHECK_CHUNK + 1234,)) * scale).astype(np.float32),
        (rng.standard_normal((7, 5)) * scale).astype(np.float32),
        np.array([3], dtype=np.int64),
    ]


def test_the_norm_bound_and_the_finite_check_read_every_value():
    rng = np.random.default_rng(0)
    reference = _model(rng)
    update = [w + d for w, d in zip(reference, _model(rng, 0.01))]
    update[2] = reference[2]
    exact = float(np.sqrt(sum(np.sum((u.astype(np.float64) - r) ** 2)
                              for u, r in zip(update[:2], reference[:2]))))  # fmt: skip
    assert update_problem(update, reference, max_norm=exact * 1.000001) is None
    problem = update_problem(update, reference, max_norm=exact * 0.999999)
    assert problem == f"update norm {exact:.3g} exceeds the bound {exact * 0.999999:.3g}"
    for where in (0, CHECK_CHUNK - 1, CHECK_CHUNK, 3 * CHECK_CHUNK + 1233):  # chunk edges, end
        poisoned = [w.copy() for w in update]
        poisoned[0][where] = np.nan
        assert update_problem(poisoned, reference) == "tensor 0 has non-finite values (NaN or inf)"
    huge = [w.copy() for w in update]
    huge[0][-1] = np.float32(3e38)  # finite, but its square overflows float32, not float64
    assert update_problem(huge, reference, max_norm=1e39) is None
    assert update_problem(huge, reference, max_norm=1e37).startswith("update norm 3e+38 exceeds")


def test_checking_a_large_update_takes_a_few_mb_beside_it_not_copies_of_it():
    rng = np.random.default_rng(1)
    size = 16 * CHECK_CHUNK  # 16 MB of float32: its float64 copy alone would be 32 MB
    reference = [rng.standard_normal(size, dtype=np.float32)]
    update = [reference[0] + np.float32(0.5)]
    tracemalloc.start()
    try:
        problem = update_problem(update, reference, max_norm=1.0)
        fraction = clipped_fraction(update, 2.0**20, 2.0**20 * 2.5)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert problem is not None and problem.startswith("update norm 1.02e+03 exceeds")
    assert 0 < fraction < 0.05
    assert peak < 4 * CHECK_CHUNK * 8, peak  # a chunk's float64 temporaries: 2 MB each
