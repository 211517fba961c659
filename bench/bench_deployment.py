"""Deployed seconds per round, 3 sites on ``digits``, loopback, TLS, plain and with SecAgg+:
a minimal stock Flower app against fedweave's coordinator and sites, on the same machine.

- ``stock``: ``bench/stock_flower_app``, written only with Flower's public API (FedAvg,
  ``SecAggPlusWorkflow`` / ``secaggplus_mod``, a NumPyClient) and the same model, split and
  local training as fedweave's ``digits`` task. It runs exactly as Flower documents a
  deployment: ``flower-superlink`` with TLS, one ``flower-supernode`` per site, and
  ``flwr run``; every Flower setting is the default, except that runtime dependency
  installation (``uv sync``) is off, as it is for fedweave. Its ServerApp writes the wall
  clock after each round's central evaluation; a round is the time between two of them.
- ``fedweave``: ``fedweave coordinator`` and ``fedweave client`` exactly as docs/deploy.md
  sets them up (TLS, registered site keys, ``fedweave data split``), with federated
  evaluation off (``--evaluate-every 0``: the stock app evaluates centrally only, and so does
  fedweave then; ``bench_federated_evaluation.py`` measures what it adds); a round's seconds
  are what the coordinator records in the history.
- ``fedweave-unpatched`` (not run by default): fedweave with ``FEDWEAVE_STOCK_FLOWER=1``,
  its speed-ups off: the ServerApp's stock 3 s polls and 1 s first backoff, and a
  ``flwr-clientapp`` process per message instead of the long-lived worker. The correctness
  patches stay on whatever the switch says (``fedweave.flower_patches``), so the sites'
  SuperNodes keep ``supernode_waits``' 0.2 s sleeps and short first backoff, and the
  SuperLink ``node_restarts``; until 2026-11-25 the switch dropped those too, which is how the
  row of docs/benchmarks.md dated 2026-11-24 was measured.

- ``fedweave-bulk`` (not run by default): fedweave with ``--bulk-address``, the model and
  the updates moving beside Flower's messages (docs/deploy.md).

``--model TASK`` or ``WIDE`` runs every system on a wider MLP of the same task (17.1M or
67.7M parameters, ``bench/large_model_task.py``; the stock app gets the same width): the
anchor of issue 36's large-model figures.

Each row's figure is the median of rounds 2..R (round 1 also pays for the sites' first
ClientApp start-up). Every run starts its own SuperLink and sites.

    python bench/bench_deployment.py [--rounds 5] [--sites 3] [--systems stock,fedweave]
        [--model digits|TASK|WIDE]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from fedweave.addresses import free_port
from fedweave.flower_patches import STOCK_FLOWER_ENV
from fedweave.processes import stop_process_group, tied_to_us


def fedweave(*args: str) -> list[str]:
    return [sys.executable, "-m", "fedweave.cli", *args]


def prepare(work: Path, sites: int, env: dict[str, str], task: str = "digits") -> None:
    """Certificates, registered site keys and a split of ``task``, with the commands a user
    runs."""
    steps = [
        ("certs", "init", "--out", "tls", "--host", "localhost"),
        ("data", "split", "--task", task, "--clients", str(sites), "--partition", "iid",
         "--seed", "0", "--out", "split"),
    ]  # fmt: skip
    for i in range(sites):
        steps += [
            ("sites", "new-key", "--out", f"site{i}.key"),
            ("sites", "add-key", "tls", f"site{i}.pub"),
        ]
    for step in steps:
        subprocess.run(fedweave(*step), cwd=work, env=env, check=True, capture_output=True)


Env = dict[str, str]
STOCK_APP = Path(__file__).resolve().parent / "stock_flower_app"


def wait_for_port(port: int, proc: subprocess.Popen, timeout: float = 60.0) -> None:
    """Until ``127.0.0.1:port`` accepts a connection (``proc`` is what should listen there)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"{proc.args[0]} exited with {proc.returncode} before listening")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.5):
            return
        time.sleep(0.2)
    raise SystemExit(f"nothing listened on 127.0.0.1:{port} within {timeout:.0f} s")


