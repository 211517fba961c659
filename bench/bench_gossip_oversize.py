"""Benchmark: a message far over ``--max-message-mb`` in frames each under it.

The review sent a 319 MiB offer as 20 frames of 15 MiB to a peer with ``--max-message-mb 16``:
``MAXMSGSIZE`` bounds frames only, so it passed, was buffered whole and only then dropped.
This sends ~300 MiB in 20 frames of 15 MiB against a 16 MiB limit to a real receiving process
and prints whether it was dropped and the receiver's peak RSS (``VmHWM``) over its baseline:

1. ``peer``: a default ``fedweave peer`` (CURVE; the sender is an allow-listed member, the
   worst case). The peer lowers ``MAXMSGSIZE`` to its largest tensor, so libzmq cuts the
   first 15 MiB frame and closes the connection before buffering anything.
2. ``inbox``: a bare ``Transport`` + ``Inbox`` whose per-frame limit is the message limit
   (what a peer with a 15 MiB tensor would have): the frames reach Python, are counted
   frame by frame (``RCVMORE``) and dropped as ``too-large`` without being decoded.
3. ``peer, small frames``: the same ~300 MiB in frames of 64 KiB (under the peer's frame
   limit) to the default peer: what is left. libzmq hands a multipart message to the
   application only once its last frame arrived, so this one is buffered whole inside libzmq
   before the peer can drop it; the goal is that it is dropped and the peer goes on.

Goal: dropped in every case, the peer answers afterwards, and in 1 the peak RSS does not grow
by the message size.

    python bench/bench_gossip_oversize.py [--mb 300] [--frames 20] [--limit-mb 16]
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
import zmq

from fedweave.addresses import free_ports
from fedweave.gossip import wire
from fedweave.gossip.keys import load_keyring, new_key_group

VECTOR_PEER = Path(__file__).resolve().parents[1] / "tests" / "vector_peer.py"
"""A gossip peer whose model is a fixed vector (the protocol alone, no training)."""


def _kib(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"no {field}")


def _frames(total_mb: int, count: int) -> list[bytes]:
    header = wire.encode(wire.Message(wire.HELLO, "oversize", ""))[0]
    size = (total_mb << 20) // count
    chunk = bytes(size)
    return [header, *([chunk] * count)]


def _dealer(ctx: zmq.Context, addr: str, keys: Path | None, server: Path | None) -> zmq.Socket:
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.SNDTIMEO, 60_000)
    if keys is not None and server is not None:
        ring = load_keyring(keys)
        sock.curve_secretkey = ring.identity.secret_key
        sock.curve_publickey = ring.identity.public_key
        sock.curve_serverkey = load_keyring(server).identity.public_key
    sock.connect(addr)
    return sock


def _hello_answered(ctx: zmq.Context, addr: str, keys: Path | None, server: Path | None) -> bool:
    sock = _dealer(ctx, addr, keys, server)
    try:
        sender = load_keyring(keys).identity.peer_id if keys else "probe"
        sock.send_multipart(wire.encode(wire.Message(wire.HELLO, sender, "")))
        return bool(sock.poll(10_000))
    finally:
        sock.close(0)


def serve_inbox(limit_mb: int, seconds: float) -> None:
    """Receiver for case 2 (a child process): a bare Transport + Inbox, frame limit = the
    message limit. Prints its address, then one JSON line when done."""
    from fedweave.gossip.inbox import Inbox
    from fedweave.gossip.transport import Transport

    limit = limit_mb << 20
    transport = Transport("tcp://127.0.0.1:0", None, limit)
    seen: list[str] = []
    inbox = Inbox(transport, "0" * 64, limit, lambda inc, msg: seen.append(msg.sender),
                  lambda: False)  # fmt: skip
    print(transport.address, flush=True)
    baseline = _kib(os.getpid(), "VmHWM")
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and "probe" not in seen:
        inbox.serve(0.2)
    print(json.dumps({"drops": dict(inbox.drops), "seen": seen, "baseline_kib": baseline,
                      "hwm_kib": _kib(os.getpid(), "VmHWM")}), flush=True)  # fmt: skip
    transport.close()


def case_inbox(total_mb: int, count: int, limit_mb: int) -> dict:
    child = subprocess.Popen(
        [sys.executable, __file__, "--serve-inbox", str(limit_mb)],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert child.stdout is not None
    addr = child.stdout.readline().strip()
    ctx = zmq.Context()
    try:
        sock = _dealer(ctx, addr, None, None)
        sock.send_multipart(_frames(total_mb, count), copy=False)
        # then a good message on the same connection: it arrives after the big one
        sock.send_multipart(wire.encode(wire.Message(wire.HELLO, "probe", "")))
        result = json.loads(child.stdout.readline())
        sock.close(0)
    finally:
        ctx.term()
        child.wait(timeout=30)
    return {
        "dropped": result["drops"].get("too-large", 0) == 1 and "oversize" not in result["seen"],
        "goes_on": "probe" in result["seen"],
        "peak_growth_mib": (result["hwm_kib"] - result["baseline_kib"]) / 1024,
        "drops": result["drops"],
    }


def case_peer(work: Path, total_mb: int, count: int, limit_mb: int) -> dict:
    keys = [work / "keys-peer", work / "keys-sender"]
    if not keys[0].exists():
        new_key_group(keys)
    np.save(work / "v.npy", np.zeros(8970, dtype=np.float32))  # the digits model's size
    (port,) = free_ports(1)
    addr = f"tcp://127.0.0.1:{port}"
    results = work / f"r-{count}.jsonl"
    results.unlink(missing_ok=True)
    cmd = [
        sys.executable, str(VECTOR_PEER), "peer", "--listen", addr, "--vector",
        str(work / "v.npy"), "--rounds", "0", "--round-interval", "0.5", "--max-message-mb",
        str(limit_mb), "--keys", str(keys[0]), "--results", str(results), "--db", "none",
        "--log-level", "warning", "--wait-for-peers", "1",  # alone on purpose: the target
    ]  # fmt: skip
    log = (work / f"peer-{count}.log").open("wb")
    peer = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    ctx = zmq.Context()
    try:
        deadline = time.monotonic() + 60
        while not (results.exists() and b'"round"' in results.read_bytes()):
            if time.monotonic() > deadline or peer.poll() is not None:
                raise RuntimeError(f"the peer did not start; see {log.name}")
            time.sleep(0.1)
        baseline = _kib(peer.pid, "VmHWM")
        sock = _dealer(ctx, addr, keys[1], keys[0])
        frames = _frames(total_mb, count)
        sock.send_multipart(frames, copy=False)
        del frames
        time.sleep(3.0)  # let it arrive (or be cut)
        answered = _hello_answered(ctx, addr, keys[1], keys[0])
        sock.close(0)
        hwm = _kib(peer.pid, "VmHWM")
        alive = peer.poll() is None
    finally:
        ctx.term()
        peer.send_signal(signal.SIGTERM)
        peer.wait(timeout=30)
        log.close()
    final = [json.loads(x) for x in results.read_text().splitlines() if '"final"' in x]
    drops = final[-1]["drops"] if final else {}
    return {
        # had it been read whole and decoded, a hello with tensor frames is ``malformed``
        "dropped": alive and "malformed" not in drops,
        "goes_on": answered and alive,
        "peak_growth_mib": (hwm - baseline) / 1024,
        "drops": drops,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=int, default=300)
    parser.add_argument("--frames", type=int, default=20)
    parser.add_argument("--limit-mb", type=int, default=16)
    parser.add_argument("--serve-inbox", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_inbox:
        serve_inbox(args.serve_inbox, seconds=120)
        return
    small_frames = (args.mb << 20) // (64 << 10)
    print(f"~{args.mb} MiB message against --max-message-mb {args.limit_mb}")
    with tempfile.TemporaryDirectory(prefix="bench-oversize-") as tmp:
        work = Path(tmp)
        rows = [
            (f"1 peer (CURVE), {args.frames} frames", case_peer(work, args.mb, args.frames,
                                                                args.limit_mb)),
            (f"2 inbox, frame limit {args.limit_mb} MiB, {args.frames} frames",
             case_inbox(args.mb, args.frames, args.limit_mb)),
            (f"3 peer (CURVE), {small_frames} frames of 64 KiB",
             case_peer(work, args.mb, small_frames, args.limit_mb)),
        ]  # fmt: skip
    print(f"{'case':<46} {'dropped':>8} {'goes on':>8} {'peak RSS +MiB':>14}  drops counted")
    for name, r in rows:
        print(
            f"{name:<46} {str(r['dropped']):>8} {str(r['goes_on']):>8} "
            f"{r['peak_growth_mib']:>14.1f}  {r['drops']}"
        )


if __name__ == "__main__":
    main()
