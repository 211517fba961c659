"""The SuperLink's TLS offers AEAD cipher suites only (applied in the coordinator's SuperLink
process by ``fedweave.flower_patches.launch``).

Flower 1.41 hands its certificate files to ``uvicorn.run`` and leaves the suites at uvicorn's
default (``TLSv1``: OpenSSL's whole default list, so TLS 1.2 still offered CBC-SHA2 suites).
fedweave passes uvicorn's own ``ssl_ciphers`` and ``ssl_context_factory`` settings: TLS 1.2
with ECDHE key exchange and AES-GCM or ChaCha20-Poly1305 only, TLS 1.3 (all AEAD) as is,
nothing older than TLS 1.2.
"""

from __future__ import annotations

import ssl
from types import SimpleNamespace
from typing import Any

AEAD_TLS12_CIPHERS = "ECDHE+AESGCM:ECDHE+CHACHA20:!aNULL:!eNULL"
"""OpenSSL cipher string for TLS 1.2 (TLS 1.3 suites are set apart by OpenSSL and all AEAD)."""


def aead_context(config: Any, default_factory) -> ssl.SSLContext:
    """uvicorn's ``ssl_context_factory``: its own context, then no TLS below 1.2."""
    context = default_factory()
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    return context


def install() -> None:
    import importlib

    # the package's name ``flower_superlink`` is the entry function; the module holds uvicorn
    flower_superlink = importlib.import_module("flwr.superlink.cli.flower_superlink")

    if getattr(flower_superlink.uvicorn, "fedweave_patch", False):
        return
    stock = flower_superlink.uvicorn

    def run(*args: Any, **kwargs: Any) -> None:
        if kwargs.get("ssl_certfile"):
            kwargs.setdefault("ssl_ciphers", AEAD_TLS12_CIPHERS)
            kwargs.setdefault("ssl_context_factory", aead_context)
        stock.run(*args, **kwargs)

    # Only the SuperLink module's name ``uvicorn`` is replaced, not uvicorn itself.
    flower_superlink.uvicorn = SimpleNamespace(run=run, fedweave_patch=True)
