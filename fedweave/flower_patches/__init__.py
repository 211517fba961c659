"""Every change fedweave makes to Flower's internals, behind one version guard.

Everything in fedweave that touches a Flower private name (replaces a module attribute or a
method, writes an object's ``__dict__``, overrides an internal stage, edits an internal state
object), and every import of a Flower module or name that Flower does not export, lives in
this folder: elsewhere fedweave imports only the names Flower's public packages list in their
``__all__`` (``tests/test_layout.py``, ``FLOWER_PUBLIC``). Each such patch or use is written
for the exact Flower version ``PATCHED_FLOWER_VERSION`` (the one ``pyproject.toml`` pins), and
every Flower function or class it replaces or relies on is fingerprinted (``fingerprints``: a
Flower upgrade fails ``tests/test_flower_patches.py`` with the names of what changed). On any
other version, or on Flower code whose fingerprint differs:

- a patch that only makes things faster is skipped with one warning, and Flower's stock code
  runs (``simulation_engine``, ``deployed_polling``; the site's ClientApp worker);
- a patch that fixes a fault, or that the other side of a connection relies on, refuses to
  start with one line naming the Flower version needed and why: the security patches, the
  correctness patches ``supernode_waits`` (a site left deaf to every later message),
  ``supernode_state`` (the site's connection state as data) and ``node_restarts`` (a
  restarted site refused for up to 60 s), SecAgg+'s masks and crypto (a site and a
  coordinator must draw the same masks, so silently falling back to Flower's
  generator would corrupt every sum) and running SecAgg+ stage by stage (``secagg_stages``);
- a use of Flower's unexported names that a feature's correctness relies on refuses the same
  way, as its module is imported and before the coordinator or the site starts anything
  (``INTERNAL_USES``: ``message_records``, ``default_workflow``, ``control_api``).

``FEDWEAVE_STOCK_FLOWER=1`` skips the speed-ups only (to compare, or to rule one out when
debugging; ``bench/bench_deployment.py --systems fedweave-unpatched`` uses it); the other
patches apply whatever it says.

The patches, and why each exists:

``simulation_engine``
    Flower's simulation engine waits on two fixed 100 ms polls per message round trip, its
    dispatcher scans every stored instruction once per simulated site per poll (driver CPU
    grew with the total number of sites), and it pickles the ClientApp loader anew for every
    message; fedweave polls every 5 ms, scans once a poll, and ships the loader once
    (docs/benchmarks.md).
``superlink_middleware``
    Flower's SuperLink passes every request through nine Starlette ``BaseHTTPMiddleware``
    layers, each costing a task group and memory streams even when it only calls the next;
    six act on Control API requests only or only with a plugin configured. fedweave skips a
    layer for a request it would pass through untouched, so a site's request crosses three.
``deployed_polling``
    A deployed ServerApp pulls replies every 3 s; fedweave's polls every 0.2 s through the
    grid's public API, so a message round trip no longer waits seconds for nothing.
``supernode_waits`` (correctness: never skipped)
    A site's SuperNode waits without limit for its ClientApp's reply, so one that died
    without replying left the site deaf to every later message; fedweave stops waiting once
    no ClientApp is alive to reply. The same patch caps the SuperNode's 3 s idle sleeps at
    0.2 s while the site is busy, 1 s once it has had no message for 10 s (a speed-up that
    comes with it).
``supernode_state`` (correctness: never skipped)
    Flower's SuperNode says whether it connected, was refused, retries or saw a run end in
    its log only, in words a release may change; the site decided from that text. fedweave
    wraps the SuperNode's connection, its retry handlers and its message pull so that each
    of these is appended as a JSON line (HTTP status, Flower's error code, the ``ssl``
    exception, the run id) to a file the site reads; the log is for people.
``node_restarts`` (correctness: never skipped)
    With site authentication, a site killed and started again at once was refused for up to
    60 s (its node stayed "online" until its heartbeat lapsed) and rounds meanwhile sampled
    its dead node; the SuperLink now lets the key's holder activate its online node again.
``task_expiry``
    A site's SuperNode answers a message with "ClientApp stopped responding" once its task's
    heartbeat lapses: 60 s in Flower 1.41, so a worker killed mid-message held its round for
    a minute. fedweave's worker beats every 3.5 to 4.5 s and the SuperNode of a site that runs
    it (``--isolation process``) lets a task go 20 s without a beat.
``clientapp_worker`` (not a patch: Flower's own per-message functions of this version, for
    ``fedweave.client.worker``; a speed-up, ``clientapp_worker_usable``)
    A site's SuperNode starts a new ``flwr-clientapp`` process per message (~7 s on 2 cores);
    fedweave's site runs the SuperNode with ``--isolation process`` and one long-lived worker
    with torch, the task and the data already loaded. Its pull sets Flower's ``TaskIdentity``
    and the message id in ``Metadata.__dict__`` as ``flwr-clientapp`` does. The worker's
    Runtime API client, task claims, heartbeat and error replies (Flower's ``supercore``
    runtime, interceptors, retry and heartbeat, ``runtime_pb2``) come from here too.
``message_records`` (not a patch: unexported names used as they are; refuses)
    Flower's legacy message layout (``recorddict_compat``: ``FitIns``/``FitRes``/... to and
    from a message's records), the record keys that ask its mods for SecAgg+ and clipping,
    its ``Mod`` and ``ClientAppCallable`` types and its ``ErrorCode``: the site's mods and the
    coordinator's rounds read and write every message with them.
``default_workflow`` (not a patch: unexported names used as they are; refuses)
    The records ``DefaultWorkflow`` keeps in the context (round number, global model) that the
    coordinator's own workflows read and write, ``default_fit_workflow`` (wrapped by the
    round deadline), and ``ClientProxy``/``GridClientProxy`` (the strategies' site type; the
    secure buffers build proxies as ``DefaultWorkflow`` does).
``control_api`` (not a patch: unexported names used as they are; refuses)
    The coordinator registers site keys, starts runs and follows them through Flower's
    ``ControlHttpClient`` and ``control_pb2`` requests, with a bundle built by Flower's
    ``build_fab_from_files`` (``fedweave.coordinator.command.superlink``).
``secagg_stages`` (not a patch: Flower's SecAgg+ workflow run stage by stage; refuses)
    ``coordinator/rounds/deadlines.py`` holds SecAgg+ rounds to their deadline by choosing each
    stage's wait; ``StagedSecAggPlusWorkflow`` overrides the workflow's four stage methods,
    sets its ``timeout`` before each, and takes the sites that sent no keys out of its
    internal ``WorkflowState`` (Flower's unmasking stage otherwise halts the round).
``secagg_vectors`` (with ``secagg_masks`` and ``secagg_stages``: refuses with them)
    Flower's ``secaggplus_mod`` returns a site's masked vector as byte strings in a
    ConfigRecord, which Flower serialises and hashes whole, twice, as the reply leaves (2.5 s
    for a 68 MB vector on this 2-core machine, against 0.14 s as an ArrayRecord); the site
    sends it in an ArrayRecord, and the coordinator's collect stage puts it back where Flower
    reads it, after its grid has failed any site whose vector NumPy cannot read or that is
    laid out otherwise than most sites' (one such vector used to halt the round for everyone).
``secagg_masks``
    SecAgg+'s mask generator seeds NumPy's Mersenne Twister with a 32-bit fold of a 256-bit
    seed (slow, and brute-forceable); fedweave uses AES-256-CTR keyed by the whole seed, and
    quantizes into one flat uint32 vector with rounding seeded by the update (a seeded run
    repeats exactly).
``admin_apis``, ``run_bundles``, ``tls_suites``, ``refused_keys`` (security: never skipped)
    Flower 1.41 serves its Control and Runtime APIs on the sites' public address with no
    authentication, accepts any app bundle in ``StartRun``, and offers CBC suites in TLS 1.2.
    fedweave answers the administrative APIs to the coordinator's own machine only, starts
    only runs of its own apps, offers AEAD suites only, and notes each refused site key for
    the coordinator's console (Flower logs it at DEBUG level). These refuse to run on another
    Flower version or on Flower code whose fingerprint differs (``fingerprints``): the
    coordinator then stops with the reason rather than serve an open SuperLink.
``secagg_crypto``
    SecAgg+'s Shamir sharing goes through PyCryptodome's string-building GF(2^128)
    arithmetic (~6 ms to split a secret at a site, ~45 ms to rebuild one at the coordinator,
    per site and round), and its key agreement runs on NIST P-384 (0.35 ms an exchange, two
    per neighbour a round) after loading the site's key from PEM each time. fedweave computes
    the same shares with shifts and XORs, caches the Lagrange coefficients, makes keys on
    P-256 (0.05 ms) and keeps them loaded. Every site of a round must use the same curve, so
    this is installed, and refused, with the masks.
"""

