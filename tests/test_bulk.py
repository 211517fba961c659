"""Direct transfers (``fedweave/bulk/``, issue 36): a round's tensors beside Flower's messages.

Real parts: the coordinator's transfer server on a loopback port with the TLS files
``fedweave certs init`` makes, the site's HTTPS client, the spool on disk, Flower's own records
and messages, the site mod and the coordinator's grid between them. What is tried: the blob
format byte for byte and its refusals; an outsider with only the CA certificate, a wrong,
expired or revoked token, a site fetching what its token does not name, an upload over the
limit or twice, a stalled upload, a blob changed on the way; and a site whose reply names
another site's upload or other bytes than it uploaded, which is that site's failure, bound to
its node, while the others' replies arrive whole.
"""

from __future__ import annotations

import http.client
import socket
import ssl
import time

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, Context, Message, RecordDict
from flwr.common import ndarray_to_bytes
from test_site_outcomes import fit_result, instruction

from fedweave.bulk import server as bulk_server
from fedweave.bulk.records import BlobError, decoded, decoded_file, encoded
from fedweave.bulk.server import BulkServer
from fedweave.bulk.spool import Spool
from fedweave.bulk.transfer import Link, TransferError
from fedweave.contract import (
    BULK_RECEIPT_RECORD,
    BULK_TICKET_RECORD,
    NODE_CA_CERT_KEY,
    NODE_COORDINATOR_KEY,
)


def _record(*arrays: np.ndarray) -> ArrayRecord:
    """A record in Flower's legacy layout (keys "0", "1", ...: NumPy's serialisation)."""
    return ArrayRecord(array_dict={
        str(i): Array(dtype=str(a.dtype), shape=a.shape, stype="numpy.ndarray",
                      data=ndarray_to_bytes(a))
        for i, a in enumerate(arrays)
    })  # fmt: skip


@pytest.fixture(scope="module")
def tls(tmp_path_factory):
    from fedweave.certs import init_certificates

    return init_certificates(tmp_path_factory.mktemp("tls"), ["localhost"])


@pytest.fixture
def served(tmp_path, tls):
    """A transfer server with TLS over a fresh spool; ``revoked`` node ids are refused."""
    revoked: set[int] = set()
    spool = Spool(tmp_path / "spool")
    server = BulkServer(
        ("127.0.0.1", 0), spool, (tls.server_cert, tls.server_key), lambda n: n not in revoked
    ).start()
    try:
        yield server, spool, revoked
    finally:
        server.close()


def _link(server, token: str, tls, **kw) -> Link:
    return Link("127.0.0.1", server.port, token, kw.pop("ca", tls.ca_cert), **kw)


# -- the blob --------------------------------------------------------------------------------


def test_a_blob_holds_its_records_byte_for_byte_and_refuses_anything_else():
    weights = _record(np.arange(12, dtype=np.float32).reshape(3, 4), np.array([7], np.int64))
    other = _record(np.zeros((2, 2), np.float16))
    back = decoded(encoded({"fitins.parameters": weights, "extra": other}))
    assert list(back) == ["fitins.parameters", "extra"]
    for name, record in (("fitins.parameters", weights), ("extra", other)):
        assert list(back[name]) == list(record)
        for key in record:
            sent, got = record[key], back[name][key]
            assert (got.dtype, got.shape, got.stype, got.data) == (
                sent.dtype, sent.shape, sent.stype, sent.data,
            )  # fmt: skip
    blob = encoded({"fitins.parameters": weights})
    from safetensors.numpy import save

    for bad in (b"", b"\x00" * 7, blob[:-5], b"\xff" * 64, save({"0": np.zeros(3, np.uint8)})):
        with pytest.raises(BlobError):
            decoded(bad)


