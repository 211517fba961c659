"""Memory the coordinator's update checks take beside one update (issue 36): the peak that
``tracemalloc`` sees (numpy reports its buffers to it) while ``update_problem`` checks an update
of the 64-8192-8192-10 MLP (67.7M parameters, 271 MB), with and without ``--max-update-norm``.

    python bench/bench_update_checks.py [--width 8192]

Before the checks read a chunk at a time, the norm bound made a float64 copy of the largest
tensor (537 MB at width 8192) and the finite check a boolean one (67 MB).
"""

from __future__ import annotations

import argparse
import time
import tracemalloc

import numpy as np

from fedweave.learning.validation import update_problem


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--width", type=int, default=8192)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    shapes = [(args.width, 64), (args.width,), (args.width, args.width), (args.width,),
              (10, args.width), (10,)]  # fmt: skip
    reference = [rng.standard_normal(s, dtype=np.float32) for s in shapes]
    update = [w + np.float32(1e-3) for w in reference]
    model_mb = sum(w.nbytes for w in update) / 1e6
    print(f"model: {sum(w.size for w in update) / 1e6:.1f}M parameters, {model_mb:.0f} MB")
    for label, bound in (("finite, shapes, dtypes", None), ("and --max-update-norm", 1e9)):
        tracemalloc.start()
        started = time.perf_counter()
        problem = update_problem(update, reference, max_norm=bound)
        seconds = time.perf_counter() - started
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        assert problem is None, problem
        print(f"{label:24s} peak beside the update {peak / 1e6:7.2f} MB "
              f"({peak / 1e6 / model_mb:.4f} of the model), {seconds:.2f} s")  # fmt: skip


if __name__ == "__main__":
    main()