from __future__ import annotations

import logging
import os
import sys

from fedweave.errors import UserError

PATCHED_FLOWER_VERSION = "1.42.0"

log = logging.getLogger("fedweave.flower_patches")
_warned: set[str] = set()
_applied: set[str] = set()


def installed_flower_version() -> str:
    """The running Flower's version: ``flwr.__version__`` once Flower is imported, else its
    package metadata, which Flower's own ``__version__`` reads (importing Flower to ask
    costs a process ~0.5 s)."""
    if "flwr" not in sys.modules:
        from importlib.metadata import version

        return version("flwr")
    return str(sys.modules["flwr"].__version__)


def flower_is_patchable() -> bool:
    """Whether the installed Flower is the version every patch here was written for."""
    return installed_flower_version() == PATCHED_FLOWER_VERSION


def _changed(patch: str) -> list[str]:
    """The Flower functions ``patch`` relies on whose source differs from 1.42.0's (checked
    before the patch is applied; ``fingerprints``)."""
    from fedweave.flower_patches.fingerprints import mismatches

    return mismatches(patch)


def _warn_once(patch: str, consequence: str) -> None:
    if patch in _warned:
        return
    _warned.add(patch)
    changed = _changed(patch) if flower_is_patchable() else []
    log.warning(
        "flwr %s installed, fedweave's '%s' patch is for %s%s only: %s",
        installed_flower_version(),
        patch,
        PATCHED_FLOWER_VERSION,
        f" as released (changed here: {', '.join(changed)})" if changed else "",
        consequence,
    )


