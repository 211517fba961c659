"""One message cannot poison a peer: the attack the review ran, message by message, against a
real peer on real ZeroMQ sockets (and the bounds alone, as units). Each test fails without its
defence: the distance bound, the example-count cap, the member check, CURVE identities."""

from __future__ import annotations

import math
import time
from collections import OrderedDict
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import zmq
from vector_peer import vector_learner

import fedweave.gossip.peer as peer_module
from fedweave.addresses import free_ports
from fedweave.config import RunConfig
from fedweave.gossip import averaging, wire
from fedweave.gossip.guard import RADIUS_FACTOR, DistanceGuard, capped_share, counted_examples
from fedweave.gossip.keys import load_keyring, new_key_group
from fedweave.gossip.peer import Peer

OUTSIDER_ADDR = "tcp://127.0.0.1:1"


def _model(value: float, n: int = 16) -> OrderedDict[str, np.ndarray]:
    return OrderedDict(x=np.full(n, value))


# -- the bounds alone -----------------------------------------------------------------------


def test_a_model_far_outside_recent_distances_is_refused_after_warm_up() -> None:
    guard = DistanceGuard(factor=5.0)
    ours = _model(1.0)
    rng = np.random.default_rng(0)
    for _ in range(20):  # honest neighbours, past the warm-up: about 0.4 away
        assert guard.check("honest", _model(1.0 + 0.1 + 0.01 * rng.random()), ours) is None
    assert guard.check("honest", _model(1.3), ours) is None  # 3x the median: still taken
    why = guard.check("mallory", _model(2.0), ours)  # 10x the median
    assert why is not None and why.startswith("too-far")
    assert guard.check("mallory", _model(1e30), ours) is not None


def test_absurd_models_are_refused_even_before_any_distance_is_known() -> None:
    guard = DistanceGuard()
    assert guard.check("a", _model(1e30), _model(0.5)) is not None
    assert guard.check("a", _model(np.finfo(np.float32).max), _model(0.0)) is not None
    assert guard.check("a", _model(4.0), _model(0.0)) is None  # a zero model has no length
    assert len(guard.accepted) == 1  # refused distances never move the bound


def test_a_peer_that_refuses_everyone_learns_the_spread_again() -> None:
    guard = DistanceGuard(factor=5.0)
    ours = _model(0.0)
    for index in range(21):
        guard.check("bcd"[index % 3], _model(0.001), ours)
    # our own model jumped (or was poisoned in warm-up): every neighbour looks far
    for sender in ("b", "c", "d"):
        assert guard.check(sender, _model(1.0), ours) is not None
    assert guard.check("b", _model(1.0), ours) is None


def test_made_up_ids_cannot_restart_the_distance_history() -> None:
    """Issue 39, ``--insecure``: three ids no model of which was ever accepted sent garbage,
    the history restarted, and a model far outside the usual spread was taken."""
    guard = DistanceGuard(factor=5.0)
    ours = _model(0.0)
    for index in range(21):
        assert guard.check("bcd"[index % 3], _model(0.001), ours) is None
    for sender in ("made-up-1", "made-up-2", "made-up-3", "made-up-4", "b"):
        assert guard.check(sender, _model(1e6), ours) is not None
    assert len(guard.accepted) > 0  # the history stands
    assert guard.check("made-up-5", _model(1.0), ours) is not None  # still too far


def test_one_sender_riding_the_bound_cannot_raise_it() -> None:
    """Issue 39's drift: a member whose every model lay just inside the bound raised the
    bound with its own accepted distances (they filled the window the 90th percentile is
    taken from), so its next model could be farther still. The typical distance is now taken
    sender by sender, and one sender does not move the median of senders."""
    guard = DistanceGuard(factor=5.0)
    ours = _model(0.0)  # a model of value v is 4 v away (16 entries)
    rng = np.random.default_rng(0)
    for index in range(300):
        honest = _model(0.025 * (1 + 0.1 * rng.random()))  # about 0.1 away
        assert guard.check("bcd"[index % 3], honest, ours) is None
        guard.check("mallory", _model(0.99 * guard.bound(ours) / 4), ours)
    assert guard.bound(ours) < 5 * 0.12  # five honest typical distances, not more


