"""Samples per second of the DataLoader training path vs the earlier in-memory loop.

Sites now train through ``torch.utils.data.DataLoader`` (so data can stream from disk); data
held in memory goes through ``InMemoryDataset``, which hands the loader whole batches. This
bench times one epoch of each built-in task's local training both ways, the earlier loop
(an ``index_select`` per batch straight from the arrays, copied here as it was) being the
baseline, and prints the ratio (goal: >= 0.9).

    python bench/bench_dataloader.py [--tasks digits mnist5k] [--repeats 5] [--batch-size 16]
"""

from __future__ import annotations

import argparse
import statistics
import time
from functools import partial

import numpy as np
import torch

from fedweave.learning.objectives import MultiClass
from fedweave.learning.tasks import load_task
from fedweave.learning.training import TrainConfig, make_optimizer, train_epochs


def earlier_epoch(model, data, config: TrainConfig) -> None:
    """One epoch as ``train_epochs`` ran before the DataLoader (CPU, no AMP, no prox)."""
    generator = torch.Generator().manual_seed(config.seed)
    x_all = torch.from_numpy(np.ascontiguousarray(data.x, dtype=np.float32))
    y_all = torch.from_numpy(np.ascontiguousarray(data.y, dtype=np.int64))
    order = torch.randperm(len(data), generator=generator)
    optimizer = make_optimizer(model, config)
    objective = MultiClass()
    model.train()
    loss_sum = torch.zeros(())
    correct = torch.zeros((), dtype=torch.long)
    for start in range(0, len(data), config.batch_size):
        idx = order[start : start + config.batch_size]
        xb, yb = x_all.index_select(0, idx), y_all.index_select(0, idx)
        optimizer.zero_grad(set_to_none=True)
        logits = model(xb)
        loss = objective.loss(logits, yb)
        loss.backward()
        optimizer.step()
        loss_sum += loss.detach() * yb.shape[0]
        correct += (logits.detach().argmax(dim=1) == yb).sum()
    float(loss_sum.item())


def samples_per_second(run, data, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        run()
        times.append(time.perf_counter() - started)
    return len(data) / statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", nargs="+", default=["digits", "mnist5k"])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--batch-size", type=int, default=16)
    args = parser.parse_args()
    torch.set_num_threads(1)
    print(f"{'task':<10} {'earlier loop':>14} {'DataLoader':>12} {'ratio':>7}  (samples/s, CPU)")
    for name in args.tasks:
        task = load_task(name)
        data, _ = task.load_data()
        config = TrainConfig(epochs=1, batch_size=args.batch_size, device="cpu", seed=1)
        torch.manual_seed(0)
        model = task.build_model()
        earlier_epoch(model, data, config)  # warm-up both paths
        train_epochs(model, data, config)
        # Interleaved, so a machine's drift hits both alike.
        old, new = [], []
        for _ in range(args.repeats):
            old.append(samples_per_second(partial(earlier_epoch, model, data, config), data, 1))
            new.append(samples_per_second(partial(train_epochs, model, data, config), data, 1))
        before, after = statistics.median(old), statistics.median(new)
        print(f"{name:<10} {before:>14.0f} {after:>12.0f} {after / before:>7.3f}")


if __name__ == "__main__":
    main()
