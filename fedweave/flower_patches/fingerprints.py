"""Fingerprints of the Flower code each security patch wraps, so a patch never lands on code
it was not written against.

The version guard (``PATCHED_FLOWER_VERSION``) catches a different release; a fingerprint
also catches an edited or vendored copy of the same version. Each entry is the SHA-256 (first
16 hex digits) of ``inspect.getsource`` of one Flower function, taken from flwr 1.41.0.
"""

from __future__ import annotations

import hashlib
import importlib
import inspect

WRAPPED: dict[str, dict[str, str]] = {
    "admin_apis": {
        "flwr.superlink.main:_get_middleware": "acdbc2dce1520f8f",
        "flwr.superlink.main:create_app": "ee966b630c8ba8b5",
    },
    "run_bundles": {
        "flwr.superlink.servicer.control.control_handlers:start_run": "7f9355f11d8a76fc",
        "flwr.superlink.routers.control.router:start_run": "b2ba60f841634a30",
    },
    "refused_keys": {
        "flwr.superlink.servicer.fleet.fleet_handlers:activate_node": "0370edbbeb924eac",
        "flwr.superlink.routers.fleet.router:fleet_activate_node": "edb39539bc1a345a",
    },
    "tls_suites": {
        "flwr.superlink.cli.flower_superlink:_run_superlink_http_api": "eb0d78b85f999576",
    },
}
"""Patch name → {``module:function`` it relies on → fingerprint of that function's source}."""


def fingerprint(ref: str) -> str:
    """The fingerprint of ``module:function`` as installed (its source's SHA-256, 16 digits)."""
    module_name, _, name = ref.partition(":")
    target = getattr(importlib.import_module(module_name), name)
    target = getattr(target, "__wrapped__", target)
    return hashlib.sha256(inspect.getsource(target).encode()).hexdigest()[:16]


def mismatches(patch: str) -> list[str]:
    """The functions ``patch`` wraps whose installed source differs from what it was written
    against (empty: safe to apply)."""
    found = []
    for ref, expected in WRAPPED[patch].items():
        try:
            actual = fingerprint(ref)
        except (ImportError, AttributeError, OSError, TypeError):
            actual = "missing"
        if actual != expected:
            found.append(ref)
    return found