def test_a_blob_in_a_file_reads_the_same_and_refuses_the_same(tmp_path):
    """The coordinator reads an upload from its spool file, one tensor at a time."""
    from safetensors.numpy import save

    weights = _record(np.arange(6, dtype=np.float64), np.ones((2, 3), np.int32))
    path = tmp_path / "blob"
    path.write_bytes(encoded({"fitres.parameters": weights}))
    back = decoded_file(path)["fitres.parameters"]
    assert [back[k].data for k in back] == [weights[k].data for k in weights]
    blob = path.read_bytes()
    extra = save({"0": np.zeros(3, np.uint8), "1": np.zeros(1, np.uint8)},
                 metadata={"fedweave.records": '[["r", "0", "float32", [3], "numpy.ndarray"]]'})
    not_bytes = save({"0": np.zeros(3, np.float32)},
                     metadata={"fedweave.records": '[["r", "0", "float32", [3], "numpy.ndarray"]]'})
    assert [v.data for v in _streamed(blob)["fitres.parameters"].values()] == [
        weights[k].data for k in weights
    ]
    layout = '[["r", "0", "", [], "x"], ["r", "1", "", [], "x"]]'
    gap = _blob({"0": [0, 3], "1": [4, 5]}, layout, 5)  # a byte no tensor owns
    overlap = _blob({"0": [0, 3], "1": [2, 5]}, layout, 5)
    trailing = _blob({"0": [0, 3], "1": [3, 5]}, layout, 6)
    for bad in (b"", blob[:-5], b"\xff" * 64, save({"0": np.zeros(3, np.uint8)}), extra,
                not_bytes, gap, overlap, trailing):  # fmt: skip
        path.write_bytes(bad)
        with pytest.raises(BlobError):
            decoded_file(path)
        with pytest.raises(BlobError):
            decoded(bad)
        with pytest.raises(BlobError):  # as a site reads a fetched model off its connection
            _streamed(bad)


def _blob(offsets: dict, layout: str, data: int) -> bytes:
    """A safetensors blob written by hand: byte-string tensors at ``offsets``, ``data`` bytes
    of data."""
    import json

    header = {name: {"dtype": "U8", "shape": [end - begin], "data_offsets": [begin, end]}
              for name, (begin, end) in offsets.items()}  # fmt: skip
    header["__metadata__"] = {"fedweave.records": layout}
    text = json.dumps(header).encode()
    return len(text).to_bytes(8, "little") + text + b"\x01" * data


def _streamed(blob: bytes):
    """``decoded_stream`` over ``blob`` as a connection gives it: a short read is an error."""
    import io

    from fedweave.bulk.records import decoded_stream

    stream = io.BytesIO(blob)

    def read(count: int) -> bytes:
        got = stream.read(count)
        if len(got) != count:
            raise BlobError("the stream ended early")  # the site's link: a TransferError
        return got

    return decoded_stream(read, len(blob))


# -- the server and a site's client ------------------------------------------------------------


def test_a_site_fetches_exactly_what_its_token_names(served, tls):
    server, spool, _ = served
    blob = encoded({"fitins.parameters": _record(np.ones(1000, np.float32))})
    digest = spool.put_blob(blob)
    token = spool.grant(5, [digest], 0, 60)
    assert _link(server, token, tls).fetch(digest, len(blob)) == blob
    other = spool.put_blob(encoded({"x": _record(np.zeros(3, np.float32))}))
    with pytest.raises(TransferError, match="403: the token does not allow this blob"):
        _link(server, token, tls).fetch(other, 10)
    with pytest.raises(TransferError, match="offered"):
        _link(server, token, tls).fetch(digest, len(blob) + 1)  # not the size it was told
    assert server.counts.transfers["fetched"] == 2  # served twice, the second refused by the site