def stock_run(
    work: Path, sites: int, rounds: int, secure: bool, env: Env, model: str = "digits"
) -> list[float]:
    """Seconds of each round of the stock Flower app, deployed the way Flower documents it."""
    port, tag = free_port(), "secure" if secure else "plain"
    home = work / f"stock-{tag}"
    home.mkdir()
    tls = (work / "tls").resolve()
    superlink = [
        "flower-superlink", "--port", str(port), "--disable-runtime-dependency-installation",
        "--ssl-ca-certfile", str(tls / "ca.pem"), "--ssl-certfile", str(tls / "server.pem"),
        "--ssl-keyfile", str(tls / "server.key"),
    ]  # fmt: skip
    (home / "config.toml").write_text(
        f'[superlink]\ndefault = "bench"\n\n[superlink.bench]\naddress = "localhost:{port}"\n'
        f'root-certificates = "{tls / "ca.pem"}"\n'
    )
    timings = home / "round-ends.txt"
    procs = []
    try:
        link_env = dict(env, FLWR_HOME=str(home / "link"))
        procs.append(start(superlink, home / "superlink.log", link_env))
        wait_for_port(port, procs[0])
        for i in range(sites):
            data = (work / "split" / f"site-{i}.npz").resolve()
            supernode = [
                "flower-supernode", "--superlink", f"localhost:{port}",
                "--root-certificates", str(tls / "ca.pem"), "--port", str(free_port()),
                "--node-config", f"data='{data}'",
            ]  # fmt: skip
            site_env = dict(env, FLWR_HOME=str(home / f"site{i}"))
            procs.append(start(supernode, home / f"site{i}.log", site_env))
        run_config = (
            f"num-server-rounds={rounds} sites={sites} secure-agg={'true' if secure else 'false'} "
            f"hidden={HIDDEN[model]} "
            f"test-data='{(work / 'split' / 'test.npz').resolve()}' timings='{timings}'"
        )
        flwr_run = ["flwr", "run", str(STOCK_APP), "bench", "--stream", "--run-config", run_config]
        with (home / "flwr-run.log").open("wb") as log:
            subprocess.run(
                flwr_run, env=dict(env, FLWR_HOME=str(home)), stdout=log, stderr=log,
                timeout=120 + rounds * 240, check=True,
            )  # fmt: skip
    finally:
        for proc in reversed(procs):
            stop_process_group(proc, grace=10)
    ends = [float(line) for line in timings.read_text().split()]
    if len(ends) != rounds + 1:
        raise SystemExit(f"the stock app recorded {len(ends) - 1} of {rounds} rounds; see {home}")
    return [after - before for before, after in zip(ends, ends[1:])]


def start(command: list[str], log_path: Path, env: dict[str, str]) -> subprocess.Popen:
    with log_path.open("wb") as log:
        return subprocess.Popen(command, env=env, stdout=log, stderr=log, **tied_to_us())


def fedweave_run(
    work: Path,
    sites: int,
    rounds: int,
    secure: bool,
    env: Env,
    model: str = "digits",
    extra: tuple[str, ...] = ("--evaluate-every", "0"),
) -> list[float]:
    """Seconds of each round of one deployed fedweave run, as its history records them
    (``model``: ``digits``, or a width of ``bench/large_model_task.py``; ``extra``: more
    coordinator flags; by default federated evaluation is off, as the stock app evaluates
    centrally only)."""
    from fedweave.history import open_store

    port, db = free_port(), f"sqlite:///{work / f'run-{free_port()}.db'}"
    task = "digits" if model == "digits" else f"large_model_task:{model}"
    coordinator = [
        "coordinator", "--address", f"127.0.0.1:{port}", "--task", task,
        "--rounds", str(rounds), "--min-clients", str(sites), "--db", db, "--tls-dir", "tls",
        "--test-data", "split/test.npz", "--once",
        "--state-dir", f"state-{port}", *([] if secure else ["--no-secure-agg"]), *extra,
    ]  # fmt: skip
    procs = []
    try:
        with (work / f"coordinator-{port}.log").open("wb") as log:
            procs.append(subprocess.Popen(
                fedweave(*coordinator), cwd=work, env=env, stdout=log, stderr=log,
                **tied_to_us(),
            ))  # fmt: skip
        for i in range(sites):
            site = [
                "client", "--coordinator", f"127.0.0.1:{port}", "--task", task,
                "--data", f"split/site-{i}.npz", "--ca-cert", "tls/ca.pem",
                "--site-key", f"site{i}.key", "--log-file", f"site{i}-{port}.log",
            ]  # fmt: skip
            with (work / f"site{i}-{port}.out").open("wb") as log:
                procs.append(subprocess.Popen(
                    fedweave(*site), cwd=work, env=env, stdout=log, stderr=log,
                    **tied_to_us(),
                ))  # fmt: skip
        code = procs[0].wait(timeout=60 + rounds * 240)
        if code != 0:
            raise SystemExit(f"the coordinator failed (exit {code}); see {work}")
    finally:
        for proc in procs:
            stop_process_group(proc, grace=10)
    with open_store(db) as store:
        run = store.list_runs()[0]
        return [float(r["extra"]["seconds"]) for r in store.rounds(run.run_id)]


