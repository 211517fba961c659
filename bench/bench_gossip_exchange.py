"""Benchmark 1: model-exchange throughput of the gossip transport vs bare pyzmq.

Moves a ~100 MB model (float32 tensors) from one peer's DEALER to another peer's ROUTER inbox
and decodes it, exactly as a peer does (``wire.encode`` → ``Transport.send`` → ``poll`` →
``wire.decode`` with the NaN/size checks), and compares with a bare pyzmq zero-copy
``send(copy=False)`` / ``recv(copy=False)`` of the same bytes over tcp loopback.
Prints MB/s for each and the ratio the goal is stated in (goal: gossip / bare >= 0.7), also
with CURVE on (encrypted gossip vs bare plaintext, and vs bare CURVE).

``--across-veth`` puts the receiving end in one network namespace and the sending end in
another, joined by veth pairs and a bridge (``fedweave.simulations.netns``; needs root), so
both the gossip path and bare pyzmq cross real interfaces instead of loopback.

    python bench/bench_gossip_exchange.py [--mb 100] [--repeats 5] [--across-veth]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections import OrderedDict
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path

import numpy as np
import zmq

from fedweave.gossip import wire
from fedweave.gossip.keys import load_keyring, new_keys
from fedweave.gossip.transport import Transport
from fedweave.simulations.netns import Host, bridged_hosts, inside

Ends = tuple[Host | None, Host | None]
"""(receiver's host, sender's host); None: loopback in this process's own network."""
LOOPBACK: Ends = (None, None)


def at(host: Host | None) -> AbstractContextManager[None]:
    """Sockets made in this block live in ``host``'s network (or ours, for None)."""
    return nullcontext() if host is None else inside(host)


def address(host: Host | None) -> str:
    return "127.0.0.1" if host is None else host.address