def test_outsiders_wrong_expired_and_revoked_tokens_get_nothing(served, tls, tmp_path):
    from fedweave.certs import init_certificates

    another_ca = init_certificates(tmp_path / "another", ["localhost"])
    server, spool, revoked = served
    blob = encoded({"p": _record(np.ones(10, np.float32))})
    digest = spool.put_blob(blob)
    live, expired = spool.grant(5, [digest], 1 << 20, 60), spool.grant(5, [digest], 1 << 20, -1)
    for token, said in (("", "403"), ("guess" * 8, "unknown or expired"),
                        (expired, "unknown or expired")):  # fmt: skip
        with pytest.raises(TransferError, match=said):
            _link(server, token, tls).fetch(digest, len(blob))
        with pytest.raises(TransferError, match=said):
            _link(server, token, tls).upload(b"x" * 10)
    # the CA certificate alone, no token, straight over TLS
    context = ssl.create_default_context(cafile=str(tls.ca_cert))
    conn = http.client.HTTPSConnection("127.0.0.1", server.port, context=context, timeout=5)
    conn.request("GET", f"/v1/blobs/{digest}")
    assert conn.getresponse().status == 403
    conn.close()
    revoked.add(5)  # the coordinator revoked the site's key after the grant was made
    with pytest.raises(TransferError, match="no longer registered"):
        _link(server, live, tls).fetch(digest, len(blob))
    with pytest.raises(TransferError, match="certificate verify failed|CERTIFICATE"):
        Link("127.0.0.1", server.port, live, another_ca.ca_cert).fetch(digest, len(blob))
    with pytest.raises(TransferError):  # plain HTTP to the TLS port
        _link(server, live, tls, ca=None).fetch(digest, len(blob))
    assert server.counts.transfers["fetched"] == 0 and server.counts.transfers["refused"] >= 8


def test_an_upload_is_bounded_once_per_token_and_only_its_node_takes_it(served, tls):
    server, spool, _ = served
    token = spool.grant(5, [], 1000, 60)
    with pytest.raises(TransferError, match="413: an upload of 1001 bytes is over"):
        _link(server, token, tls).upload(b"x" * 1001)
    receipt = _link(server, token, tls).upload(b"y" * 1000)
    assert receipt["size"] == 1000
    with pytest.raises(TransferError, match="409"):
        _link(server, token, tls).upload(b"z" * 10)
    assert spool.take_upload(receipt["upload"], 6) is None  # another node's grant
    upload = spool.take_upload(receipt["upload"], 5)
    assert upload.path.read_bytes() == b"y" * 1000 and upload.digest == receipt["digest"]
    assert spool.take_upload(receipt["upload"], 5) is None  # taken once
    spool.release([token])
    assert not list((spool.root / "grants").iterdir())
    assert not list((spool.root / "uploads").iterdir())


def test_a_stalled_upload_is_cut_off_and_leaves_nothing(served, tls, monkeypatch):
    server, spool, _ = served
    monkeypatch.setattr(bulk_server, "IO_TIMEOUT_S", 0.5)
    token = spool.grant(5, [], 1 << 20, 60)
    context = ssl.create_default_context(cafile=str(tls.ca_cert))
    raw = socket.create_connection(("127.0.0.1", server.port), timeout=10)
    with context.wrap_socket(raw, server_hostname="127.0.0.1") as sock:
        sock.sendall(f"PUT /v1/uploads HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {token}\r\n"
                     "Content-Length: 100000\r\n\r\n".encode() + b"a" * 100)  # fmt: skip
        started = time.monotonic()
        assert sock.recv(100) == b""  # the server hangs up on the stalled sender
        assert time.monotonic() - started < 5
    time.sleep(0.2)
    assert not list((spool.root / "uploads").iterdir())
    assert _link(server, token, tls).upload(b"b" * 10)["size"] == 10  # the grant may retry


def test_a_blob_changed_on_the_way_is_refused_by_the_site(served, tls):
    server, spool, _ = served
    blob = encoded({"p": _record(np.ones(100, np.float32))})
    digest = spool.put_blob(blob)
    spool.blob_path(digest).write_bytes(blob[:-1] + b"\x01")
    token = spool.grant(5, [digest], 0, 60)
    with pytest.raises(TransferError, match="does not hash to the digest"):
        _link(server, token, tls).fetch(digest, len(blob))
    with pytest.raises(TransferError, match="does not hash to the digest"):
        _link(server, token, tls).fetch_records(digest, len(blob))  # read straight into records


# -- the coordinator's grid and the site's mod, end to end ---------------------------------------


