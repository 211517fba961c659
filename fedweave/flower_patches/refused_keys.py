"""The SuperLink notes every site key it refuses, for the coordinator's console (applied in
its process by ``fedweave.flower_patches.launch``).

With site authentication, a SuperNode whose key is not registered (never added, or revoked)
fails ``ActivateNode``; Flower logs it at DEBUG level in its own words and the operator sees
nothing. This wraps Flower's handler: the first refusal of a key that names no node (since
it last activated a node, so a key refused, then registered, then revoked is noted twice) appends
one JSON line, ``{"time": ..., "fingerprint": "SHA256:..."}``, to the file named by
``FEDWEAVE_REFUSED_KEYS_FILE`` (set by ``fedweave coordinator``), which the coordinator reads
(``coordinator/command/refused_key_notices.py``). Structured data in a file fedweave owns, not
Flower's log.

While the coordinator has not yet registered its sites' keys (it does so over the Control API
just after the SuperLink starts listening, on the port the sites use), an unknown key is
answered 503 instead of refused: the file named by ``FEDWEAVE_KEYS_SYNCED_FILE`` does not exist
yet. Flower's SuperNode retries a 503 as it retries an unreachable SuperLink, and ``fedweave
client`` says the coordinator is still registering its sites' keys, so a site started together
with its coordinator (``docker compose up``, a loaded host) is not turned away. From the file's
first sight on, an unknown key is refused at once, as before.
"""

from __future__ import annotations

import json
import os
import time

REFUSED_KEYS_FILE_ENV = "FEDWEAVE_REFUSED_KEYS_FILE"
KEYS_SYNCED_FILE_ENV = "FEDWEAVE_KEYS_SYNCED_FILE"
"""Names a file the coordinator creates once its first registration of site keys is done; unset
(no site authentication, or a SuperLink not started by ``fedweave coordinator``): no wait."""
KEYS_STILL_REGISTERING_STATUS = 503
"""HTTP status of a site's ``ActivateNode`` until that file exists: Flower's SuperNode retries
it, and ``fedweave client`` says the coordinator is still registering its sites' keys instead of
taking it for a refusal of its key."""

MAX_NOTED_KEYS = 1000
"""Distinct keys noted: anyone holding the CA certificate can sign with fresh keys, so the
notes file must not grow with what an outsider sends."""


def ssh_fingerprint(pem_public_key: bytes) -> str:
    """``SHA256:...`` (as ``ssh-keygen -l`` and ``fedweave sites list`` print it) of a key in
    Flower's PEM form; ``unreadable`` for anything else."""
    from cryptography.hazmat.primitives.serialization import load_pem_public_key

    from fedweave.certs import public_key_fingerprint

    try:
        return public_key_fingerprint(load_pem_public_key(pem_public_key))
    except (ValueError, TypeError):
        return "unreadable"


def note_refusal(path: str, public_key: bytes, noted: set[bytes]) -> None:
    """Append ``public_key``'s refusal to ``path`` once (``noted``: keys already written),
    for at most ``MAX_NOTED_KEYS`` keys."""
    if public_key in noted or len(noted) >= MAX_NOTED_KEYS:
        return
    noted.add(public_key)
    line = json.dumps({"time": time.time(), "fingerprint": ssh_fingerprint(public_key)})
    try:
        with open(path, "a", encoding="utf-8") as out:
            out.write(line + "\n")
    except OSError:
        pass  # a note for the console; the refusal itself stands either way


def install() -> None:
    from flwr.superlink.servicer.fleet import fleet_handlers

    stock = fleet_handlers.activate_node
    if getattr(stock, "fedweave_patch", False):
        return
    path = os.environ.get(REFUSED_KEYS_FILE_ENV)
    synced_file = os.environ.get(KEYS_SYNCED_FILE_ENV)
    synced = not synced_file
    noted: set[bytes] = set()

    def activate_node(request, state):  # Flower's signature
        nonlocal synced
        key = bytes(request.public_key)
        unknown = state.get_node_id_by_public_key(request.public_key) is None
        if unknown and not synced:
            synced = os.path.exists(synced_file)  # once there, it stays: no more looks
            if not synced:
                from fastapi import HTTPException

                raise HTTPException(
                    KEYS_STILL_REGISTERING_STATUS, "the coordinator is registering its sites' keys",
                    headers={"Retry-After": "1"},
                )  # fmt: skip
        if not path:
            pass
        elif unknown:
            note_refusal(path, key, noted)
        else:
            # Registered now: a later refusal (the key revoked) is news and noted again. Only
            # the operator registers keys, so an outsider cannot make this repeat.
            noted.discard(key)
        return stock(request, state)

    activate_node.fedweave_patch = True  # type: ignore[attr-defined]
    fleet_handlers.activate_node = activate_node
