"""Key mistakes are named, on the side that can fix them, within seconds: CURVE against
plaintext, a seed where nothing listens, a neighbour that does not allow our key (a partial
allow-list), and two peers sharing one key pair. Real peer processes on loopback; each test
prints the seconds until its message appeared."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
from vector_peer import SCRIPT as VECTOR_PEER

from fedweave.addresses import free_ports
from fedweave.gossip.keys import load_keyring, new_keys

REPO = Path(__file__).resolve().parent.parent


def _spawn(args: list[str], log: Path) -> subprocess.Popen[bytes]:
    env = dict(os.environ, OMP_NUM_THREADS="1", FEDWEAVE_DB="none")
    cmd = [sys.executable, str(VECTOR_PEER), "peer", "--log-level", "info", *args]
    with log.open("wb") as handle:
        return subprocess.Popen(cmd, env=env, stdout=handle, stderr=subprocess.STDOUT, cwd=REPO)


def _wait(proc: subprocess.Popen[bytes], timeout: float) -> int:
    try:
        return proc.wait(timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def _stop(*procs: subprocess.Popen[bytes]) -> None:
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    for proc in procs:
        _wait(proc, 20)


def _until(log: Path, text: str, timeout: float) -> float:
    """Seconds until ``text`` shows in ``log`` (AssertionError after ``timeout``)."""
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        if log.exists() and text in log.read_text():
            return time.monotonic() - started
        time.sleep(0.05)
    raise AssertionError(f"{text!r} not in {log.name} after {timeout} s:\n{log.read_text()}")


def _keys(tmp: Path, names: str) -> dict[str, Path]:
    dirs = {name: tmp / f"keys-{name}" for name in names}
    for d in dirs.values():
        new_keys(d)
    return dirs


def _allow(dirs: dict[str, Path], who: str, *whom: str) -> None:
    for other in whom:
        identity = load_keyring(dirs[other]).identity
        shutil.copyfile(dirs[other] / "peer.key", dirs[who] / "allowed" / f"{identity.peer_id}.key")


def _args(tmp: Path, port: int, *extra: str) -> list[str]:
    vector = tmp / "v.npy"
    if not vector.exists():  # written once: a peer started before reads it as it starts
        np.save(vector, np.zeros(4))
    return [
        "--listen", f"tcp://127.0.0.1:{port}", "--vector", str(vector),
        "--round-interval", "0.05", "--exchange-timeout", "2", *extra,
    ]  # fmt: skip


def test_curve_against_plaintext_is_named_within_seconds_both_ways(tmp_path: Path) -> None:
    dirs = _keys(tmp_path, "ab")
    _allow(dirs, "a", "b")
    _allow(dirs, "b", "a")
    ports = free_ports(3)
    curve_seed = _spawn(
        _args(tmp_path, ports[0], "--keys", str(dirs["a"]), "--rounds", "0"), tmp_path / "a.log"
    )
    plain_seed = _spawn(
        _args(tmp_path, ports[1], "--insecure", "--rounds", "0"), tmp_path / "p.log"
    )
    try:
        for name in ("a", "p"):  # both seeds listening
            _until(tmp_path / f"{name}.log", "waiting for 1 more peer(s)", 60)
        cases = {
            "plain-joiner": (["--insecure"], ports[0], "speaks CURVE and this peer plaintext"),
            "curve-joiner": (["--keys", str(dirs["b"])], ports[1], "runs plaintext (--insecure)"),
        }
        for name, (extra, seed, said) in cases.items():
            started = time.monotonic()
            joiner = _spawn(
                _args(tmp_path, ports[2], *extra, "--seeds", f"tcp://127.0.0.1:{seed}"),
                tmp_path / f"{name}.log",
            )
            assert _wait(joiner, 60) == 2
            seconds = time.monotonic() - started
            log = (tmp_path / f"{name}.log").read_text()
            print(f"{name}: exit 2 after {seconds:.1f} s (process start included): {said}")
            assert f"error: seed tcp://127.0.0.1:{seed} {said}" in log, log
            assert seconds < 30 and "Traceback" not in log  # ~1.5 s; a loaded CI machine
    finally:
        _stop(curve_seed, plain_seed)


def test_a_seed_where_nothing_listens_is_named(tmp_path: Path) -> None:
    ports = free_ports(2)
    started = time.monotonic()
    joiner = _spawn(
        _args(
            tmp_path, ports[0], "--insecure", "--seeds", f"tcp://127.0.0.1:{ports[1]}",
            "--seed-timeout", "3",
        ),
        tmp_path / "j.log",
    )  # fmt: skip
    assert _wait(joiner, 60) == 2
    log = (tmp_path / "j.log").read_text()
    print(f"exit 2 after {time.monotonic() - started:.1f} s with --seed-timeout 3")
    assert (
        f"error: no seed answered within 3s: tcp://127.0.0.1:{ports[1]} refuses connections "
        "(no peer listens there)"
    ) in log, log


def test_a_neighbour_that_refuses_our_key_is_named_and_not_waited_for(tmp_path: Path) -> None:
    """a and b allow everyone; c allows a and b, but b does not allow c. c hears of b from a
    and offers to it: b's handshake refuses c's key. c says so once, names b, and does not
    wait out deadlines on b (no drop after missed deadlines); b names c by its id."""
    dirs = _keys(tmp_path, "abc")
    _allow(dirs, "a", "b", "c")
    _allow(dirs, "b", "a")
    _allow(dirs, "c", "a", "b")
    ids = {name: load_keyring(d).identity.peer_id for name, d in dirs.items()}
    ports = free_ports(3)
    seed = ["--seeds", f"tcp://127.0.0.1:{ports[0]}"]
    a = _spawn(
        _args(
            tmp_path, ports[0], "--keys", str(dirs["a"]), "--rounds", "0", "--wait-for-peers", "3"
        ),
        tmp_path / "a.log",
    )
    b = _spawn(
        _args(tmp_path, ports[1], "--keys", str(dirs["b"]), "--rounds", "0", *seed),
        tmp_path / "b.log",
    )
    c = None
    try:
        # c hears of b from a only once b has joined a (c's 60 rounds take 3 s)
        _until(tmp_path / "a.log", f"peer {ids['b']} is live", 60)
        c = _spawn(
            _args(tmp_path, ports[2], "--keys", str(dirs["c"]), "--rounds", "60", "--linger", "0",
                  *seed),
            tmp_path / "c.log",
        )  # fmt: skip
        seconds = _until(tmp_path / "c.log", f"peer {ids['b']} refuses our key", 60)
        print(f"c said 'peer b refuses our key' {seconds:.1f} s after its start")
        assert _wait(c, 120) == 0  # it went on with a: no missed deadlines on b
        log = (tmp_path / "c.log").read_text()
        assert log.count("refuses our key") == 1 and "missed deadlines" not in log, log
        assert "completed: 60 round(s)" in log  # not completed-alone: it mixed with a
        _until(tmp_path / "b.log", f"refused a connection from peer {ids['c']}", 5)
    finally:
        _stop(*(p for p in (a, b, c) if p is not None))


def test_two_peers_with_one_key_pair_the_second_is_refused_and_stops(tmp_path: Path) -> None:
    dirs = _keys(tmp_path, "ab")
    _allow(dirs, "a", "b")
    _allow(dirs, "b", "a")
    shutil.copytree(dirs["b"], tmp_path / "keys-b-copy")  # one site's keys copied to another
    ports = free_ports(3)
    seed = ["--seeds", f"tcp://127.0.0.1:{ports[0]}"]
    a = _spawn(
        _args(tmp_path, ports[0], "--keys", str(dirs["a"]), "--rounds", "0"), tmp_path / "a.log"
    )
    b = _spawn(
        _args(tmp_path, ports[1], "--keys", str(dirs["b"]), "--rounds", "0", *seed),
        tmp_path / "b.log",
    )
    try:
        _until(tmp_path / "b.log", "round 5:", 60)
        started = time.monotonic()
        copy = _spawn(
            _args(
                tmp_path, ports[2], "--keys", str(tmp_path / "keys-b-copy"), "--rounds", "5", *seed
            ),
            tmp_path / "copy.log",
        )
        assert _wait(copy, 60) == 2
        seconds = time.monotonic() - started
        log = (tmp_path / "copy.log").read_text()
        print(f"the copy stopped {seconds:.1f} s after its start (process start included)")
        assert "refuses this peer: duplicate-id: peer id" in log, log
        assert f"is live at tcp://127.0.0.1:{ports[1]} too" in log and "Traceback" not in log
        assert "round 1" not in log  # it never trained under the shared id
        assert "duplicate-id" in (tmp_path / "a.log").read_text()
        assert b.poll() is None  # the first one goes on
    finally:
        _stop(a, b)
