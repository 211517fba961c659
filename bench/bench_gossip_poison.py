"""Benchmark: the review's poisoning attack against default gossip peers, measured.

Three default peers (CURVE, the default mixing, ``clipped``; started by the simulation launcher,
``fedweave.simulations.gossip_simulation``, exactly as ``fedweave simulate --mode gossip``
does) learn ``digits``. An outsider written from ``gossip/PROTOCOL.md`` (raw pyzmq +
``wire``) attacks once the peers reach ``--attack-round``, with the review's message: an offer
of finite weights of 1e30 and ``num_examples`` = 2^53.

Variants:
  none              no attacker (the reference)
  outsider          one offer to each peer from a key not on the allow-list
  outsider-4-ids    the same under four made-up sender ids
  member            the outsider's key IS on every allow-list (a compromised site): one offer
                    to each peer, so the distance bound itself is what stops it
  member-4-ids      a member's key under four made-up ids
  member-flood      a member offering to every peer every 2 s until the run ends
  insecure-4-ids    ``--insecure`` peers (plaintext) and four made-up ids, each saying hello
                    first: the bounds without CURVE
  insecure-reset    the review's replay (issue 39): ``--insecure`` peers; every 2 s, three
                    made-up ids each offer the 1e30 model (refused: three refusals in a row
                    once restarted a peer's distance history), then a fourth offers a
                    model at distance ``RESET_DISTANCE`` from zero (inside the outer limit of
                    a restarted history) with an honest-looking count
  member-drift      the review's drift (issue 39): a member offers every peer, about once a
                    round (``DRIFT_EVERY_S``), the model that peer last sent it moved a
                    step along one fixed direction, claiming 10^6 examples; the step
                    doubles after each accepted offer and halves after each refusal, so it
                    rides just inside the distance bound, and every acceptance adds to the
                    same pull
  member-drift-flood  the same, each offer sent ``FLOOD_BURST`` times at once

Prints per variant the final accuracy (mean over the peers' own models), its difference to
the unattacked run, the models the attacker got back (``ok`` replies) and the refusals the
peers counted. Goal: every attacked run within 2 points of the unattacked one, and no model
handed to the outsider. Gossip is not deterministic (message timing): ``--repeats`` runs the
reference more than once to show the noise.

    python bench/bench_gossip_poison.py [--rounds 20] [--variants none,member,...]
        [--mix pairwise|clipped|trimmed] [--task digits|mnist5k]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import zmq
import zmq.auth

from fedweave.config import RunConfig
from fedweave.config.task_defaults import TASK_DEFAULTED, apply_task_defaults
from fedweave.gossip import wire
from fedweave.gossip.keys import load_keyring, new_keys
from fedweave.learning.tasks import load_task
from fedweave.learning.weights import get_named_weights
from fedweave.simulations.gossip_simulation import GossipSimulation, run_gossip_simulation

VARIANTS = (
    "none", "outsider", "outsider-4-ids", "member", "member-4-ids", "member-flood",
    "insecure-4-ids", "insecure-reset", "member-drift", "member-drift-flood",
)  # fmt: skip
POISON = 1e30
CLAIMED = 2**53
RESET_DISTANCE = 948.0
"""The review's large model: its distance from zero (the peers' models are a few units long)."""
DRIFT_EVERY_S = 0.3
"""How often the drifting member offers to each peer: about a round of digits here."""
FLOOD_BURST = 8
"""Offers ``member-drift-flood`` sends each peer at once, without waiting for replies: they
queue in the peer's inbox while it trains and are answered one after the other."""


