"""Gossip simulation: N real peer processes, one report in the federated shape.

Peers run on loopback, or one per network namespace (``GossipSimulation.hosts``).

Each peer is a separate ``python -m fedweave.gossip`` process (spawned, never forked: ZeroMQ
contexts are not fork-safe) with its own data file, all sharing the held-out test file. Peers
write JSON lines (``ready``/``round``/``done``/``final``) and per-round model dumps; this
launcher tails them, injects faults (``--kill 0.3@10`` SIGKILLs 30% of the peers once a peer
reaches round 10), starts late joiners, and builds the report: ``rounds[].accuracy`` is the
mean test accuracy of the peers' own models at that round, ``consensus_distance`` the mean L2
distance of their models to their mean, ``network_accuracy`` the accuracy of that mean model
(``fedweave.simulations.gossip_rows``).
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from fedweave.addresses import free_ports
from fedweave.config import RunConfig
from fedweave.errors import UserError
from fedweave.private_files import open_private
from fedweave.simulations.netns import Host

LINGER_SECONDS = 3600.0
HOST_PORT = 7000
"""The port every peer listens on when each has a host (namespace) of its own."""


@dataclass(frozen=True)
class GossipSimulation:
    """One gossip simulation: the run's settings plus what only the launcher does.

    Attributes:
        config: the run's settings (task, split, training, gossip; ``--db none`` records
            nothing). Local training defaults are the same as in every other mode.
        late: ``"COUNT@ROUND"``: hold back COUNT peers and start them once a peer has reached
            ROUND (late joiners; default none).
        secure: give every peer a CURVE key pair and a shared allow-list (default True, as
            ``fedweave peer`` does; ``simulate --insecure`` runs plaintext).
        allow: public key files (``peer.key``) every peer also accepts: a site joining by
            hand, or a benchmark's compromised member (default none).
        timeout_s: give up (and kill every peer) after this long (default: scaled by rounds).
        hosts: run peer ``i`` inside network namespace ``hosts[i]`` (``simulations/netns.py``),
            listening on the wildcard address and advertising the host's own, as one peer per
            machine would (default: every peer on loopback).
    """

    config: RunConfig
    late: str | None = None
    secure: bool = True
    allow: tuple[Path, ...] = ()
    timeout_s: float | None = None
    hosts: list[Host] | None = None

    @property
    def db(self) -> str | None:
        db = self.config.history.db
        return None if db.lower() == "none" else db


def parse_at(spec: str | None, flag: str, fraction: bool) -> tuple[float, int] | None:
    """``"0.3@10"`` → ``(0.3, 10)``; a one-line ``UserError`` naming the flag otherwise."""
    if not spec:
        return None
    amount, _, round_text = spec.partition("@")
    try:
        value, at = float(amount), int(round_text)
    except ValueError:
        value, at = -1.0, -1
    ok = (0 < value <= 1) if fraction else (value >= 1 and value.is_integer())
    if not ok or at < 1:
        form = "FRACTION@ROUND, e.g. 0.3@10" if fraction else "COUNT@ROUND, e.g. 1@10"
        raise UserError(f"bad {flag} '{spec}': use {form}")
    return value, at


class _PeerProc:
    def __init__(self, index: int, argv: list[str], env: dict[str, str], work: Path) -> None:
        self.index, self.argv, self.env, self.work = index, argv, env, work
        self.released = False  # sent the one SIGTERM that ends its linger
        self.results = work / f"peer-{index}.jsonl"
        self.dumps = work / f"models-{index}"
        self.log = work / f"peer-{index}.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.killed = False
        self.rounds: dict[int, dict[str, Any]] = {}
        self.final: dict[str, Any] | None = None
        self.done = False  # its rounds are over (a peer may skip rounds: see schedule.py)
        self._offset = 0

    def start(self) -> None:
        # a reused work dir must not feed the launcher an earlier run's rounds
        self.results.unlink(missing_ok=True)
        shutil.rmtree(self.dumps, ignore_errors=True)
        with open_private(self.log, "wb") as log_file:
            self.proc = subprocess.Popen(
                self.argv,
                env=self.env,
                stdout=log_file,
                stderr=subprocess.STDOUT,
            )

    def read(self) -> None:
        if not self.results.exists():
            return
        with self.results.open("rb") as handle:
            handle.seek(self._offset)
            data = handle.read()
        end = data.rfind(b"\n") + 1
        self._offset += end
        for line in data[:end].splitlines():
            event = json.loads(line)
            if event["event"] == "round":
                self.rounds[event["round"]] = event
            elif event["event"] == "done":
                self.done = True
            elif event["event"] == "final":
                self.final = event

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self, sig: int = signal.SIGKILL) -> None:
        if self.running and self.proc is not None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def tail(self, lines: int = 5) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


def _gpu_count() -> int:
    try:
        import torch

        return torch.cuda.device_count()
    except Exception:
        return 0


def _make_keys(work: Path, clients: int, allow: tuple[Path, ...] = ()) -> list[Path]:
    from fedweave.gossip.keys import new_key_group

    dirs = [work / f"keys-{i}" for i in range(clients)]
    for d in dirs:
        shutil.rmtree(d, ignore_errors=True)  # a reused work dir: fresh keys each run
    new_key_group(dirs)
    for d in dirs:
        for j, extra in enumerate(allow):
            shutil.copyfile(extra, d / "allowed" / f"extra-{j}.key")
    return dirs


def _data_dir(sim: GossipSimulation, work: Path) -> Path:
    """Where the peers' data files and the shared test file are: ``--split-dir`` if given."""
    split_dir = sim.config.simulation.split_dir
    return split_dir.resolve() if split_dir is not None else work / "data"