def tune_simulation_engine() -> bool:
    """Less overhead per message in Flower's in-process simulation engine; False (stock code)
    elsewhere."""
    return _apply_speedup(
        "simulation_engine", "simulations run with Flower's stock polls and dispatcher"
    )


def tune_superlink_middleware() -> bool:
    """The SuperLink's HTTP middleware layers run only for the requests they act on; False
    (stock: every layer on every request) elsewhere."""
    return _apply_speedup(
        "superlink_middleware", "every SuperLink request passes all nine middleware layers"
    )


def quick_task_expiry() -> bool:
    """In a site's SuperNode whose ClientApps run in fedweave's worker: a task without a
    heartbeat for 20 s has ended, so a dead worker's message is answered as failed within
    about 20 s; False (stock: 60 s) elsewhere."""
    return _apply_speedup(
        "task_expiry", "a dead ClientApp worker's message is answered as failed after 60 s"
    )


def tune_deployed_polling() -> bool:
    """The deployed ServerApp polls for replies every 0.2 s; False (stock 3 s) elsewhere."""
    return _apply_speedup("deployed_polling", "the ServerApp polls for replies every 3 s")


CORRECTNESS_PATCHES: dict[str, str] = {
    "supernode_waits": "without it a site whose ClientApp ends without replying stays deaf to "
    "every later message",
    "node_restarts": "without it a restarted site is refused for up to 60 s and rounds "
    "sample its dead node",
    "supernode_state": "without it a site cannot tell connected, refused, retrying and a "
    "finished run apart",
}
"""Patches that fix a fault of Flower 1.41 → what goes wrong without them. Applied whatever
``FEDWEAVE_STOCK_FLOWER`` says; on another Flower version, or on Flower code whose
fingerprint differs, they refuse to start (``correctness_problem``)."""