def fedweave_bulk_run(
    work: Path, sites: int, rounds: int, secure: bool, env: Env, model: str = "digits"
) -> list[float]:
    """``fedweave_run`` with ``--bulk-address``: tensors beside Flower's messages."""
    extra = ("--evaluate-every", "0", "--bulk-address", f"127.0.0.1:{free_port()}")
    return fedweave_run(work, sites, rounds, secure, env, model, extra)


SYSTEMS = {
    "stock": ("stock Flower app", stock_run, {}),
    "fedweave": ("fedweave", fedweave_run, {}),
    "fedweave-bulk": ("fedweave, --bulk-address", fedweave_bulk_run, {}),
    "fedweave-unpatched": ("fedweave, speed-ups off", fedweave_run, {STOCK_FLOWER_ENV: "1"}),
}
HIDDEN = {"digits": 64, "TASK": 4096, "WIDE": 8192}
"""``--model`` → the MLP's hidden width (``bench/large_model_task.py``)."""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5, help="rounds per run (default 5)")
    parser.add_argument("--sites", type=int, default=3, help="sites (default 3)")
    parser.add_argument(
        "--systems", default="stock,fedweave",
        help=f"comma-separated, from {', '.join(SYSTEMS)} (default stock,fedweave)",
    )  # fmt: skip
    parser.add_argument(
        "--model", choices=list(HIDDEN), default="digits",
        help="digits' 64-64-64-10 MLP (default), or TASK / WIDE: 17.1M / 67.7M parameters",
    )  # fmt: skip
    args = parser.parse_args()
    systems = [name.strip() for name in args.systems.split(",") if name.strip()]
    unknown = [name for name in systems if name not in SYSTEMS]
    if unknown or not systems or args.rounds < 2 or args.sites < 3:
        parser.error(f"--systems takes {', '.join(SYSTEMS)}; --rounds >= 2; --sites >= 3")
    env = dict(os.environ, FLWR_TELEMETRY_ENABLED="0", FLWR_DISABLE_UPDATE_CHECK="1")
    env["PATH"] = str(Path(sys.executable).parent) + os.pathsep + env.get("PATH", "")
    here = str(Path(__file__).resolve().parent)  # large_model_task, for every process
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [here, env.get("PYTHONPATH")]))
    with tempfile.TemporaryDirectory(prefix="fedweave-bench-deploy-") as tmp:
        work = Path(tmp)
        prepare(work, args.sites, env)
        rows = []
        for name in systems:
            label, run, extra_env = SYSTEMS[name]
            for secure in (False, True):
                started = time.perf_counter()
                seconds = run(
                    work, args.sites, args.rounds, secure, dict(env, **extra_env), args.model
                )
                wall = time.perf_counter() - started
                rows.append((label, "SecAgg+" if secure else "plain", seconds, wall))
                print(f"  {label}, {rows[-1][1]}: done in {wall:.0f} s", file=sys.stderr)
    print(
        f"deployed rounds: {args.sites} sites, digits ({args.model} MLP), loopback, TLS "
        f"(fedweave also with "
        f"registered site keys); {args.rounds} rounds a run"
    )
    print(f"{'system':<28}{'mode':<9}{'median s (rounds 2..)':>22}{'round 1 s':>11}  per round")
    for label, mode, seconds, _wall in rows:
        per = " ".join(f"{s:.1f}" for s in seconds)
        steady = statistics.median(seconds[1:])
        print(f"{label:<28}{mode:<9}{steady:>22.2f}{seconds[0]:>11.1f}  {per}")


if __name__ == "__main__":
    main()