def _launch_plan(
    sim: GossipSimulation, work: Path, run_id: str | None, on_time: int
) -> list[_PeerProc]:
    from fedweave.gossip.exchange import gossip_encoding
    from fedweave.learning.tasks import load_task
    from fedweave.simulations.split import test_file, write_split

    compress = gossip_encoding(sim.config.federation.compress)  # checked as it was resolved
    data, training, gossip = sim.config.data, sim.config.training, sim.config.gossip
    gpus_per_peer = sim.config.simulation.gpus_per_peer
    task = load_task(data.task)
    sites = write_split(
        task, _data_dir(sim, work), data.clients, data.partition, data.alpha,
        data.shards_per_client, training.seed,
    )
    if sim.hosts is not None and len(sim.hosts) < data.clients:
        raise UserError(f"{len(sim.hosts)} hosts for {data.clients} peers; give one host per peer")
    ports = [HOST_PORT] * data.clients if sim.hosts else free_ports(data.clients)
    listen = "0.0.0.0" if sim.hosts else "127.0.0.1"
    dial = [h.address for h in sim.hosts] if sim.hosts else [listen] * data.clients
    keys = _make_keys(work, data.clients, sim.allow) if sim.secure else None
    gpus = _gpu_count() if gpus_per_peer > 0 else 0
    if gpus_per_peer > 0 and gpus == 0:
        raise UserError("--gpus-per-peer needs a visible CUDA GPU; drop the flag to train on CPU")
    peers = []
    for i, site in enumerate(sites):
        argv = [
            sys.executable,
            "-m",
            "fedweave.gossip",
            "peer",
            "--listen",
            f"tcp://{listen}:{ports[i]}",
            "--advertise",
            f"tcp://{dial[i]}:{ports[i]}",
            "--task",
            data.task,
            "--data",
            str(site),
            "--test-data",
            str(test_file(_data_dir(sim, work))),
            "--rounds",
            str(training.rounds),
            "--fanout",
            str(gossip.fanout),
            "--mix",
            gossip.mix,
            "--local-epochs",
            str(training.local_epochs),
            "--optimizer",
            training.optimizer,
            "--lr",
            str(training.lr),
            "--weight-decay",
            str(training.weight_decay),
            *(
                ["--clip-grad-norm", str(training.clip_grad_norm)]
                if training.clip_grad_norm
                else []
            ),
            "--batch-size",
            str(training.batch_size),
            "--seed",
            str(training.seed),
            "--exchange-timeout",
            str(gossip.exchange_timeout),
            "--connect-timeout",
            "120",
            # finished peers keep answering until every peer is done (the launcher then
            # stops them), so slower peers never mix with an emptying network
            "--linger",
            str(LINGER_SECONDS),
            "--wait-for-peers",
            str(on_time),
            "--threads",
            "1",
            "--log-level",
            "warning",
            "--results",
            str(work / f"peer-{i}.jsonl"),
            "--dump-models",
            str(work / f"models-{i}"),
        ]
        if training.initial_model is not None:
            argv += ["--initial-model", str(training.initial_model)]
        if training.peft != "none":
            argv += ["--peft", training.peft]
            if training.lora_rank is not None:
                argv += ["--lora-rank", str(training.lora_rank)]
            if training.lora_alpha is not None:
                argv += ["--lora-alpha", str(training.lora_alpha)]
            if training.lora_targets is not None:
                argv += ["--lora-targets", training.lora_targets]
        if gossip.group_exchange:
            argv.append("--group-exchange")
        if compress != "raw":
            argv += ["--compress", compress]
        if gossip.round_interval is not None:  # default: the peers agree on their slots
            argv += ["--round-interval", str(gossip.round_interval)]
        if i > 0:
            argv += ["--seeds", f"tcp://{dial[0]}:{ports[0]}"]
        late = parse_at(sim.late, "--late", fraction=False)
        if late and i >= on_time:  # --rounds counts the rounds a peer trains, late or not
            at = argv.index("--rounds") + 1
            argv[at] = str(max(1, training.rounds - int(late[1])))
        if keys is not None:
            argv += ["--keys", str(keys[i])]
        else:
            argv.append("--insecure")
        if sim.db is not None and run_id is not None:
            argv += ["--db", sim.db, "--run-id", run_id]
            # each peer's model checkpoints: <checkpoint-dir>/<run>/<peer id>/round-NNNNN.npz
            argv += ["--checkpoint-dir", str(sim.config.history.checkpoint_dir)]
        else:
            argv += ["--db", "none"]
        env = dict(os.environ, OMP_NUM_THREADS="1")
        if gpus:
            env["CUDA_VISIBLE_DEVICES"] = str(int(i * gpus_per_peer) % gpus)
            argv += ["--device", "cuda"]
        else:
            argv += ["--device", "cpu"]
        if sim.hosts:
            argv = sim.hosts[i].command(argv)
        peers.append(_PeerProc(i, argv, env, work))
    return peers