def correctness_problem(name: str, why: str | None = None) -> str | None:
    """Why correctness patch ``name`` (or any fingerprint entry ``name`` that correctness
    relies on, with ``why``) cannot be applied here (one line: the Flower version needed,
    and why), or None."""
    why = why or CORRECTNESS_PATCHES[name]
    if not flower_is_patchable():
        return (
            f"fedweave needs flwr {PATCHED_FLOWER_VERSION} (installed: "
            f"{installed_flower_version()}): its '{name}' fix to Flower is written for that "
            f"version, and {why}; install flwr=={PATCHED_FLOWER_VERSION}"
        )
    changed = [] if name in _applied else _changed(name)
    if changed:
        return (
            f"fedweave needs flwr {PATCHED_FLOWER_VERSION} as released: Flower's "
            f"{', '.join(changed)} differ here, and its '{name}' fix was written for the "
            f"released code ({why}); reinstall flwr=={PATCHED_FLOWER_VERSION}"
        )
    return None


INTERNAL_USES: dict[str, str] = {
    "message_records": "the sites and the coordinator read each other's fit and evaluate "
    "messages, SecAgg+ and DP settings and error codes through it",
    "default_workflow": "the coordinator's rounds read and write the round number and the "
    "global model in the records Flower's DefaultWorkflow keeps through it",
    "control_api": "the coordinator registers site keys, starts its runs and follows them "
    "through it",
}
"""Modules Flower does not export that fedweave uses without patching (each one a module of
this folder, its callers importing from it alone) → what goes wrong if they change. Like the
correctness patches they refuse, on another Flower version or on Flower code whose
fingerprint differs: the module raises ``UserError`` as it is imported (``rely_on``), and the
coordinator and the site check them all before starting anything (``internal_use_problem``).
The site's ClientApp worker (``clientapp_worker``) is a speed-up instead: a site without it
runs Flower's stock ``flwr-clientapp`` (``clientapp_worker_usable``)."""

_relied_on: set[str] = set()


def internal_use_problem(*names: str) -> str | None:
    """Why fedweave's uses of Flower's unexported modules ``names`` (default: all of
    ``INTERNAL_USES``) cannot be trusted here (one line: the Flower version needed, and why),
    or None."""
    for name in names or tuple(INTERNAL_USES):
        if name in _relied_on:
            continue
        why = INTERNAL_USES[name]
        if not flower_is_patchable():
            return (
                f"fedweave needs flwr {PATCHED_FLOWER_VERSION} (installed: "
                f"{installed_flower_version()}): its use of Flower's unexported '{name}' code "
                f"is written for that version, and {why}; install flwr=={PATCHED_FLOWER_VERSION}"
            )
        changed = _changed(name)
        if changed:
            return (
                f"fedweave needs flwr {PATCHED_FLOWER_VERSION} as released: Flower's "
                f"{', '.join(changed)} differ here, and fedweave's '{name}' use of them was "
                f"written for the released code ({why}); reinstall "
                f"flwr=={PATCHED_FLOWER_VERSION}"
            )
    return None


def rely_on(name: str) -> None:
    """Called by the module ``name`` of this folder as it is imported, before it imports
    Flower's unexported names: raises ``UserError`` (one line) where they are not flwr
    1.42.0's as released (checked once a process)."""
    problem = internal_use_problem(name)
    if problem is not None:
        raise UserError(problem)
    _relied_on.add(name)


def _apply_correctness(name: str) -> bool:
    problem = correctness_problem(name)
    if problem is not None:
        raise UserError(problem)
    if name not in _applied:
        import importlib

        importlib.import_module(f"fedweave.flower_patches.{name}").install()
        _applied.add(name)
    return True


def bound_supernode_waits() -> bool:
    """A reply wait that ends, and capped sleeps, in a site's SuperNode (True); raises
    ``UserError`` (one line: the Flower version needed) where that cannot be guaranteed."""
    return _apply_correctness("supernode_waits")


def report_supernode_state() -> bool:
    """The site's SuperNode appends what happens to it (connected, refused, retrying, a run
    ended) as JSON lines to the file its site names (True); raises ``UserError`` (one line:
    the Flower version needed) where that cannot be guaranteed."""
    return _apply_correctness("supernode_state")


def let_sites_rejoin_at_once() -> bool:
    """A restarted site takes its node back at once in the coordinator's SuperLink (True);
    raises ``UserError`` (one line: the Flower version needed) where that cannot be
    guaranteed."""
    return _apply_correctness("node_restarts")


