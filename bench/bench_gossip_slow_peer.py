"""Seconds the other peers lose per round while one peer's replies are late.

Runs ``--peers`` real ``fedweave peer`` processes on loopback in vector mode (no training, so
a round is its exchanges), lets them warm up, then stops one of them (SIGSTOP) for
``--stall`` seconds: every offer to it misses its deadline (``--exchange-timeout``) and it
holds whatever was offered to it. Then it resumes (SIGCONT) and the run ends.

For the peers that stayed up it counts, over the rounds they ran during the stall, the
deadlines they missed on the stopped peer (its direct partners must lose those) and the
deadlines they missed on peers that were up: a peer waiting on the stopped one must not
make its own offerers wait past their deadlines. Those extra misses, as seconds per round,
are what one slow peer costs the rest of the network. Needs the round events'
``failed_peers`` (the peers that missed their deadline in that round).

    python bench/bench_gossip_slow_peer.py [--peers 8] [--fanout 3] [--stall 8]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from fedweave.addresses import free_ports
from fedweave.gossip.keys import new_key_group
from fedweave.processes import stop_process_group, tied_to_us

VECTOR_PEER = Path(__file__).resolve().parents[1] / "tests" / "vector_peer.py"
"""A gossip peer whose model is a fixed vector (the protocol alone, no training)."""


def spawn_peers(args: argparse.Namespace, work: Path) -> list[subprocess.Popen[bytes]]:
    ports = free_ports(args.peers)
    env = dict(os.environ, OMP_NUM_THREADS="1", FEDWEAVE_DB="none")
    keys = [work / f"keys-{i}" for i in range(args.peers)]
    new_key_group(keys)  # CURVE, as default peers run
    procs = []
    for i in range(args.peers):
        np.save(work / f"v{i}.npy", np.full(args.dim, float(i), dtype=np.float32))
        argv = [
            sys.executable, str(VECTOR_PEER), "peer",
            "--listen", f"tcp://127.0.0.1:{ports[i]}",
            "--vector", str(work / f"v{i}.npy"),
            "--rounds", "0", "--fanout", str(args.fanout),
            "--round-interval", str(args.round_interval),
            "--exchange-timeout", str(args.exchange_timeout),
            "--wait-for-peers", str(args.peers), "--connect-timeout", "60",
            "--log-level", "warning", "--results", str(work / f"r{i}.jsonl"),
            "--keys", str(keys[i]),
        ]  # fmt: skip
        if i:
            argv += ["--seeds", f"tcp://127.0.0.1:{ports[0]}"]
        with (work / f"p{i}.log").open("wb") as log:
            procs.append(
                subprocess.Popen(
                    argv, env=env, stdout=log, stderr=subprocess.STDOUT, **tied_to_us()
                )
            )
    return procs


def rounds_of(path: Path) -> list[dict]:
    if not path.exists():
        return []
    events = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [e for e in events if e["event"] == "round"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--peers", type=int, default=8)
    parser.add_argument("--fanout", type=int, default=3)
    parser.add_argument("--dim", type=int, default=100_000, help="floats in each peer's model")
    parser.add_argument("--exchange-timeout", type=float, default=1.0)
    parser.add_argument("--round-interval", type=float, default=0.0, help="0: back to back")
    parser.add_argument("--warmup", type=float, default=6.0, help="seconds before the stall")
    parser.add_argument("--stall", type=float, default=8.0, help="seconds the peer is stopped")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="fw-slow-peer-") as tmp:
        work = Path(tmp)
        procs = spawn_peers(args, work)
        slow = args.peers - 1
        try:
            deadline = time.monotonic() + 120
            while min(len(rounds_of(work / f"r{i}.jsonl")) for i in range(args.peers)) < 5:
                if time.monotonic() > deadline:
                    sys.exit("the peers did not start; see their logs")
                time.sleep(0.2)
            time.sleep(args.warmup)
            stopped = time.time()
            procs[slow].send_signal(signal.SIGSTOP)
            time.sleep(args.stall)
            resumed = time.time()
            procs[slow].send_signal(signal.SIGCONT)
            time.sleep(2.0)
        finally:
            procs[slow].send_signal(signal.SIGCONT)
            for p in procs:
                stop_process_group(p, grace=20)

        slow_id = ready_id(work / f"r{slow}.jsonl")
        rounds = 0
        on_slow = on_others = 0
        for i in range(args.peers):
            if i == slow:
                continue
            for r in rounds_of(work / f"r{i}.jsonl"):
                start, end = r["t"] - r["seconds"], r["t"]
                if start >= stopped and end <= resumed + args.exchange_timeout:
                    rounds += 1
                    failed = r.get("failed_peers", [])
                    on_slow += sum(pid == slow_id for pid in failed)
                    on_others += sum(pid != slow_id for pid in failed)

    print(
        f"{args.peers} peers, fanout {args.fanout}, {args.dim} floats, deadline "
        f"{args.exchange_timeout:g}s, rounds "
        f"{'back to back' if not args.round_interval else f'in {args.round_interval:g}s slots'}"
        f"; one peer stopped for {args.stall:g}s"
    )
    print(f"rounds the other {args.peers - 1} peers ran during the stall: {rounds}")
    print(f"  deadlines missed on the stopped peer (its direct partners' cost): {on_slow}")
    print(f"  deadlines missed on peers that were up (the stall's cost to the rest): {on_others}")
    if rounds:
        per_round = on_others * args.exchange_timeout / rounds
        print(
            f"seconds lost per round by the other peers, beyond the partners' deadlines: "
            f"{per_round:.3f} (at most one deadline per miss)"
        )


def ready_id(path: Path) -> str:
    events = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return next(e["peer"] for e in events if e["event"] == "ready")


if __name__ == "__main__":
    main()
