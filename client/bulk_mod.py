"""The site mod of a direct transfer (``fedweave coordinator --bulk-address``): it fetches the
tensors an instruction names from the coordinator's transfer server, and uploads the reply's.

It sits just inside the mod that turns outcomes into replies, outside everything else: every
later mod and the site's task see the message as Flower would have delivered it, and the reply
leaves with its tensors replaced by the server's receipt (``BULK_RECEIPT_RECORD``) after every
mod has made it (SecAgg+'s masked vector included). A transfer that fails (the coordinator
unreachable, a blob that does not hash to its digest, a refused token) is this site's failure,
with the reason, and nothing is trained on what did not arrive whole.
"""

from __future__ import annotations

from pathlib import Path

from flwr.app import ConfigRecord, Context, Message

from fedweave.addresses import parse_host_port
from fedweave.bulk.records import BlobError, encoded_parts
from fedweave.bulk.transfer import Link, TransferError
from fedweave.contract import (
    BULK_RECEIPT_RECORD,
    BULK_TICKET_RECORD,
    NODE_CA_CERT_KEY,
    NODE_COORDINATOR_KEY,
    SiteRefusal,
)
from fedweave.errors import UserError
from fedweave.flower_patches.message_records import ClientAppCallable

MAX_FETCH_BYTES = 64 << 30
"""The largest blob a site fetches (a model of some 16 billion float32 parameters)."""


class TransferFailed(Exception):
    """A direct transfer that did not complete (the site's ``failed`` outcome)."""


def bulk_transfers(msg: Message, context: Context, call_next: ClientAppCallable) -> Message:
    """``msg`` with the tensors its ticket names fetched; its reply's tensors uploaded."""
    ticket = msg.content.config_records.get(BULK_TICKET_RECORD)
    if ticket is None:
        return call_next(msg, context)
    link = _link(ticket, context)
    names, fetch = list(ticket.get("records", [])), list(ticket.get("fetch", []))
    if len(names) != len(fetch):
        raise SiteRefusal("the instruction's transfer ticket is malformed; run the same "
                          "fedweave version at the coordinator and this site")  # fmt: skip
    del msg.content.config_records[BULK_TICKET_RECORD]
    for name, reference in zip(names, fetch):
        digest, size = _reference(str(reference))
        try:
            records = link.fetch_records(digest, size)
        except (TransferError, BlobError) as exc:
            raise TransferFailed(f"the model did not arrive: {exc}") from None
        if set(records) != {name}:
            raise TransferFailed("the fetched blob holds other records than the ticket names")
        msg.content.array_records[name] = records[name]
    reply = call_next(msg, context)
    if reply.has_error():
        return reply
    uploaded = {name: r for name, r in reply.content.array_records.items() if len(r)}
    if not uploaded:
        return reply  # an empty record (SecAgg+'s fitres.parameters) stays where Flower reads it
    try:
        receipt = link.upload(encoded_parts(uploaded))
    except TransferError as exc:
        raise TransferFailed(f"the update did not reach the coordinator: {exc}") from None
    for name in uploaded:
        del reply.content.array_records[name]
    reply.content.config_records[BULK_RECEIPT_RECORD] = ConfigRecord({
        "upload": str(receipt.get("upload", "")), "digest": str(receipt.get("digest", "")),
        "size": int(receipt.get("size", 0)),
    })  # fmt: skip
    return reply


def _link(ticket: ConfigRecord, context: Context) -> Link:
    ca = str(context.node_config.get(NODE_CA_CERT_KEY, ""))
    try:
        port, token = int(ticket["port"]), str(ticket["token"])
    except (KeyError, TypeError, ValueError):
        raise SiteRefusal("the instruction's transfer ticket is malformed") from None
    try:
        host, _ = parse_host_port(str(context.node_config.get(NODE_COORDINATOR_KEY, "")),
                                  "--coordinator")  # fmt: skip
    except UserError:
        raise SiteRefusal("the coordinator sends tensors directly but this site's node config "
                          "does not name it; start the site with fedweave client") from None
    return Link(host, port, token, Path(ca) if ca else None)


def _reference(reference: str) -> tuple[str, int]:
    digest, _, size = reference.partition(":")
    if len(digest) != 64 or not size.isdigit() or int(size) > MAX_FETCH_BYTES:
        raise SiteRefusal(f"the instruction names a model it cannot send ({reference[:80]})")
    return digest, int(size)
