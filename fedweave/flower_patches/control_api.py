"""The SuperLink's Control API as the coordinator calls it, and the Flower App Bundle it
submits (not a patch: Flower's unexported client, messages and bundle builder, used as they
are, for ``fedweave.coordinator.command.superlink``).

Flower 1.41 starts runs and registers nodes through its ``flwr`` CLI and ``~/.flwr`` config;
the coordinator calls the Control API itself (``StartRun`` as ``flwr run`` does), with
Flower's ``ControlHttpClient``, the request messages of ``flwr.proto.control_pb2``, its FAB
serialization (``Fab``, ``fab_to_proto``), its bundle builder (``build_fab_from_files``) and
its key encoding (``public_key_to_bytes``: how the SuperLink stores a site key, compared
byte for byte with what it lists). None of these is exported.

All fingerprinted (``fingerprints``, entry ``control_api``: ``control_pb2`` whole, since the
wire's field names and numbers are its generated source); this module refuses to be imported
on Flower code that differs (``rely_on``), and the coordinator checks it before it starts
anything (``internal_use_problem``).
"""

from __future__ import annotations

import hashlib
from typing import Any

from fedweave.flower_patches import rely_on

rely_on("control_api")

from flwr.cli.build import build_fab_from_files  # noqa: E402
from flwr.common.serde import fab_to_proto  # noqa: E402
from flwr.proto.control_pb2 import (  # noqa: E402
    ListNodesRequest,
    ListRunsRequest,
    RegisterNodeRequest,
    StartRunRequest,
    StopRunRequest,
    StreamLogsRequest,
    UnregisterNodeRequest,
)
from flwr.supercore.control import ControlHttpClient  # noqa: E402
from flwr.supercore.fab import Fab  # noqa: E402
from flwr.supercore.primitives.asymmetric import public_key_to_bytes  # noqa: E402

__all__ = [
    "ListNodesRequest",
    "ListRunsRequest",
    "RegisterNodeRequest",
    "StopRunRequest",
    "StreamLogsRequest",
    "UnregisterNodeRequest",
    "bundle",
    "control_client",
    "flower_public_key",
    "start_run_request",
]


def control_client(address: str, root_certificates: bytes | None) -> Any:
    """Flower's Control API client for ``address`` (TLS with ``root_certificates``, else
    plain), without interceptors: the coordinator calls from its own machine."""
    return ControlHttpClient.from_server_address(
        server_address=address,
        insecure=root_certificates is None,
        root_certificates=root_certificates,
        interceptors=[],
    )


def start_run_request(fab_bytes: bytes) -> StartRunRequest:
    """``StartRun``'s request carrying the bundle ``fab_bytes`` (hashed as Flower hashes it)."""
    fab = Fab(hashlib.sha256(fab_bytes).hexdigest(), fab_bytes, {})
    return StartRunRequest(fab=fab_to_proto(fab))


def flower_public_key(key: Any) -> bytes:
    """A site's public key (a ``cryptography`` key object) as the SuperLink stores it."""
    return public_key_to_bytes(key)


def bundle(files: dict[str, bytes]) -> bytes:
    """A Flower App Bundle of ``files`` (path → content), as ``flwr build`` makes one."""
    return build_fab_from_files(files)[0]