class _Sites:
    """A grid whose sites run the bulk mod over a real transfer server: each trains by
    returning its model plus its node id; ``tamper(node, reply)`` may rewrite a reply after
    the mod (an insider rewriting its own)."""

    def __init__(self, server, tls, tamper=lambda node, reply: reply, trains=None,
                 answer=None) -> None:  # fmt: skip
        self.server, self.tls, self.tamper = server, tls, tamper
        self.trains = trains or {}  # node -> its own update's record, uploaded as any other
        self.answer = answer  # (node, message) -> the reply's content, instead of training
        self.wire: list[RecordDict] = []

    def send_and_receive(self, messages, *, timeout=None):
        from fedweave.client.bulk_mod import bulk_transfers

        replies = []
        for message in messages:
            self.wire.append(message.content)
            node = message.metadata.dst_node_id
            context = Context(run_id=1, node_id=node, state=RecordDict(), run_config={},
                              node_config={NODE_COORDINATOR_KEY: "127.0.0.1:9092",
                                           NODE_CA_CERT_KEY: str(self.tls.ca_cert)})  # fmt: skip
            arrived = Message(content=_copy(message.content), metadata=message.metadata)

            def train(msg, ctx, node=node):
                if self.answer is not None:
                    return Message(self.answer(node, msg), reply_to=msg)
                model = msg.content.array_records["fitins.parameters"]
                result = fit_result()
                weights = [np.frombuffer(model[k].numpy().tobytes(), np.float32) + node
                           for k in model]  # fmt: skip
                result.array_records["fitres.parameters"] = (
                    self.trains[node](weights) if node in self.trains else _record(*weights)
                )
                return Message(result, reply_to=msg)

            reply = bulk_transfers(arrived, context, train)
            replies.append(self.tamper(node, reply))
        return replies


def _copy(content: RecordDict) -> RecordDict:
    return RecordDict(dict(content.items()))


def test_the_grid_and_the_site_mod_move_tensors_beside_the_messages(served, tls):
    from fedweave.coordinator.rounds.bulk import BulkGrid

    server, spool, _ = served
    model = np.linspace(0, 1, 5000, dtype=np.float32)
    sites = _Sites(server, tls)
    grid = BulkGrid(sites, spool, server.port)
    asked = []
    for node in (11, 12, 13):
        message = instruction(node)
        message.content.array_records["fitins.parameters"] = _record(model)
        asked.append(message)
    replies = grid.send_and_receive(asked, timeout=30)
    # on the wire: no tensors, a ticket; the workflow's own messages keep their model
    assert all(not content.array_records and BULK_TICKET_RECORD in content for content in
               sites.wire)  # fmt: skip
    assert all("fitins.parameters" in m.content.array_records for m in asked)
    assert len({content[BULK_TICKET_RECORD]["token"] for content in sites.wire}) == 3
    assert len(list((spool.root / "blobs").iterdir())) == 1  # one model, written once
    for reply in replies:
        assert not reply.has_error() and BULK_RECEIPT_RECORD not in reply.content
        got = reply.content.array_records["fitres.parameters"]["0"].numpy()
        np.testing.assert_array_equal(got, model + reply.metadata.src_node_id)
    assert server.counts.transfers == {"fetched": 3, "uploaded": 3, "refused": 0}
    assert not list((spool.root / "grants").iterdir())  # the exchange's grants end with it