def make_model(total_mb: int) -> OrderedDict[str, np.ndarray]:
    """A model shaped like a real one: a few big weight matrices plus small biases."""
    rng = np.random.default_rng(0)
    floats = total_mb * (1 << 20) // 4
    layers = 8
    side = int((floats // layers) ** 0.5)
    model: OrderedDict[str, np.ndarray] = OrderedDict()
    for i in range(layers):
        model[f"layer{i}.weight"] = rng.standard_normal((side, side), dtype=np.float32)
        model[f"layer{i}.bias"] = rng.standard_normal(side, dtype=np.float32)
    return model


def _curve_pair() -> tuple[tuple[bytes, bytes], tuple[bytes, bytes]]:
    return zmq.curve_keypair(), zmq.curve_keypair()


def bare(
    payload: list[np.ndarray], repeats: int, curve: bool, ends: Ends = LOOPBACK
) -> list[float]:
    """Seconds per one-way transfer with raw DEALER/ROUTER, zero-copy both ends; one frame per
    array in ``payload``."""
    # one context (so one I/O thread) per end, like two peers and like the gossip path
    (spub, ssec), (cpub, csec) = _curve_pair()
    with at(ends[0]):
        server_ctx = zmq.Context()
        server = server_ctx.socket(zmq.ROUTER)
        server.setsockopt(zmq.LINGER, 0)
        if curve:
            server.curve_secretkey, server.curve_publickey, server.curve_server = ssec, spub, True
        port = server.bind_to_random_port(f"tcp://{address(ends[0])}")
    with at(ends[1]):
        client_ctx = zmq.Context()
        client = client_ctx.socket(zmq.DEALER)
        client.setsockopt(zmq.LINGER, 0)
        if curve:
            client.curve_secretkey, client.curve_publickey = csec, cpub
            client.curve_serverkey = spub
        client.connect(f"tcp://{address(ends[0])}:{port}")
    client.send(b"hi")
    server.recv_multipart()
    times = []
    views = [memoryview(a.reshape(-1)).cast("B") for a in payload]
    for i in range(repeats + 1):
        start = time.perf_counter()
        client.send_multipart(views, copy=False)
        frames = server.recv_multipart(copy=False)
        assert sum(f.buffer.nbytes for f in frames[1:]) == sum(v.nbytes for v in views)
        if i:  # like the gossip path, the first (cold) transfer is not timed
            times.append(time.perf_counter() - start)
    server.close(0)
    client.close(0)
    server_ctx.term()
    client_ctx.term()
    return times


def gossip(
    model: OrderedDict[str, np.ndarray], repeats: int, curve: bool, ends: Ends = LOOPBACK
) -> list[float]:
    """Seconds per one-way model offer through ``Transport`` + ``wire``, decoded and checked."""
    with tempfile.TemporaryDirectory() as tmp:
        rings = [None, None]
        if curve:
            for name in ("a", "b"):
                new_keys(Path(tmp) / name)
            for me, other in (("a", "b"), ("b", "a")):
                src = Path(tmp) / other / "peer.key"
                (Path(tmp) / me / "allowed" / "other.key").write_bytes(src.read_bytes())
            rings = [load_keyring(Path(tmp) / "a"), load_keyring(Path(tmp) / "b")]
        size = sum(a.nbytes for a in model.values()) + (1 << 20)
        with at(ends[0]):
            receiver = Transport(f"tcp://{address(ends[0])}:0", rings[1], max_message_bytes=size)
        key = rings[1].identity.public_key if rings[1] else None
        with at(ends[1]):
            sender = Transport(f"tcp://{address(ends[1])}:0", rings[0], max_message_bytes=size)
            sender.connect("b", receiver.address, key)
        schema = wire.schema_hash(model)
        times = []
        try:
            for i in range(repeats + 1):
                start = time.perf_counter()
                msg = wire.Message(
                    wire.OFFER,
                    "a",
                    sender.address,
                    1,
                    i + 1,
                    num_examples=1,
                    schema=schema,
                    tensors=model,
                )
                assert sender.send("b", wire.encode(msg))
                got: list = []
                while not got:
                    got = receiver.poll(30.0)
                decoded = wire.decode(got[0].frames, size, expected_schema=schema)
                assert len(decoded.tensors) == len(model)
                if i:  # the first one includes the TCP/CURVE handshake
                    times.append(time.perf_counter() - start)
        finally:
            sender.close()
            receiver.close()
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=int, default=100, help="model size in MiB (default 100)")
    parser.add_argument("--repeats", type=int, default=5, help="timed transfers each (default 5)")
    parser.add_argument(
        "--across-veth",
        action="store_true",
        help="receiver and sender in two network namespaces on a bridge (needs root)",
    )
    args = parser.parse_args()
    if args.across_veth:
        with bridged_hosts(2) as hosts:
            report(args, (hosts[0], hosts[1]))
            sent = veth_tx_bytes(hosts[1])
            print(f"bytes the sender's veth carried: {sent / 1e6:.0f} MB (all runs above)")
    else:
        report(args, LOOPBACK)


def veth_tx_bytes(host: Host) -> int:
    """Bytes ``host``'s eth0 has sent: proof the transfers crossed the veth, not loopback."""
    import json
    import subprocess

    out = subprocess.run(
        ["ip", "-n", host.namespace, "-s", "-j", "link", "show", "eth0"],
        check=True, capture_output=True, text=True,
    ).stdout  # fmt: skip
    return int(json.loads(out)[0]["stats64"]["tx"]["bytes"])


def report(args: argparse.Namespace, ends: Ends) -> None:
    model = make_model(args.mb)
    flat = np.concatenate([a.ravel() for a in model.values()])
    mb = flat.nbytes / 1e6
    arrays = list(model.values())
    rows = {}
    for name, fn in (
        ("bare, 1 frame", lambda: bare([flat], args.repeats, False, ends)),
        ("bare, same frames", lambda: bare(arrays, args.repeats, False, ends)),
        ("gossip", lambda: gossip(model, args.repeats, False, ends)),
        ("bare+CURVE, 1 frame", lambda: bare([flat], args.repeats, True, ends)),
        ("bare+CURVE, frames", lambda: bare(arrays, args.repeats, True, ends)),
        ("gossip + CURVE", lambda: gossip(model, args.repeats, True, ends)),
    ):
        rows[name] = statistics.median(fn())
    where = "loopback" if ends == LOOPBACK else f"{ends[1].address} -> {ends[0].address} (veth)"
    print(f"model: {len(model)} tensors, {mb:.1f} MB; median of {args.repeats} one-way transfers")
    print(f"path: {where}")
    print(f"{'path':<22}{'seconds':>10}{'MB/s':>10}")
    for name, seconds in rows.items():
        print(f"{name:<22}{seconds:>10.3f}{mb / seconds:>10.0f}")
    best_plain = min(rows["bare, 1 frame"], rows["bare, same frames"])
    best_curve = min(rows["bare+CURVE, 1 frame"], rows["bare+CURVE, frames"])
    print("ratios are throughput: gossip / the faster bare variant")
    ratios = (
        ("gossip / bare (goal >= 0.7)", best_plain / rows["gossip"]),
        ("gossip+CURVE / bare+CURVE (goal >= 0.7)", best_curve / rows["gossip + CURVE"]),
        ("gossip+CURVE / bare plaintext (cost of CURVE)", best_plain / rows["gossip + CURVE"]),
    )
    for label, value in ratios:
        print(f"ratio {label:<48}{value:.2f}")


if __name__ == "__main__":
    main()
