"""Bytes per round and final accuracy of each ``--compress`` kind against none (issue 24),
federated, with SecAgg+'s own bytes per parameter beside them.

    python bench/bench_compression.py --task digits --clients 10 --rounds 20
    python bench/bench_compression.py --task mnist5k --clients 10 --rounds 20
    python bench/bench_compression.py --mode gossip --task digits --clients 10 --rounds 20

With ``--mode gossip`` the kinds are none, fp16 and int8 (gossip sends whole models). Bytes:
the size of one model message (exact, from ``gossip/wire.py``), and what the peers sent (their
transports' counts: every frame of every message, offers, replies and membership) a round and
a mix. How many exchanges a round makes depends on timing (``busy`` answers, a loaded
machine), so the per-round and per-mix figures vary between runs; the message size does not.
Accuracy is the peers' mean after the last round.

Each run is a real ``fedweave simulate`` (the simulation engine; every site trains for real)
with the same seed; the history's counts are what the coordinator's grid saw
(``coordinator/rounds/traffic.py``): each training site's uplink bytes, and the round's bytes in and
out. Prints per kind: mean uplink bytes per site per round, its ratio to ``none``, the final
central test accuracy and its difference to ``none`` in points. The goal: at least one kind
at <= 0.25x the bytes with <= 0.5 point accuracy lost. Then SecAgg+ (no compression): its
uplink bytes per site per round and the bits per model parameter that makes.

Last, whether SecAgg+ could send fewer bits: the final model of the uncompressed run (seed
``--seeds[0]``) is put through SecAgg+'s quantization as each of that run's sites would (its
weight scaled by examples / max weight, clipped to the clipping range, stochastically rounded
to 2**b levels: Flower's own ``quantize``), the sites' integers summed and dequantized, and
the resulting model scored on the central test set, for several b. The sum of the sites'
integers must also fit the mask modulus: b + log2(sites) bits per value on the wire.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

KINDS = ("none", "fp16", "int8", "topk:0.1", "topk:0.05")


def run_gossip(kind: str, args: argparse.Namespace, seed: int, work: Path) -> dict:
    """One recorded gossip simulation: bytes a peer sent a round, the peers' mean final
    accuracy."""
    name = f"gossip-{kind}-{seed}"
    db = work / f"{name}.db"
    out = work / f"{name}.json"
    command = [
        sys.executable, "-m", "fedweave.cli", "simulate", "--mode", "gossip",
        "--task", args.task, "--clients", str(args.clients), "--rounds", str(args.rounds),
        "--seed", str(seed), "--partition", args.partition, "--compress", kind,
        "--db", f"sqlite:///{db}", "--out", str(out), "--checkpoint-dir", str(work / "ck"),
    ]  # fmt: skip
    started = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, cwd=work)
    if done.returncode != 0:
        raise SystemExit(f"{name} failed: {done.stderr[-2000:]}")
    from fedweave.gossip import wire
    from fedweave.history import open_store
    from fedweave.learning.tasks import load_task
    from fedweave.learning.weights import get_named_weights

    with open_store(f"sqlite:///{db}") as store:
        runs = [store.rounds(run.run_id) for run in store.list_runs()]
    rows = [row for rounds in runs for row in rounds]
    last: dict[str, int] = {}  # each peer's running count of mixes, at its last round
    for row in rows:
        last[row["actor"]] = max(last.get(row["actor"], 0), int(row["extra"]["mixes"]))
    mixes = sum(last.values())
    model = load_task(args.task).build_model()
    offer = wire.Message(wire.OFFER, "bench", tensors=get_named_weights(model),
                         encoding="raw" if kind == "none" else kind)  # fmt: skip
    return {
        "uplink": statistics.mean(row["bytes_out"] for row in rows),
        "per_mix": sum(row["bytes_out"] for row in rows) / max(mixes, 1),
        "message": sum(len(memoryview(f).cast("B")) for f in wire.encode(offer)),
        "final": json.loads(out.read_text())["final_accuracy"],
        "parameters": sum(p.numel() for p in model.parameters()),
        "wall_s": time.perf_counter() - started,
    }


def run(kind: str, secure: bool, args: argparse.Namespace, seed: int, work: Path) -> dict:
    """One recorded simulation: its uplink bytes per site and round, and final accuracy."""
    name = f"{kind.replace(':', '-')}-{'secagg' if secure else 'plain'}-{seed}"
    db = work / f"{name}.db"
    command = [
        sys.executable, "-m", "fedweave.cli", "simulate", "--task", args.task,
        "--clients", str(args.clients), "--rounds", str(args.rounds), "--seed", str(seed),
        "--partition", args.partition, "--evaluate-every", "0", "--eval-fraction", "0",
        "--db", f"sqlite:///{db}", "--out", str(work / f"{name}.json"),
        "--checkpoint-dir", str(work / "ck"),
    ]  # fmt: skip
    command += [] if secure else ["--no-secure-agg", "--compress", kind]
    started = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, cwd=work)
    if done.returncode != 0:
        raise SystemExit(f"{name} failed: {done.stderr[-2000:]}")
    from fedweave.history import open_store
    from fedweave.learning.tasks import load_task

    with open_store(f"sqlite:///{db}") as store:
        run_id = store.list_runs()[0].run_id
        rows = store.rounds(run_id)
        sites = store.site_results(run_id)
    uplinks = [s["metrics"]["uplink_bytes"] for s in sites if s["status"] == "ok"]
    parameters = sum(p.numel() for p in load_task(args.task).build_model().parameters())
    return {
        "uplink": statistics.mean(uplinks),
        "bytes_in": sum(r["bytes_in"] for r in rows),
        "bytes_out": sum(r["bytes_out"] for r in rows),
        "final": rows[-1]["eval_accuracy"],
        "parameters": parameters,
        "checkpoint": rows[-1]["checkpoint_path"],
        "examples": [s["num_examples"] for s in sites if s["round"] == rows[-1]["round"]],
        "wall_s": time.perf_counter() - started,
    }


def fewer_secagg_bits(task_name: str, found: dict, bits: list[int]) -> list[tuple[int, float]]:
    """(b, central accuracy) of ``found``'s final model after SecAgg+'s quantization at 2**b
    levels by each of its sites, summed and dequantized (see the module docstring)."""
    import numpy as np
    import torch
    from flwr.common.secure_aggregation.quantization import dequantize, quantize

    from fedweave.coordinator.rounds.secure_agg import SecAggSettings
    from fedweave.learning.data import central_test_data
    from fedweave.learning.tasks import load_task
    from fedweave.learning.training import TrainConfig
    from fedweave.learning.weights import load_weights_npz, set_weights

    task = load_task(task_name)
    test = central_test_data(task, None)
    weights = [w.astype(np.float64) for w in load_weights_npz(found["checkpoint"])]
    settings = SecAggSettings()
    scales = [n / settings.max_weight for n in found["examples"]]
    out = []
    for b in bits:
        total = None
        for scale in scales:
            levels = quantize([w * scale for w in weights], settings.clipping_range, 2**b)
            total = levels if total is None else [t + q for t, q in zip(total, levels)]
        # the sum of k sites' levels, each offset by the clipping range: dequantize's inverse
        summed = dequantize(total, settings.clipping_range, 2**b)
        offset = (len(scales) - 1) * settings.clipping_range
        model = [(s - offset) / sum(scales) for s in summed]
        net = task.build_model()
        set_weights(net, [m.astype(np.float32) for m in model])
        torch.manual_seed(0)
        scored = task.evaluate(net, test, TrainConfig.for_task(task, device="cpu"))
        out.append((b, float(scored["accuracy"])))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mode", choices=("federated", "gossip"), default="federated")
    parser.add_argument("--task", default="digits")
    parser.add_argument("--partition", default="auto")
    parser.add_argument("--clients", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--kinds", nargs="+", help=f"default: {' '.join(KINDS)} (federated), "
                        "none fp16 int8 (gossip)")  # fmt: skip
    parser.add_argument("--no-secagg", action="store_true", help="skip the SecAgg+ run")
    parser.add_argument(
        "--bits",
        type=int,
        nargs="+",
        default=[22, 18, 16, 14, 12, 10, 8],
        help="SecAgg+ quantization levels 2**b to try (Flower's default 22)",
    )
    parser.add_argument("--json", type=Path, help="also write every result here")
    args = parser.parse_args()
    if args.mode == "gossip":
        gossip(args)
        return
    args.kinds = args.kinds or list(KINDS)
    results: dict[str, dict[int, dict]] = {}
    with tempfile.TemporaryDirectory(prefix="fedweave-bench-compress-") as tmp:
        for seed in args.seeds:
            for kind in args.kinds:
                found = run(kind, False, args, seed, Path(tmp))
                results.setdefault(kind, {})[seed] = found
                print(
                    f"{args.task} seed {seed} {kind:10s}: uplink {found['uplink']:10.0f} B a "
                    f"site a round; final accuracy {found['final']:.4f} "
                    f"({found['wall_s']:.0f} s)", flush=True,
                )  # fmt: skip
            if not args.no_secagg:
                found = run("none", True, args, seed, Path(tmp))
                results.setdefault("secagg+", {})[seed] = found
                print(
                    f"{args.task} seed {seed} SecAgg+   : uplink {found['uplink']:10.0f} B a "
                    f"site a round ({8 * found['uplink'] / found['parameters']:.1f} bits a "
                    f"parameter); final accuracy {found['final']:.4f}", flush=True,
                )  # fmt: skip
            if seed == args.seeds[0] and "none" in results:
                quantized = fewer_secagg_bits(args.task, results["none"][seed], args.bits)
    base = results["none"]
    print(f"\n{args.task}, {args.clients} sites, {args.rounds} rounds, seeds {args.seeds}:")
    for kind, by_seed in results.items():
        ratio = statistics.mean(by_seed[s]["uplink"] / base[s]["uplink"] for s in args.seeds)
        gap = statistics.mean(100 * (by_seed[s]["final"] - base[s]["final"]) for s in args.seeds)
        bits = statistics.mean(
            8 * by_seed[s]["uplink"] / by_seed[s]["parameters"] for s in args.seeds
        )
        print(
            f"  {kind:10s} uplink {ratio:6.3f}x none ({bits:5.2f} bits a parameter), final "
            f"accuracy {statistics.mean(by_seed[s]['final'] for s in args.seeds):.4f} "
            f"({gap:+.2f} points)"
            + ("  <- goal met (<= 0.25x, >= -0.5 points)" if ratio <= 0.25 and gap >= -0.5
               else "")
        )  # fmt: skip
    sites = len(results["none"][args.seeds[0]]["examples"])
    print(
        f"SecAgg+ quantization of seed {args.seeds[0]}'s final uncompressed model "
        f"(accuracy {base[args.seeds[0]]['final']:.4f}) by its {sites} sites:"
    )
    for b, accuracy in quantized:
        wire = b + math.ceil(math.log2(sites))
        print(f"  2**{b:<2d} levels: accuracy {accuracy:.4f} "
              f"({100 * (accuracy - base[args.seeds[0]]['final']):+.2f} points); the sum needs "
              f"{wire} bits a value (fedweave sends 32)")  # fmt: skip
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))


def gossip(args: argparse.Namespace) -> None:
    """``--mode gossip``: each kind's bytes a peer sends a round and final accuracy."""
    kinds = args.kinds or ["none", "fp16", "int8"]
    results: dict[str, dict[int, dict]] = {}
    with tempfile.TemporaryDirectory(prefix="fedweave-bench-compress-") as tmp:
        for seed in args.seeds:
            for kind in kinds:
                found = run_gossip(kind, args, seed, Path(tmp))
                results.setdefault(kind, {})[seed] = found
                print(
                    f"gossip {args.task} seed {seed} {kind:5s}: model message "
                    f"{found['message']} B; {found['uplink']:10.0f} B a peer a round, "
                    f"{found['per_mix']:9.0f} B a mix; mean final accuracy {found['final']:.4f} "
                    f"({found['wall_s']:.0f} s)", flush=True,
                )  # fmt: skip
    base = results["none"]
    print(f"\ngossip {args.task}, {args.clients} peers, {args.rounds} rounds, seeds {args.seeds}:")
    for kind, by_seed in results.items():
        ratio = statistics.mean(by_seed[s]["uplink"] / base[s]["uplink"] for s in args.seeds)
        gap = statistics.mean(100 * (by_seed[s]["final"] - base[s]["final"]) for s in args.seeds)
        per_mix = statistics.mean(by_seed[s]["per_mix"] / base[s]["per_mix"] for s in args.seeds)
        message = by_seed[args.seeds[0]]["message"] / base[args.seeds[0]]["message"]
        print(
            f"  {kind:5s} model message {message:6.3f}x none; bytes sent a round {ratio:6.3f}x, "
            f"a mix {per_mix:6.3f}x; mean final accuracy "
            f"{statistics.mean(by_seed[s]['final'] for s in args.seeds):.4f} ({gap:+.2f} points)"
        )
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