def run_gossip_simulation(
    sim: GossipSimulation,
    work_dir: Path | None = None,
    on_round: Callable[[int], None] | None = None,
) -> dict[str, Any]:
    """Run the peers to completion and return the report (``fedweave.simulations.report`` shape).

    Args:
        work_dir: where split, keys, logs and dumps go (default: a temporary directory).
        on_round: called with the highest round any peer has finished, as it grows.
    """
    from fedweave.config.commands import check_settings
    from fedweave.config.resume import stored_run_config
    from fedweave.learning.adapters import run_adapter
    from fedweave.learning.initial_model import pin_initial_model
    from fedweave.learning.personal import refuse_in_gossip

    refuse_in_gossip(sim.config.data.task)
    stored_config = stored_run_config(sim.config, "simulate")
    pin_initial_model(sim.config, stored_config, None)  # refused here before anything starts
    adapter = run_adapter(sim.config)
    if adapter is not None:
        stored_config["adapter"] = adapter
    data, training, gossip = sim.config.data, sim.config.training, sim.config.gossip
    clients, rounds = data.clients, training.rounds
    check_settings(sim.config.replace(mode="gossip"), "simulate")  # a caller in code too
    kill = parse_at(sim.config.simulation.kill, "--kill", fraction=True)
    late = parse_at(sim.late, "--late", fraction=False)
    if late and late[0] >= clients:
        raise UserError("--late must leave at least one peer starting on time")
    with tempfile.TemporaryDirectory(prefix="fedweave-gossip-") as tmp:
        work = Path(work_dir) if work_dir is not None else Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        store, run_id = None, None
        if sim.db is not None:
            from fedweave.history import open_store

            store = open_store(sim.db)
            run_id = store.start_run(
                mode="gossip", task=data.task, config=stored_config, seed=training.seed
            )
        on_time = clients - (int(late[0]) if late else 0)
        peers = _launch_plan(sim, work, run_id, on_time)
        rng = random.Random(training.seed)
        held = set(range(clients - int(late[0]), clients)) if late else set()
        victims: set[int] = set()
        if kill:
            candidates = [p.index for p in peers if p.index not in held]
            victims = set(rng.sample(candidates, max(1, round(kill[0] * clients))))
        limit = sim.timeout_s or 60 + rounds * (2 + gossip.fanout * gossip.exchange_timeout)
        started = time.monotonic()
        status, reason = "completed", None
        try:
            for p in peers:
                if p.index not in held:
                    p.start()
            top, killed_at = 0, None
            while True:
                for p in peers:
                    p.read()
                done = max((max(p.rounds, default=0) for p in peers), default=0)
                if done > top and on_round is not None:
                    on_round(done)
                top = max(top, done)
                if kill and killed_at is None and top >= kill[1]:
                    for p in peers:
                        if p.index in victims:
                            p.stop(signal.SIGKILL)
                            p.killed = True
                    killed_at = top
                if not held and all(p.killed or not p.running or p.done for p in peers):
                    for p in peers:
                        if p.running and not p.killed and not p.released:
                            p.proc.send_signal(signal.SIGTERM)  # done: end their linger
                            p.released = True
                if late and held and top >= late[1]:
                    for p in peers:
                        if p.index in held:
                            p.start()
                    held = set()
                if not held and not any(p.running for p in peers):
                    break
                if time.monotonic() - started > limit:
                    raise UserError(
                        f"gossip simulation did not finish within {limit:.0f}s; see peer logs in "
                        f"{work} (pass a work dir to keep them)"
                    )
                time.sleep(0.2)
            for p in peers:
                p.read()
            # exit 3: completed-alone (its rounds ran, mostly without partners: reported); a
            # finished peer that left on its own (every other peer was done) may still get
            # the launcher's SIGTERM while it exits, after its handler is gone
            crashed = [
                p
                for p in peers
                if not p.killed
                and p.proc
                and p.proc.returncode not in (0, 3)
                and not (p.released and p.done and p.proc.returncode == -signal.SIGTERM)
            ]
            if crashed:
                first = crashed[0]
                code = first.proc.returncode if first.proc else "?"
                raise UserError(f"peer {first.index} exited with code {code}: {first.tail(1)}")
        except BaseException as exc:
            status, reason = "failed", str(exc)
            raise
        finally:
            for p in peers:
                p.stop(signal.SIGKILL)
            if store is not None and run_id is not None:
                store.finish_run(run_id, status, reason=reason)
        from fedweave.learning.adapters import run_task
        from fedweave.simulations.gossip_rows import MeanModelScorer, round_rows
        from fedweave.simulations.split import test_file

        rows = round_rows(
            {p.index: p.rounds for p in peers},
            {p.index: p.dumps for p in peers},
            rounds,
            MeanModelScorer(run_task(sim.config), test_file(_data_dir(sim, work))),
        )
        survivors = [p for p in peers if not p.killed]
        finals = [p.rounds[max(p.rounds)] for p in survivors if p.rounds]
        final_accs = [e["accuracy"] for e in finals if e.get("accuracy") is not None]
        return {
            "mode": "gossip",
            "task": data.task,
            "clients": clients,
            "rounds": rows,
            "final_accuracy": float(np.mean(final_accs)) if final_accs else None,
            "config": stored_config.get("settings", {}),
            "run_id": run_id,
            "wall_seconds": time.monotonic() - started,
            "killed": sorted(p.index for p in peers if p.killed),
            "killed_at_round": killed_at,
            "peers": [
                {
                    "index": p.index,
                    "killed": p.killed,
                    "rounds": len(p.rounds),
                    "last_round": max(p.rounds, default=0),
                    "done": p.done,
                    "final_accuracy": p.rounds[max(p.rounds)].get("accuracy") if p.rounds else None,
                    "drops": (p.final or {}).get("drops", {}),
                }
                for p in peers
            ],
        }