class Outsider(threading.Thread):
    """The attacker: waits for the peers' addresses and round, then sends its offers."""

    def __init__(
        self, work: Path, peers: int, variant: str, keys: Path, attack_round: int,
        task: str = "digits", seed: int = 0,
    ) -> None:  # fmt: skip
        super().__init__(daemon=True)
        self.work, self.count, self.variant = work, peers, variant
        self.keys, self.attack_round = keys, attack_round
        self.stop = threading.Event()
        self.sent = 0
        self.statuses: dict[str, int] = {}
        self.models_received = 0
        self.error: str | None = None
        import torch

        torch.manual_seed(seed)  # the peers' common start (gossip/learner.py)
        self.start_model = get_named_weights(load_task(task).build_model())
        rng = np.random.default_rng(1000 + seed)
        direction = {n: rng.normal(size=a.shape) for n, a in self.start_model.items()}
        length = np.sqrt(sum(float((d * d).sum()) for d in direction.values()))
        self.direction = {n: d / length for n, d in direction.items()}
        specs = wire.tensor_specs(self.start_model)
        self.poison = {n: np.full(s, POISON, dtype=np.dtype(d)) for n, d, s in specs}
        size = sum(int(np.prod(s)) for _, _, s in specs)
        level = RESET_DISTANCE / np.sqrt(size)
        self.large = {n: np.full(s, level, dtype=np.dtype(d)) for n, d, s in specs}

    def _events(self, i: int) -> list[dict[str, Any]]:
        path = self.work / f"peer-{i}.jsonl"
        if not path.exists():
            return []
        return [json.loads(x) for x in path.read_text().splitlines() if x.endswith("}")]

    def _targets(self) -> list[tuple[str, Path]] | None:
        addrs, top = [], 0
        for i in range(self.count):
            events = self._events(i)
            ready = [e for e in events if e["event"] == "ready"]
            if not ready:
                return None
            addrs.append((ready[0]["addr"], self.work / f"keys-{i}" / "peer.key"))
            top = max([top] + [e["round"] for e in events if e["event"] == "round"])
        return addrs if top >= self.attack_round else None

    def run(self) -> None:
        try:
            self._attack()
        except Exception as exc:  # a bench thread: report, never hang the run
            self.error = f"{type(exc).__name__}: {exc}"

    def _attack(self) -> None:
        targets = None
        while targets is None and not self.stop.is_set():
            targets = self._targets()
            time.sleep(0.1)
        if targets is None:
            return
        ctx = zmq.Context()
        me = load_keyring(self.keys).identity
        plaintext = self.variant.startswith("insecure")
        ids = [me.peer_id]
        if "4-ids" in self.variant or self.variant == "insecure-reset":
            ids = ["fake-a", "fake-b", "fake-c", "fake-d"]
        socks = []
        for addr, server_key in targets:
            sock = ctx.socket(zmq.DEALER)
            sock.setsockopt(zmq.LINGER, 0)
            if not plaintext:
                sock.curve_secretkey, sock.curve_publickey = me.secret_key, me.public_key
                sock.curve_serverkey = zmq.auth.load_certificate(str(server_key))[0]
            sock.connect(addr)
            socks.append(sock)
        if self.variant.startswith("member-drift"):
            burst = FLOOD_BURST if self.variant.endswith("flood") else 1
            self._drift(socks, me.peer_id, burst)
        rounds = 0
        while self.variant == "insecure-reset" and not self.stop.is_set():
            for sock in socks:
                for sender in ids:
                    large = sender == ids[-1]
                    sock.send_multipart(wire.encode(wire.Message(wire.HELLO, sender, "")))
                    self._offer_until_heard(sock, wire.Message(
                        wire.OFFER, sender, "", 1, 1000 + self.sent,
                        num_examples=500 if large else CLAIMED,
                        tensors=self.large if large else self.poison,
                    ))  # fmt: skip
            self.stop.wait(2.0)
        while self.variant != "insecure-reset" and not self.stop.is_set():
            for sock in socks:
                for sender in ids:
                    if plaintext:  # without CURVE a hello first makes a member of anyone
                        sock.send_multipart(wire.encode(wire.Message(wire.HELLO, sender, "")))
                    offer = wire.Message(
                        wire.OFFER, sender, "", 1, 1000 + self.sent, num_examples=CLAIMED,
                        tensors=self.poison,
                    )  # fmt: skip
                    sock.send_multipart(wire.encode(offer), copy=False)
                    self.sent += 1
            deadline = time.monotonic() + 2.0
            while time.monotonic() < deadline and not self.stop.is_set():
                for sock in socks:
                    while sock.poll(0):
                        self._answer(sock.recv_multipart())
                time.sleep(0.02)
            rounds += 1
            if self.variant != "member-flood":
                break
        for sock in socks:
            sock.close(0)
        ctx.term()

    def _drift(self, socks: list[zmq.Socket], sender: str, burst: int) -> None:
        """Every ``DRIFT_EVERY_S`` until the run ends: offer each peer its own last model
        (from its last reply) plus ``step`` along ``direction``; double the step on
        acceptance, halve it on a refusal. Each accepted offer pulls the peer the same way.
        With ``burst`` > 1 the offer goes out that many times at once (distinct exchange
        ids), and every copy mixed pulls the peer again."""
        bases = [dict(self.start_model) for _ in socks]
        steps = [0.5 for _ in socks]
        self.accepted_offers = 0
        while not self.stop.is_set():
            for i, sock in enumerate(socks):
                model = {
                    n: (bases[i][n] + steps[i] * self.direction[n]).astype(bases[i][n].dtype)
                    for n in bases[i]
                }
                offer = wire.Message(
                    wire.OFFER, sender, "", 1, 1000 + self.sent, num_examples=10**6,
                    tensors=model,
                )  # fmt: skip
                if burst == 1:
                    replies = [self._offer_until_heard(sock, offer)]
                else:
                    replies = self._offer_burst(sock, offer, burst)
                oks = [r for r in replies if r is not None and r.status == "ok" and r.tensors]
                if oks:
                    bases[i] = {n: np.array(a) for n, a in oks[-1].tensors.items()}
                    steps[i] *= 2.0
                    self.accepted_offers += len(oks)
                elif any(r is not None and r.status == "refused" for r in replies):
                    steps[i] *= 0.5
            self.stop.wait(DRIFT_EVERY_S)

    def _offer_burst(
        self, sock: zmq.Socket, offer: wire.Message, burst: int
    ) -> list[wire.Message | None]:
        """Send ``burst`` copies of ``offer`` (distinct exchange ids) back to back, then
        collect their replies for at most 2 s."""
        for _ in range(burst):
            offer.xid = 1000 + self.sent
            sock.send_multipart(wire.encode(offer), copy=False)
            self.sent += 1
        replies: list[wire.Message | None] = []
        deadline = time.monotonic() + 2.0
        while len(replies) < burst and time.monotonic() < deadline and not self.stop.is_set():
            if sock.poll(20):
                replies.append(self._reply(sock.recv_multipart()))
        return replies

    def _offer_until_heard(self, sock: zmq.Socket, offer: wire.Message) -> wire.Message | None:
        """Send ``offer`` until the peer checks it: a ``busy`` answer (the peer is in an
        exchange) is sent again 0.1 s later, at most 30 times; 2 s without a reply ends it."""
        reply = None
        for _ in range(30):
            sock.send_multipart(wire.encode(offer), copy=False)
            self.sent += 1
            deadline = time.monotonic() + 2.0
            reply = None
            while reply is None and time.monotonic() < deadline and not self.stop.is_set():
                if sock.poll(20):
                    reply = self._reply(sock.recv_multipart())
            if reply is None or reply.status != "busy":
                return reply
            self.stop.wait(0.1)
        return reply

    def _answer(self, frames: list[bytes]) -> str | None:
        msg = self._reply(frames)
        return None if msg is None else msg.status

    def _reply(self, frames: list[bytes]) -> wire.Message | None:
        msg = wire.decode(frames, check_finite=False)
        if msg.type != wire.REPLY:
            return None
        self.statuses[msg.status] = self.statuses.get(msg.status, 0) + 1
        self.models_received += bool(msg.tensors)
        return msg