def test_a_pairwise_move_spans_at_most_the_typical_distance() -> None:
    """The radius a pairwise exchange mixes in full: none until three senders are known,
    then ``RADIUS_FACTOR`` typical distances; a longer difference is taken in part."""
    guard = DistanceGuard()
    ours = _model(0.0)
    assert guard.radius() == math.inf
    for sender in ("b", "c"):
        guard.check(sender, _model(0.025), ours)  # 0.1 away
    assert guard.radius() == math.inf  # two senders: one of them could be the liar
    guard.check("d", _model(0.05), ours)  # 0.2 away: the lower median of 0.1, 0.1, 0.2
    assert guard.radius() == pytest.approx(RADIUS_FACTOR * 0.1)
    assert averaging.bounded_scale(0.05, 0.1) == 1.0
    assert averaging.bounded_scale(0.4, 0.1) == pytest.approx(0.25)
    assert averaging.bounded_scale(0.4, math.inf) == 1.0


def test_a_huge_example_count_weighs_at_most_ratio_times_ours() -> None:
    assert counted_examples(2**53, 300) == 3000
    assert counted_examples(250, 300) == 250  # honest counts within the ratio: exact
    assert counted_examples(5, 0) == 5
    share = 3000 / (3000 + 300)
    assert share < 0.91  # never the whole way
    assert capped_share(1.0, 300, 300) == 0.5  # a group share is bounded the same way
    assert capped_share(0.25, 300, 300) == 0.25


# -- a real peer, raw sockets ---------------------------------------------------------------


@pytest.fixture
def peer(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Peer]:
    """A plaintext ``pairwise`` peer (it mixes each exchange at once, so a test sees the
    move) with model ``[10]*16`` and 300 examples; raw sockets talk to it."""
    np.save(tmp_path / "v.npy", np.full(16, 10.0))
    monkeypatch.setattr(peer_module, "build_learner", vector_learner(tmp_path / "v.npy", 300))
    (port,) = free_ports(1)
    config = RunConfig.of(listen=f"tcp://127.0.0.1:{port}", insecure=True, mix="pairwise")
    p = Peer(config)
    try:
        yield p
    finally:
        p.transport.close(linger_ms=0)


def _ask(peer: Peer, frames: list, sock: zmq.Socket) -> wire.Message | None:
    sock.send_multipart(frames)
    for _ in range(40):
        peer.inbox.serve(0.05)
        if sock.poll(0):
            return wire.decode(sock.recv_multipart())
    return None


def _offer(sender: str, value: float, n: int) -> list:
    return wire.encode(
        wire.Message(wire.OFFER, sender, OUTSIDER_ADDR, 3, 11, num_examples=n,
                     tensors=_model(value))
    )  # fmt: skip


@pytest.fixture
def sock(peer: Peer) -> Iterator[zmq.Socket]:
    ctx = zmq.Context()
    s = ctx.socket(zmq.DEALER)
    s.setsockopt(zmq.LINGER, 0)
    s.connect(peer.transport.address)
    try:
        yield s
    finally:
        s.close(0)
        ctx.term()


def _hello(peer: Peer, sock: zmq.Socket, sender: str) -> None:
    answer = _ask(peer, wire.encode(wire.Message(wire.HELLO, sender, OUTSIDER_ADDR)), sock)
    assert answer is not None and answer.type == wire.PEERS


def test_a_non_member_gets_a_refusal_not_our_model(peer: Peer, sock: zmq.Socket) -> None:
    reply = _ask(peer, _offer("outsider", 10.5, 300), sock)
    assert reply is not None and reply.status == "refused" and not reply.tensors
    assert reply.reason.startswith("not-a-member")
    assert peer.inbox.drops["not-a-member"] == 1
    np.testing.assert_array_equal(peer.state.weights["x"], np.full(16, 10.0))  # not mixed
    pull = wire.encode(wire.Message(wire.OFFER, "outsider2", OUTSIDER_ADDR, 3, 12, pull=True,
                                    schema=peer.state.schema))  # fmt: skip
    reply = _ask(peer, pull, sock)
    assert reply is not None and reply.status == "refused" and not reply.tensors