def run_gossip_and_report(sim: GossipSimulation) -> dict[str, Any]:
    """``fedweave simulate --mode gossip``: run with a progress bar, print the table, write
    the report to ``--out``."""
    from rich.console import Console

    from fedweave.simulations.report import rounds_table, write_report

    console = Console(stderr=True)
    task, clients = sim.config.data.task, sim.config.data.clients
    rounds = sim.config.training.rounds
    out = sim.config.simulation.out
    with console.status(f"gossip {task}: starting {clients} peers") as status:
        report = run_gossip_simulation(
            sim,
            on_round=lambda r: status.update(f"gossip {task}: round {r}/{rounds}")
        )
    write_report(out, report)
    table_rows = [
        {
            k: row.get(k)
            for k in (
                "round",
                "accuracy",
                "loss",
                "seconds",
                "consensus_distance",
                "network_accuracy",
            )
        }
        for row in report["rounds"]
    ]
    console.print(rounds_table(table_rows, title=f"gossip {task}: {clients} peers"))
    if report["killed"]:
        console.print(
            f"killed peers {report['killed']} (--kill {sim.config.simulation.kill}) once a peer "
            "had finished "
            f"round {report['killed_at_round']}"
        )
    final = report["final_accuracy"]
    console.print(
        f"final accuracy {final:.4f}; report written to {out}"
        if final is not None
        else f"report written to {out}"
    )
    return report
