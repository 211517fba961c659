"""Deployed seconds a round beyond local training for a large model (issue 24): the
64-4096-4096-10 MLP on digits (17.1M parameters, 68 MB), a coordinator and 3 sites on
loopback with TLS and site keys, plain and with SecAgg+.

    python bench/bench_large_model.py [--rounds 3] [--modes plain secagg] [--downlink full fp16]
        [--transfer flower bulk] [--sites 3] [--model TASK|WIDE|HUGE] [--memory]

Each run is ``fedweave coordinator`` and ``fedweave client`` as docs/deploy.md sets them up
(``bench_deployment.py``'s setup), with the task ``large_model_task:TASK`` (this folder, on
``PYTHONPATH`` for every process) and federated evaluation off. From the history it prints,
for rounds 2..R (round 1 also pays for the sites' start-up), the round's seconds, the slowest
site's own training seconds, and their difference: the time a round spends on something other
than training. The issues' goals on this machine: at most 2 s plain and 4 s with SecAgg+ for
``TASK``, 4 s and 8 s for ``WIDE`` (``GOALS``).
``--downlink full fp16`` runs each mode with the global model sent both ways (issue 36's
half-size transfer), one after the other in the same process, so the two compare;
``--transfer flower bulk`` the same with the tensors through Flower's messages and through the
coordinator's transfer server (``--bulk-address``, issue 36's bulk path).
``--memory`` adds each run's peak resident memory: the ServerApp's (where the coordinator
aggregates; also as a multiple of the model's size, the goal being ``MEMORY_GOAL``), the
coordinator's processes', the sites', and all of them at one moment.
``--sites-memory GB`` runs the sites in a memory cgroup of that size (root, and swap, needed):
for the coordinator's memory with more sites than this machine's memory holds beside it (12
sites of ``WIDE``). The sites then swap, so their seconds and memory mean little; the
coordinator's processes stay outside the group.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from bench_deployment import fedweave, prepare

from fedweave.addresses import free_port
from fedweave.processes import stop_process_group, tied_to_us

TASK = "large_model_task:TASK"
HERE = Path(__file__).resolve().parent
HIDDEN = {"TASK": 4096, "WIDE": 8192, "HUGE": 16000}
"""``--model`` → the MLP's hidden width (``large_model_task.py``): 64-h-h-10."""
GOALS = {"TASK": (2.0, 4.0), "WIDE": (4.0, 8.0)}
"""``--model`` → issue 36's goals for seconds beyond training, plain and SecAgg+."""
MEMORY_GOAL = 3.0
"""Issue 36's goal for the coordinator's peak: this many times the model's size."""


def model_bytes(model: str) -> int:
    """The float32 bytes of the ``--model`` MLP's parameters."""
    hidden = HIDDEN[model]
    return 4 * (64 * hidden + hidden + hidden * hidden + hidden + hidden * 10 + 10)


def run(
    work: Path,
    sites: int,
    rounds: int,
    secure: bool,
    env: dict[str, str],
    task: str = TASK,
    coordinator_extra: Sequence[str] = (),
    site_command: Callable[[int, list[str]], list[str]] | None = None,
    memory: bool = False,
) -> list[dict]:
    """The recorded rounds of one deployed run, with each site's training seconds, its
    central accuracy and when it ended (seconds since the first round started).
    ``coordinator_extra``: more ``fedweave coordinator`` flags; ``site_command(i, argv)``: how
    site ``i``'s command runs (default: as it is)."""
    from fedweave.history import open_store

    port, db = free_port(), f"sqlite:///{work / f'run-{free_port()}.db'}"
    coordinator = [
        "coordinator", "--address", f"127.0.0.1:{port}", "--task", task,
        "--rounds", str(rounds), "--min-clients", str(sites), "--db", db, "--tls-dir", "tls",
        "--test-data", "split/test.npz", "--once", "--evaluate-every", "0",
        "--round-timeout", "600", "--state-dir", f"state-{port}",
        *([] if secure else ["--no-secure-agg"]), *coordinator_extra,
    ]  # fmt: skip
    procs = []
    sampler = MemorySampler()
    try:
        with (work / f"coordinator-{port}.log").open("wb") as log:
            procs.append(subprocess.Popen(fedweave(*coordinator), cwd=work, env=env, stdout=log,
                                          stderr=log, **tied_to_us()))  # fmt: skip
        for i in range(sites):
            site = [
                "client", "--coordinator", f"127.0.0.1:{port}", "--task", task,
                "--data", f"split/site-{i}.npz", "--ca-cert", "tls/ca.pem",
                "--site-key", f"site{i}.key", "--log-file", f"site{i}-{port}.log",
            ]  # fmt: skip
            command = fedweave(*site) if site_command is None else site_command(i, fedweave(*site))
            with (work / f"site{i}-{port}.out").open("wb") as log:
                procs.append(subprocess.Popen(command, cwd=work, env=env, stdout=log,
                                              stderr=log, **tied_to_us()))  # fmt: skip
        if memory:  # its reads of /proc cost CPU the round's seconds would feel
            sampler.start(procs[0].pid, [proc.pid for proc in procs[1:]])
        code = procs[0].wait(timeout=120 + rounds * 600)
        if code != 0:
            raise SystemExit(f"the coordinator failed (exit {code}); see {work}")
    finally:
        sampler.stop()
        for proc in procs:
            stop_process_group(proc, grace=10)
    with open_store(db) as store:
        run_id = store.list_runs()[0].run_id
        rows, sites_rows = store.rounds(run_id), store.site_results(run_id)
    out = []
    began = rows[0]["started_at"] if rows else None
    for row in rows:
        trained = [s["seconds"] for s in sites_rows if s["round"] == row["round"] and s["seconds"]]
        out.append({"round": row["round"], "seconds": float(row["extra"]["seconds"]),
                    "training": max(trained) if trained else 0.0,
                    "bytes_in": row["bytes_in"], "bytes_out": row["bytes_out"],
                    "accuracy": row["eval_accuracy"],
                    "ended_s": (row["ended_at"] - began).total_seconds(),
                    "memory": sampler.peaks})  # fmt: skip
    return out