def test_a_reply_naming_another_sites_upload_or_other_bytes_fails_only_that_site(served, tls):
    from fedweave.coordinator.rounds.bulk import BulkGrid

    server, spool, _ = served
    receipts = {}

    def tamper(node, reply):
        receipt = reply.content.config_records[BULK_RECEIPT_RECORD]
        receipts[node] = dict(receipt)
        if node == 15:  # its upload would replace a record its reply carries in the clear
            reply.content.array_records["fitres.parameters"] = _record(np.ones(1, np.float32))
        if node == 12:  # claims site 11's upload as its own
            receipt["upload"] = receipts[11]["upload"]
        if node == 13:  # names other bytes than it sent
            receipt["digest"] = "0" * 64
        return reply

    grid = BulkGrid(_Sites(server, tls, tamper), spool, server.port)
    asked = []
    for node in (11, 12, 13, 14, 15):
        message = instruction(node)
        message.content.array_records["fitins.parameters"] = _record(np.zeros(50, np.float32))
        asked.append(message)
    by_node = {r.metadata.src_node_id: r for r in grid.send_and_receive(asked, timeout=30)}
    assert by_node[12].has_error() and "does not hold for this site" in by_node[12].error.reason
    assert by_node[13].has_error() and "not the one it names" in by_node[13].error.reason
    assert by_node[15].has_error() and "a record its reply already has" in by_node[15].error.reason
    # site 12's claim came after 11's own reply had taken it: 11 is whole
    for node in (11, 14):
        assert not by_node[node].has_error()
        got = by_node[node].content.array_records["fitres.parameters"]["0"].numpy()
        np.testing.assert_array_equal(got, np.full(50, node, np.float32))


def test_held_updates_add_up_one_at_a_time_to_the_mean_flower_takes_in_memory(
    served, tls, monkeypatch
):
    """Streaming aggregation: while a plain fit exchange is ``collecting``, each training
    update stays in its spool file and its reply carries a placeholder; the reporting strategy
    checks each, then adds them up a part of each at a time (``streamed_mean``), and the mean
    is bit for bit the one Flower's FedAvg and FedAdam take of the same updates in memory
    (FedMedian, which needs them all, gets them read in). The bytes counted are the updates'
    own. Insiders, each rejected while the others' mean stands: a site writing a placeholder
    itself, one uploading NaNs under a claim of 10**12 examples, one whose array header claims
    a shape that wraps a 64-bit count; a handle names nothing for another node, and no file is
    left after."""
    from dataclasses import replace
    from types import SimpleNamespace

    from flwr.common import ndarrays_to_parameters, parameters_to_ndarrays
    from flwr.server.strategy import FedAdam, FedAvg, FedMedian
    from test_site_outcomes import ROUND

    from fedweave.coordinator.rounds import streamed_mean
    from fedweave.coordinator.rounds.bulk import BulkGrid
    from fedweave.coordinator.rounds.reporting import ReportingStrategy
    from fedweave.coordinator.rounds.site_outcomes import OutcomeGrid, SiteReplies
    from fedweave.coordinator.rounds.spooled_updates import (
        SPOOLED_KEY,
        SPOOLED_STYPE,
        SpooledError,
        SpooledUpdates,
    )
    from fedweave.coordinator.rounds.traffic import Traffic
    from fedweave.flower_patches import message_records as compat

    monkeypatch.setattr(streamed_mean, "MEAN_CHUNK", 999)  # parts of every update, a ragged end
    server, spool, _ = served
    model = [np.linspace(-1, 1, 4000, dtype=np.float32), np.linspace(0, 3, 77, dtype=np.float32)]
    counts = {11: 10, 12: 35, 13: 20, 14: 10, 15: 10**12, 16: 10}

    def wrapped_shape(weights):  # .npy bytes whose header claims 2**62 x 4 floats
        import io

        from numpy.lib import format as npy

        header = io.BytesIO()
        npy.write_array_header_1_0(
            header, {"descr": "<f4", "fortran_order": False, "shape": (2**62, 4)}
        )
        fake = Array(dtype="", shape=(), stype="numpy.ndarray", data=header.getvalue())
        return ArrayRecord(array_dict={"0": fake, "1": _record(weights[1])["0"]})

    trains = {
        15: lambda weights: _record(np.full_like(weights[0], np.nan), weights[1]),
        16: wrapped_shape,
    }

    def tamper(node, reply):
        reply.content.metric_records["fitres.num_examples"]["num_examples"] = counts[node]
        if node == 14:  # no upload; a placeholder of its own making instead
            del reply.content.config_records[BULK_RECEIPT_RECORD]
            reply.content.array_records["fitres.parameters"] = ArrayRecord(array_dict={
                SPOOLED_KEY: Array(dtype="", shape=(), stype=SPOOLED_STYPE, data=b"0" * 32)
            })  # fmt: skip
        return reply

    spooled = SpooledUpdates()
    traffic = Traffic(spooled)
    grid = OutcomeGrid(BulkGrid(_Sites(server, tls, tamper, trains), spool, server.port, spooled),
                       SiteReplies(), traffic)  # fmt: skip
    asked = []
    for node in counts:
        message = instruction(node)
        message.content.array_records["fitins.parameters"] = _record(*model)
        asked.append(message)
    with spooled.collecting():
        replies = grid.send_and_receive(asked, timeout=30)
        assert len(list((spool.root / "held").iterdir())) == 5  # the updates, on disk
        results = [
            (SimpleNamespace(node_id=r.metadata.src_node_id),
             compat.recorddict_to_fitres(r.content, keep_input=True))
            for r in replies
        ]  # fmt: skip
        assert all(len(res.parameters.tensors) == 1 for _, res in results)  # placeholders
        held = dict((proxy.node_id, res) for proxy, res in results)
        with pytest.raises(SpooledError):
            spooled.arrays(held[11].parameters, 12)  # 11's handle names nothing for 12
        in_memory = [
            (proxy, replace(res, parameters=ndarrays_to_parameters(
                spooled.arrays(res.parameters, proxy.node_id))))
            if proxy.node_id not in (14, 16) else (proxy, res)
            for proxy, res in results
        ]  # fmt: skip
        update_bytes = sum(len(t) for t in in_memory[0][1].parameters.tensors)
        assert traffic.of_round(ROUND)[11].train_in == update_bytes  # exact on the new path
        by_strategy = {}
        for name, make in (
            ("fedavg", FedAvg), ("fedmedian", FedMedian),
            ("fedadam", lambda: FedAdam(initial_parameters=ndarrays_to_parameters(model))),
        ):  # fmt: skip
            means = by_strategy[name] = []
            for given, hold in ((results, spooled), (in_memory, None)):
                reporting = ReportingStrategy(make(), evaluator=None, spooled=hold)
                reporting._global, reporting._sampled = [m.copy() for m in model], list(counts)
                parameters, _ = reporting.aggregate_fit(1, given, [])
                means.append(parameters_to_ndarrays(parameters))
                rejected = {s.site_id: s.reason for s in reporting._sites if s.status != "ok"}
                assert sorted(rejected) == ["14", "15", "16"], rejected
                assert "non-finite" in rejected["15"], rejected
            for streamed, whole in zip(*means):
                assert streamed.dtype == whole.dtype
                np.testing.assert_array_equal(streamed, whole)
        # FedAvg's mean of each site's model + its node id, weighed by the counts
        expected = model[1] + sum(n * c for n, c in counts.items() if n < 14) / 65
        np.testing.assert_allclose(by_strategy["fedavg"][0][1], expected, atol=1e-5)
    assert not list((spool.root / "held").iterdir())


