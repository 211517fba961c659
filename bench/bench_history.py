"""What recording the history costs: time added per round, and bytes per round per site.

Runs the same federated digits simulation with and without the history recorder
(checkpoint file + one SQL transaction per round, on its writer thread, exactly as
`fedweave simulate` does), alternating, and compares the steady-state time between
consecutive round ends (round 1 carries Ray's start-up and is left out). Prints the
recording overhead in % of a round (goal < 2%), the recorder's own time per round, and
the database growth per round per site (checkpoint files are reported separately).

    python bench/bench_history.py --clients 10 --rounds 20 --trials 2
"""

from __future__ import annotations

import argparse
import sqlite3
import statistics
import tempfile
import time
from pathlib import Path

from fedweave.config import RunConfig
from fedweave.coordinator.rounds.history_listener import BackgroundRecorder, HistoryRecorder
from fedweave.history import open_store
from fedweave.history.round_summary import RoundSummary
from fedweave.simulations.federated import run_federated_simulation


class RoundClock:
    """Round-end times, to measure the cadence of rounds."""

    def __init__(self) -> None:
        self.ends: list[float] = []

    def on_round(self, summary: RoundSummary) -> None:
        self.ends.append(time.perf_counter())

    def steady_round_seconds(self) -> list[float]:
        return [b - a for a, b in zip(self.ends[1:], self.ends[2:])]


class TimedRecorder(HistoryRecorder):
    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.seconds: list[float] = []

    def on_round(self, summary: RoundSummary) -> None:
        started = time.perf_counter()
        super().on_round(summary)
        self.seconds.append(time.perf_counter() - started)


def sqlite_bytes(path: Path) -> int:
    with sqlite3.connect(path) as conn:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    return path.stat().st_size


def one_run(config: RunConfig, record: bool, tmp: Path) -> tuple[list[float], dict]:
    clock = RoundClock()
    if not record:
        run_federated_simulation(config, listeners=[clock])
        return clock.steady_round_seconds(), {}
    db_file = tmp / f"history-{time.monotonic_ns()}.db"
    store = open_store(f"sqlite:///{db_file}")
    before = sqlite_bytes(db_file)
    run_id = store.start_run("federated", config.data.task, {"bench": True}, config.training.seed)
    timed = TimedRecorder(store, run_id, tmp / "ckpt")
    writer = BackgroundRecorder(timed)
    run_federated_simulation(config, listeners=[writer, clock])
    writer.flush()
    writer.close()
    store.finish_run(run_id, "completed")
    store.close()
    sizes = [p.stat().st_size for p in (tmp / "ckpt" / run_id).iterdir()]
    return clock.steady_round_seconds(), {
        "recorder_ms": 1000 * statistics.median(timed.seconds),
        "db_growth": sqlite_bytes(db_file) - before,
        "checkpoint_bytes": statistics.mean(sizes),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--trials", type=int, default=2)
    args = parser.parse_args()
    config = RunConfig.of(clients=args.clients, rounds=args.rounds, partition="dirichlet")
    plain: list[float] = []
    recorded: list[float] = []
    facts: dict = {}
    with tempfile.TemporaryDirectory() as tmp:
        for trial in range(args.trials):
            for record in (False, True) if trial % 2 == 0 else (True, False):
                seconds, info = one_run(config, record, Path(tmp))
                (recorded if record else plain).extend(seconds)
                facts = info or facts
                print(
                    f"trial {trial + 1} {'recorded' if record else 'plain   '} "
                    f"median round {1000 * statistics.median(seconds):.1f} ms",
                    flush=True,
                )
    base, with_history = statistics.median(plain), statistics.median(recorded)
    print(f"clients={args.clients} rounds={args.rounds} trials={args.trials} (SQLite)")
    print(f"median round without history {1000 * base:.1f} ms, with {1000 * with_history:.1f} ms")
    print(f"recording overhead = {100 * (with_history - base) / base:+.2f}% of a round (goal < 2%)")
    print(f"recorder's own time per round (on its writer thread): {facts['recorder_ms']:.2f} ms")
    per = facts["db_growth"] / (args.rounds * args.clients)
    print(
        f"SQLite growth {facts['db_growth']} bytes = {per:.0f} bytes per round per site; "
        f"checkpoint file {facts['checkpoint_bytes']:.0f} bytes per round"
    )


if __name__ == "__main__":
    main()