def _process_table() -> dict[int, tuple[int, int, str]]:
    """pid → (parent pid, resident bytes, command line) of every process, from ``/proc``."""
    table = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            parent = int(stat[stat.rindex(")") + 2 :].split()[1])
            rss = int((entry / "statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")
            command = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except (OSError, ValueError, IndexError):
            continue  # gone meanwhile
        table[int(entry.name)] = (parent, rss, command)
    return table


def _tree(table: dict[int, tuple[int, int, str]], root: int) -> list[int]:
    found, todo = [], [root]
    while todo:
        pid = todo.pop()
        if pid in table:
            found.append(pid)
            todo.extend(child for child, (parent, _, _) in table.items() if parent == pid)
    return found


class MemorySampler:
    """Peak resident memory, sampled every 0.2 s from ``/proc``: the ServerApp (the
    ``flwr-serverapp`` process, where the coordinator aggregates), the coordinator's whole
    process tree (SuperLink, SuperExec, ServerApp), every site's tree (and the largest one
    site's tree reached), and all of them summed at one moment."""

    def __init__(self) -> None:
        import threading

        self.peaks = {"serverapp": 0, "coordinator": 0, "sites": 0, "site": 0, "all": 0}
        self._done = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self, coordinator: int, sites: list[int]) -> None:
        import threading

        def sample() -> None:
            while not self._done.wait(0.2):
                table = _process_table()
                mine = _tree(table, coordinator)
                each = [sum(table[p][1] for p in _tree(table, site)) for site in sites]
                serverapp = sum(table[p][1] for p in mine if "flwr-serverapp" in table[p][2])
                now = {"serverapp": serverapp, "coordinator": sum(table[p][1] for p in mine),
                       "sites": sum(each), "site": max(each, default=0)}  # fmt: skip
                now["all"] = now["coordinator"] + now["sites"]
                for key, value in now.items():
                    self.peaks[key] = max(self.peaks[key], value)

        self._thread = threading.Thread(target=sample, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._done.set()
        if self._thread is not None:
            self._thread.join(timeout=5)


@contextlib.contextmanager
def sites_cgroup(limit_gb: float | None):
    """A memory cgroup of ``limit_gb`` for the sites (v1 or v2), removed at the end; and how a
    site's command joins it. ``None``: no group, the commands as they are."""
    if limit_gb is None:
        yield None
        return
    if os.geteuid() != 0:
        raise SystemExit("--sites-memory makes a memory cgroup: run the bench as root")
    if len(Path("/proc/swaps").read_text().splitlines()) < 2:
        raise SystemExit(
            "--sites-memory needs swap, or the sites are killed at the limit: e.g. fallocate "
            "-l 16G /swapfile && chmod 600 /swapfile && mkswap /swapfile && swapon /swapfile "
            "(swapoff and rm it after)"
        )
    v1 = Path("/sys/fs/cgroup/memory")
    root, limit_file = (
        (v1, "memory.limit_in_bytes") if (v1 / "memory.limit_in_bytes").exists()
        else (Path("/sys/fs/cgroup"), "memory.max")
    )  # fmt: skip
    group = root / f"fedweave-bench-sites-{os.getpid()}"
    group.mkdir()
    try:
        (group / limit_file).write_text(str(int(limit_gb * 1e9)))

        def joined(_index: int, argv: list[str]) -> list[str]:
            return ["sh", "-c", f'echo $$ > {group}/cgroup.procs && exec "$@"', "sh", *argv]

        yield joined
    finally:
        for _ in range(100):  # the sites' processes are stopped by now; their exits settle
            try:
                group.rmdir()
                break
            except OSError:
                time.sleep(0.1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--sites", type=int, default=3)
    parser.add_argument("--modes", nargs="+", choices=("plain", "secagg"),
                        default=["plain", "secagg"])  # fmt: skip
    parser.add_argument("--downlink", nargs="+", choices=("full", "fp16"), default=["full"],
                        help="how the global model goes to the sites; each one given runs "
                             "every mode (default: full)")  # fmt: skip
    parser.add_argument("--transfer", nargs="+", choices=("flower", "bulk"), default=["flower"],
                        help="how tensors move: in Flower's messages, or beside them through "
                             "the coordinator's transfer server (--bulk-address); each one "
                             "given runs every mode (default: flower)")  # fmt: skip
    parser.add_argument("--model", choices=("TASK", "WIDE", "HUGE"), default="TASK",
                        help="TASK: the 64-4096-4096-10 MLP (17.1M parameters); WIDE: "
                             "64-8192-8192-10 (67.7M); HUGE: 64-16000-16000-10 (257.2M, "
                             "1.03 GB; bench/large_model_task.py)")  # fmt: skip
    parser.add_argument("--memory", action="store_true",
                        help="also sample every process's resident memory from /proc (0.2 s; "
                             "it costs CPU, so take seconds from a run without it)")  # fmt: skip
    parser.add_argument("--sites-memory", type=float, metavar="GB",
                        help="run the sites in a memory cgroup of GB gigabytes (root and swap "
                             "needed): the coordinator's memory with more sites than the "
                             "machine holds; the sites' seconds then mean little")  # fmt: skip
    parser.add_argument("--keep", type=Path, metavar="DIR",
                        help="work in DIR and keep its logs and histories (default: a "
                             "temporary folder, removed at the end)")  # fmt: skip
    args = parser.parse_args()
    path = os.pathsep.join(filter(None, [str(HERE), os.environ.get("PYTHONPATH")]))
    env = {**os.environ, "FLWR_TELEMETRY_ENABLED": "0", "FLWR_DISABLE_UPDATE_CHECK": "1",
           "PYTHONPATH": path}  # fmt: skip
    with (
        tempfile.TemporaryDirectory(prefix="fedweave-bench-large-") as tmp,
        sites_cgroup(args.sites_memory) as site_command,
    ):
        work = args.keep or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        prepare(work, args.sites, env)
        runs = [(m, d, t) for m in args.modes for d in args.downlink for t in args.transfer]
        for mode, downlink, transfer in runs:
            started = time.perf_counter()
            bulk = ["--bulk-address", f"127.0.0.1:{free_port()}"] if transfer == "bulk" else []
            rounds = run(work, args.sites, args.rounds, mode == "secagg", env,
                         task=f"large_model_task:{args.model}",
                         coordinator_extra=["--downlink", downlink, *bulk],
                         site_command=site_command, memory=args.memory)  # fmt: skip
            mode = f"{mode}, {downlink} down, via {transfer}"
            for row in rounds:
                print(f"{mode} round {row['round']}: {row['seconds']:6.1f} s, slowest site "
                      f"trained {row['training']:5.1f} s, beyond training "
                      f"{row['seconds'] - row['training']:5.1f} s; bytes in "
                      f"{row['bytes_in'] / 1e6:.0f} MB, out {row['bytes_out'] / 1e6:.0f} MB",
                      flush=True)  # fmt: skip
            later = rounds[1:] or rounds
            beyond = statistics.median(r["seconds"] - r["training"] for r in later)
            goals = GOALS.get(args.model)
            goal = (
                f" (goal <= {goals[0 if mode.startswith('plain') else 1]:g} s)" if goals else ""
            )
            if args.memory and rounds:
                peaks, size = rounds[-1]["memory"], model_bytes(args.model)
                print(f"{mode}: peak resident memory: ServerApp "
                      f"{peaks['serverapp'] / 1e9:.2f} GB ({peaks['serverapp'] / size:.1f} x the "
                      f"model's {size / 1e6:.0f} MB, the process's own footprint included; "
                      f"goal <= {MEMORY_GOAL:g} x), coordinator's processes "
                      f"{peaks['coordinator'] / 1e9:.2f} GB, the sites' "
                      f"{peaks['sites'] / 1e9:.2f} GB (one site at most "
                      f"{peaks['site'] / 1e9:.2f} GB), all at once {peaks['all'] / 1e9:.2f} GB",
                      flush=True)  # fmt: skip
            print(f"{mode}: median of rounds 2..{args.rounds}: "
                  f"{statistics.median(r['seconds'] for r in later):.1f} s a round, "
                  f"{beyond:.1f} s beyond training{goal}; "
                  f"{time.perf_counter() - started:.0f} s in all", flush=True)  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