def test_a_message_without_a_ticket_passes_the_site_mod_untouched():
    from fedweave.client.bulk_mod import bulk_transfers

    message = instruction(11)
    message.content.array_records["fitins.parameters"] = _record(np.ones(3, np.float32))
    context = Context(run_id=1, node_id=11, state=RecordDict(), run_config={}, node_config={})
    seen = []
    reply = bulk_transfers(message, context, lambda m, c: seen.append(m) or Message(
        fit_result(), reply_to=m))  # fmt: skip
    assert seen == [message] and BULK_RECEIPT_RECORD not in reply.content


class _Jobs(_Sites):
    """FedBuff's way: messages pushed, replies pulled later (one job a site)."""

    def __init__(self, server, tls) -> None:
        super().__init__(server, tls)
        self.pending: dict[str, Message] = {}

    def push_messages(self, messages):
        ids = []
        for message in messages:
            message.metadata.__dict__["_message_id"] = f"job{message.metadata.dst_node_id}"
            (reply,) = self.send_and_receive([message])
            self.pending[message.metadata.message_id] = reply
            ids.append(message.metadata.message_id)
        return ids

    def pull_messages(self, message_ids):
        return [self.pending.pop(i) for i in message_ids if i in self.pending]


def test_pushed_jobs_and_pulled_replies_move_their_tensors_too(served, tls):
    from fedweave.coordinator.rounds.bulk import BulkGrid

    server, spool, _ = served
    grid = BulkGrid(_Jobs(server, tls), spool, server.port)
    ids = []
    for node in (21, 22):
        message = instruction(node)
        message.content.array_records["fitins.parameters"] = _record(np.ones(10, np.float32))
        ids += grid.push_messages([message])
        assert "fitins.parameters" in message.content.array_records  # given back once pushed
    assert len(list((spool.root / "grants").iterdir())) == 2  # live until their reply comes
    replies = grid.pull_messages(ids)
    for reply in replies:
        got = reply.content.array_records["fitres.parameters"]["0"].numpy()
        np.testing.assert_array_equal(got, np.full(10, 1 + reply.metadata.src_node_id))
    assert not list((spool.root / "grants").iterdir())