def run_variant(
    variant: str, rounds: int, seed: int, attack_round: int, mix: str = "clipped",
    task: str = "digits",
) -> dict[str, Any]:  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="bench-poison-") as tmp:
        work = Path(tmp)
        outsider_keys = work / "outsider"
        new_keys(outsider_keys)
        member = variant.startswith("member")
        config = RunConfig.of(
            task=task, clients=3, rounds=rounds, seed=seed, partition="iid", db="none", mix=mix
        )
        config = apply_task_defaults(config, set(), {"task", *TASK_DEFAULTED})
        sim = GossipSimulation(
            config,
            secure=not variant.startswith("insecure"),
            allow=(outsider_keys / "peer.key",) if member else (),
            timeout_s=600,
        )
        attacker = None
        if variant != "none":
            attacker = Outsider(
                work / "run", 3, variant, outsider_keys, attack_round, task, seed
            )
            attacker.start()
        started = time.monotonic()
        try:
            report = run_gossip_simulation(sim, work_dir=work / "run")
        finally:
            if attacker is not None:
                attacker.stop.set()
                attacker.join(timeout=10)
        drops: dict[str, int] = {}
        for p in report["peers"]:
            for reason, n in p["drops"].items():
                drops[reason] = drops.get(reason, 0) + n
        accuracies = [r["accuracy"] for r in report["rounds"]]
        return {
            "variant": variant,
            "final": report["final_accuracy"],
            "worst_after_attack": min(accuracies[attack_round:], default=float("nan")),
            "seconds": time.monotonic() - started,
            "sent": attacker.sent if attacker else 0,
            "answers": attacker.statuses if attacker else {},
            "models_to_attacker": attacker.models_received if attacker else 0,
            "final_per_peer": [p["final_accuracy"] for p in report["peers"]],
            "attacker_error": attacker.error if attacker else None,
            "drops": drops,
        }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--attack-round", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=2, help="runs of the reference")
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--mix", default="clipped", help="the peers' --mix (default clipped)")
    parser.add_argument("--task", default="digits", help="digits or mnist5k (default digits)")
    args = parser.parse_args()
    variants = [v for v in args.variants.split(",") if v]
    unknown = set(variants) - set(VARIANTS)
    if unknown:
        raise SystemExit(f"unknown variants {sorted(unknown)}; pick from {', '.join(VARIANTS)}")
    print(f"3 peers (CURVE, --mix {args.mix}) on {args.task}, {args.rounds} rounds, seed "
          f"{args.seed}; attack once a peer reaches round {args.attack_round}")  # fmt: skip
    common = (args.rounds, args.seed, args.attack_round, args.mix, args.task)
    refs = [run_variant("none", *common) for _ in range(max(1, args.repeats))]
    reference = float(np.mean([r["final"] for r in refs]))
    results = refs + [
        run_variant(v, *common) for v in variants if v != "none"
    ]
    header = (f"{'variant':<16} {'final acc':>9} {'vs none':>8} {'worst':>6} {'sent':>5} "
              f"{'models to attacker':>18}  answers / refusals counted by the peers")  # fmt: skip
    print(header)
    for r in results:
        diff = 100 * (r["final"] - reference)
        print(
            f"{r['variant']:<16} {r['final']:>9.3f} {diff:>+7.1f}p {r['worst_after_attack']:>6.3f} "
            f"{r['sent']:>5} {r['models_to_attacker']:>18}  {r['answers']} / {r['drops']}"
            + f"; each peer {', '.join(f'{a:.3f}' for a in r['final_per_peer'])}"
            + (f"  attacker error: {r['attacker_error']}" if r["attacker_error"] else "")
        )
    attacked = [r for r in results if r["variant"] != "none"]
    worst = max((abs(100 * (r["final"] - reference)) for r in attacked), default=0.0)
    handed = sum(r["models_to_attacker"] for r in attacked if not r["variant"].startswith("member"))
    print(f"reference (mean of {len(refs)} unattacked runs): {reference:.3f}; largest difference "
          f"under attack: {worst:.1f} points (goal <= 2); models handed to a non-member: "
          f"{handed}")  # fmt: skip


if __name__ == "__main__":
    main()