def test_the_reviews_offer_is_refused_and_hands_out_nothing(peer: Peer, sock: zmq.Socket) -> None:
    _hello(peer, sock, "mallory")  # even introduced, a member's absurd model is refused
    reply = _ask(peer, _offer("mallory", 1e30, 2**53), sock)
    assert reply is not None and reply.status == "refused" and not reply.tensors
    assert reply.reason.startswith("too-far")
    assert peer.inbox.drops["too-far"] == 1
    np.testing.assert_array_equal(peer.state.weights["x"], np.full(16, 10.0))


def test_two_to_the_53_examples_do_not_drag_a_peer_all_the_way(
    peer: Peer, sock: zmq.Socket
) -> None:
    _hello(peer, sock, "mallory")
    reply = _ask(peer, _offer("mallory", 12.0, 2**53), sock)  # close enough to be mixed
    assert reply is not None and reply.status == "ok"
    moved = float(peer.state.weights["x"][0]) - 10.0
    # uncapped it would be 2.0 (the whole way); capped at 10x our 300 examples: 10/11 of it
    assert moved == pytest.approx(2.0 * 3000 / 3300)


def test_both_ends_of_an_exchange_beyond_the_radius_take_the_same_part(
    peer: Peer, sock: zmq.Socket
) -> None:
    """An offer says the radius its sender mixes in full; the receiver takes
    ``min(its own, the offer's) / distance`` of the move and says how much in its reply; the
    offerer applies that part (never more than its own radius allows), so both ends move by
    the same part and the weighted sum stays exact."""
    from fedweave.gossip.exchange import _Pending

    _hello(peer, sock, "alice")
    offer = wire.Message(wire.OFFER, "alice", OUTSIDER_ADDR, 3, 11, num_examples=300,
                         tensors=_model(12.0), radius=4.0)  # fmt: skip
    reply = _ask(peer, wire.encode(offer), sock)  # 8 away: half of the move
    assert reply is not None and reply.status == "ok"
    assert reply.scale == pytest.approx(0.5)
    np.testing.assert_array_equal(reply.tensors["x"], np.full(16, 10.0))  # before its mix
    # equal counts: each end would move half of the 2.0 between them; it moves half of that
    np.testing.assert_allclose(peer.state.weights["x"], np.full(16, 10.5))
    # the offerer's end: a reply claiming a larger part than our radius allows gets ours
    exchange = peer.exchange
    for claimed, expected in ((1.0, 0.5), (0.25, 0.25)):
        peer.state.weights = _model(10.0)
        exchange.pending[77] = _Pending("bob", _model(10.0), time.monotonic() + 30, radius=4.0)
        exchange.on_reply(wire.Message(wire.REPLY, "bob", OUTSIDER_ADDR, 3, 77, num_examples=300,
                                       tensors=_model(12.0), scale=claimed))  # fmt: skip
        np.testing.assert_allclose(peer.state.weights["x"], np.full(16, 10.0 + expected))


def test_with_curve_a_member_cannot_speak_for_made_up_ids(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Robust mixing counts senders: with CURVE a sender is the key ZAP authenticated, so
    one member's key under four made-up ids is one member, and the four are dropped."""
    dirs = [tmp_path / "k-peer", tmp_path / "k-member"]
    new_key_group(dirs)
    np.save(tmp_path / "v.npy", np.full(16, 10.0))
    monkeypatch.setattr(peer_module, "build_learner", vector_learner(tmp_path / "v.npy"))
    (port,) = free_ports(1)
    p = Peer(RunConfig.of(listen=f"tcp://127.0.0.1:{port}", keys=dirs[0], mix="trimmed"))
    ctx = zmq.Context()
    s = ctx.socket(zmq.DEALER)
    s.setsockopt(zmq.LINGER, 0)
    member = load_keyring(dirs[1]).identity
    s.curve_secretkey, s.curve_publickey = member.secret_key, member.public_key
    s.curve_serverkey = p.keyring.identity.public_key if p.keyring else None
    s.connect(p.transport.address)
    try:
        for fake in ("fake-1", "fake-2", "fake-3", "fake-4"):
            assert _ask(p, _offer(fake, 1e3, 300), s) is None
        assert p.inbox.drops["spoofed-id"] == 4
        assert not p.exchange.buffered
        reply = _ask(p, _offer(member.peer_id, 10.5, 300), s)  # its own id: a member
        assert reply is not None and reply.status == "ok"
        assert list(p.exchange.buffered) == [member.peer_id]
    finally:
        s.close(0)
        ctx.term()
        p.transport.close(linger_ms=0)