def test_a_peer_that_trickles_its_hello_or_headers_is_cut_off(served, tls, monkeypatch):
    """An outsider holding connections open (no TLS hello, or a TLS connection whose request
    never ends) cannot keep the sites' transfers waiting: each is closed at the deadline."""
    server, spool, _ = served
    monkeypatch.setattr(bulk_server, "HELLO_DEADLINE_S", 0.5)
    silent = socket.create_connection(("127.0.0.1", server.port), timeout=10)
    context = ssl.create_default_context(cafile=str(tls.ca_cert))
    raw = socket.create_connection(("127.0.0.1", server.port), timeout=10)
    trickling = context.wrap_socket(raw, server_side=False, server_hostname="127.0.0.1")
    trickling.sendall(b"GET /v1/blobs/x HTTP/1.1\r\nHost: x\r\n")  # and never the end
    started = time.monotonic()
    for sock in (silent, trickling):
        with sock:
            try:
                assert sock.recv(100) == b""
            except (ConnectionResetError, ssl.SSLError):
                pass
    assert time.monotonic() - started < 5
    blob = encoded({"p": _record(np.ones(10, np.float32))})
    digest = spool.put_blob(blob)
    token = spool.grant(5, [digest], 0, 60)
    for _ in range(bulk_server.MAX_FETCHES):  # a retry or two, then no more
        assert _link(server, token, tls).fetch(digest, len(blob)) == blob
    with pytest.raises(TransferError, match="429"):
        _link(server, token, tls).fetch(digest, len(blob))


