"""The SuperLink notes every site key it refuses, for the coordinator's console (applied in
its process by ``fedweave.flower_patches.launch``).

With site authentication, a SuperNode whose key is not registered (never added, or revoked)
fails ``ActivateNode``; Flower logs it at DEBUG level in its own words and the operator sees
nothing. This wraps Flower's handler: a refusal whose key names no node appends one JSON
line, ``{"time": ..., "fingerprint": "SHA256:..."}``, to the file named by
``FEDWEAVE_REFUSED_KEYS_FILE`` (set by ``fedweave coordinator``), which the coordinator reads
(``coordinator.refused_keys``). Structured data in a file fedweave owns, not Flower's log.
"""

from __future__ import annotations

import json
import os
import time

REFUSED_KEYS_FILE_ENV = "FEDWEAVE_REFUSED_KEYS_FILE"


def ssh_fingerprint(pem_public_key: bytes) -> str:
    """``SHA256:...`` (as ``ssh-keygen -l`` and ``fedweave sites list`` print it) of a key in
    Flower's PEM form; ``unreadable`` for anything else."""
    from cryptography.hazmat.primitives import serialization

    from fedweave.certs import key_fingerprint

    try:
        key = serialization.load_pem_public_key(pem_public_key)
        ssh = key.public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
    except (ValueError, TypeError):
        return "unreadable"
    return key_fingerprint(ssh)


def note_refusal(path: str, public_key: bytes) -> None:
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

    def activate_node(request, state):  # Flower's signature
        if path and state.get_node_id_by_public_key(request.public_key) is None:
            note_refusal(path, bytes(request.public_key))
        return stock(request, state)

    activate_node.fedweave_patch = True  # type: ignore[attr-defined]
    fleet_handlers.activate_node = activate_node