def clientapp_worker_usable() -> bool:
    """Whether a site may run fedweave's long-lived ClientApp worker; False (Flower's stock
    process per message) on another Flower version or with ``FEDWEAVE_STOCK_FLOWER=1``."""
    if os.environ.get(STOCK_FLOWER_ENV) == "1":
        return False
    if not flower_is_patchable() or _changed("clientapp_worker"):
        _warn_once("clientapp_worker", "each message starts a new flwr-clientapp process")
        return False
    return True


STOCK_FLOWER_ENV = "FEDWEAVE_STOCK_FLOWER"
"""Set to 1 to run Flower's stock code where a patch only makes things faster (the security
and correctness patches, and the SecAgg+ masks, are never skipped): to compare, or to rule a
speed-up out when debugging."""


def _apply_speedup(name: str, consequence: str) -> bool:
    if os.environ.get(STOCK_FLOWER_ENV) == "1":
        return False
    if not flower_is_patchable():
        _warn_once(name, consequence)
        return False
    if name not in _applied and _changed(name):
        _warn_once(name, consequence)
        return False
    if name not in _applied:
        import importlib

        importlib.import_module(f"fedweave.flower_patches.{name}").install()
        _applied.add(name)
    return True


SECURITY_PATCHES = ("admin_apis", "run_bundles", "tls_suites", "refused_keys")
"""Applied in the coordinator's SuperLink whatever ``FEDWEAVE_STOCK_FLOWER`` says."""


def security_patch_problem() -> str | None:
    """Why the SuperLink's security patches cannot be applied here, or None."""
    from fedweave.flower_patches.fingerprints import mismatches

    if not flower_is_patchable():
        return (
            f"flwr {installed_flower_version()} is installed; the coordinator's SuperLink is "
            f"closed to outsiders only on flwr {PATCHED_FLOWER_VERSION}: install "
            f"flwr=={PATCHED_FLOWER_VERSION}"
        )
    changed = [ref for patch in SECURITY_PATCHES for ref in mismatches(patch)]
    if changed:
        return (
            f"Flower's code differs from flwr {PATCHED_FLOWER_VERSION}'s ({', '.join(changed)}); "
            f"reinstall flwr=={PATCHED_FLOWER_VERSION}"
        )
    return None


def close_control_surface() -> None:
    """Administrative APIs for this machine only, fedweave's bundles only, AEAD TLS only, in
    the SuperLink process; raises ``UserError`` where that cannot be guaranteed."""
    if all(name in _applied for name in SECURITY_PATCHES):
        return
    problem = security_patch_problem()
    if problem is not None:
        raise UserError(problem)
    import importlib

    for name in SECURITY_PATCHES:
        importlib.import_module(f"fedweave.flower_patches.{name}").install()
        _applied.add(name)


def use_fedweave_secagg() -> None:
    """fedweave's SecAgg+ masks, quantization, key curve and Shamir sharing at the site and the
    coordinator (idempotent).

    Refuses on another Flower version: every side must use the same mask generator and curve.
    """
    if not flower_is_patchable():
        raise UserError(
            f"SecAgg+ needs flwr {PATCHED_FLOWER_VERSION} (installed: {installed_flower_version()})"
            ": fedweave replaces its mask generator on every side, and another version would "
            f"mix masks that do not cancel; install flwr=={PATCHED_FLOWER_VERSION} or pass "
            "--no-secure-agg"
        )
    changed = [
        ref for name in ("secagg_masks", "secagg_crypto") if name not in _applied
        for ref in _changed(name)
    ]  # fmt: skip
    if changed:
        raise UserError(
            f"SecAgg+ needs flwr {PATCHED_FLOWER_VERSION} as released; Flower's "
            f"{', '.join(changed)} differ here: reinstall flwr=={PATCHED_FLOWER_VERSION} or "
            "pass --no-secure-agg"
        )
    if "secagg_masks" not in _applied:
        from fedweave.flower_patches import secagg_masks

        secagg_masks.install()
        _applied.add("secagg_masks")
    if "secagg_crypto" not in _applied:
        from fedweave.flower_patches import secagg_crypto

        secagg_crypto.install()
        _applied.add("secagg_crypto")