def test_masked_vectors_stay_in_their_files_until_the_collect_stage_adds_them_up(served, tls):
    """SecAgg+ with ``--bulk-address``: while the collect stage is ``collecting_vectors``, each
    site's masked vector stays in its upload's file and its reply carries placeholders with the
    shapes the file's headers declare, which the layout check reads; the stage's sum, read a
    part of each file at a time, is the sum of the vectors the sites sent, and the bytes
    counted are theirs. Insiders, each failed alone before any sum: a site writing
    placeholders itself, and one whose vector is floats. No file is left after."""
    from flwr.app import ConfigRecord
    from flwr.common.secure_aggregation.secaggplus_constants import Key, Stage
    from test_site_outcomes import ROUND

    from fedweave.bulk.array_parts import UpdateInMemory
    from fedweave.bulk.spool import HELD_STYPE
    from fedweave.coordinator.rounds.bulk import BulkGrid
    from fedweave.coordinator.rounds.site_outcomes import OutcomeGrid, SiteReplies
    from fedweave.coordinator.rounds.spooled_updates import SpooledUpdates
    from fedweave.coordinator.rounds.traffic import Traffic
    from fedweave.flower_patches import secagg_sum
    from fedweave.flower_patches.message_records import RECORD_KEY_CONFIGS
    from fedweave.flower_patches.secagg_vectors import MASKED_VECTOR_RECORD, vector_as_arrays

    server, spool, _ = served
    rng = np.random.default_rng(3)
    vectors = {
        node: [np.array([7 + node], np.int64), rng.integers(0, 2**32, 3000).astype(np.uint32)]
        for node in (11, 12, 13, 14)
    }
    vectors[14][1] = vectors[14][1].astype(np.float32)  # not integers: refused by its layout

    def answer(node, msg):
        content = fit_result()
        content.config_records[RECORD_KEY_CONFIGS] = ConfigRecord(
            {Key.MASKED_PARAMETERS: [ndarray_to_bytes(a) for a in vectors[node]]}
        )
        return vector_as_arrays(Message(content, reply_to=msg)).content

    def tamper(node, reply):
        if node == 13:  # no upload; placeholders of its own making, shaped like the others'
            del reply.content.config_records[BULK_RECEIPT_RECORD]
            reply.content.array_records["fitres.parameters"] = ArrayRecord()
            reply.content.array_records[MASKED_VECTOR_RECORD] = ArrayRecord(array_dict={
                str(i): Array(dtype="uint32", shape=a.shape, stype=HELD_STYPE, data=b"0" * 32)
                for i, a in enumerate(vectors[11])
            })  # fmt: skip
        return reply

    spooled = SpooledUpdates()
    traffic = Traffic(spooled)
    sites = _Sites(server, tls, tamper, answer=answer)
    grid = OutcomeGrid(BulkGrid(sites, spool, server.port, spooled), SiteReplies(), traffic,
                       held=spooled.vector_layout)  # fmt: skip
    asked = []
    for node in vectors:
        message = instruction(node)
        message.content.config_records[RECORD_KEY_CONFIGS] = ConfigRecord(
            {Key.STAGE: Stage.COLLECT_MASKED_VECTORS}
        )
        message.content.array_records["fitins.parameters"] = _record(np.zeros(10, np.float32))
        asked.append(message)
    with spooled.collecting_vectors():
        replies = {r.metadata.src_node_id: r for r in grid.send_and_receive(asked, timeout=30)}
        assert len(list((spool.root / "held").iterdir())) == 2  # 11's and 12's, on disk
        assert replies[13].has_error()
        assert "a placeholder for nothing the coordinator holds" in replies[13].error.reason
        assert replies[14].has_error() and "not integers" in replies[14].error.reason
        total = None
        for node in (11, 12):
            record = replies[node].content.array_records[MASKED_VECTOR_RECORD]
            assert all(array.stype == HELD_STYPE for array in record.values())
            assert traffic.of_round(ROUND)[node].train_in == sum(
                len(ndarray_to_bytes(a)) for a in vectors[node]
            )  # the vector's own bytes
            assert spooled.vector_source(replies[11 if node == 12 else 12]) is not None
            source = spooled.vector_source(replies[node])
            try:
                total = secagg_sum.masked_sum(total, source)
            finally:
                source.close()
        expected = secagg_sum.masked_sum(None, UpdateInMemory(vectors[11]))
        expected = secagg_sum.masked_sum(expected, UpdateInMemory(vectors[12]))
        assert all(np.array_equal(t, e) for t, e in zip(total, expected))
    assert not list((spool.root / "held").iterdir())


def test_a_site_fetches_while_a_hundred_connections_trickle_their_hello(served, tls):
    """The review's attack: 70 connections sending nothing (the TLS hello never comes) held
    every slot, and 17 of 19 honest fetches failed. A new connection now evicts the oldest
    still without its headers, so every fetch is served, at once."""
    server, spool, _ = served
    blob = encoded({"p": _record(np.ones(10, np.float32))})
    digest = spool.put_blob(blob)
    slow = [socket.create_connection(("127.0.0.1", server.port), timeout=10) for _ in range(100)]
    try:
        for _ in range(5):
            token = spool.grant(5, [digest], 0, 60)
            started = time.monotonic()
            assert _link(server, token, tls).fetch(digest, len(blob)) == blob
            assert time.monotonic() - started < 3
    finally:
        for sock in slow:
            sock.close()
