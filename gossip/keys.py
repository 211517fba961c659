"""CURVE key pairs for gossip peers, and the peer id derived from a public key.

A peer's id is a hash of its CURVE public key, and a receiver checks the id a message claims
against the key ZeroMQ authenticated for the connection, so an id cannot be spoofed. Key files
are pyzmq's ``zmq.auth`` certificate format (readable by any ZeroMQ binding):

    DIR/peer.key          public key (share it: it goes into other peers' ``allowed/``)
    DIR/peer.key_secret   secret key (mode 0600, never leaves the site)
    DIR/allowed/*.key     public keys this peer accepts, its own included

CURVE is the default (``fedweave peer`` without ``--insecure``): a peer started without
``--keys`` uses ``./peer-keys`` and makes a key pair there on its first start
(``open_keyring``). Plaintext needs an explicit ``--insecure``.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from fedweave.errors import UserError

log = logging.getLogger("fedweave.gossip")

KEY_NAME = "peer"
ALLOWED_DIR = "allowed"
DEFAULT_KEYS_DIR = Path("peer-keys")
"""Where a peer keeps its keys without ``--keys``: relative to its working directory, like
the history database and checkpoints (one directory per peer: two peers sharing one would
share an id)."""


@dataclass(frozen=True)
class Identity:
    """Who this peer is: its id and, with CURVE, its key pair (Z85 bytes)."""

    peer_id: str
    public_key: bytes | None = None
    secret_key: bytes | None = None


@dataclass(frozen=True)
class KeyRing:
    """This peer's identity plus the public keys it accepts, by peer id."""

    identity: Identity
    allowed: dict[str, bytes] = field(default_factory=dict)


def peer_id_from_public_key(public_key: bytes) -> str:
    """32 hex chars of sha256 over the raw 32-byte key: short, safe in paths, unforgeable."""
    import zmq

    raw = zmq.utils.z85.decode(public_key) if len(public_key) == 40 else public_key
    if len(raw) != 32:
        raise ValueError("a CURVE public key is 32 bytes (40 Z85 characters)")
    return hashlib.sha256(raw).hexdigest()[:32]


def anonymous_peer_id(listen_addr: str) -> str:
    """Id of a peer without keys: stable for one listen address so a restart is re-admitted.

    Not authenticated: without ``--keys`` any peer can claim any id (documented).
    """
    return "anon-" + hashlib.sha256(listen_addr.encode()).hexdigest()[:24]


def new_keys(out_dir: str | Path, force: bool = False, flag: str = "--out") -> Identity:
    """Create a CURVE key pair in ``out_dir`` and allow it in ``out_dir/allowed/``.

    Refuses to overwrite an existing pair unless ``force`` (a lost secret key changes the
    peer's id, which every other site would have to re-allow). ``flag`` names the option
    that chose ``out_dir`` in error messages.
    """
    import zmq
    import zmq.auth

    if not zmq.has("curve"):
        raise UserError("this libzmq was built without CURVE; install pyzmq from its wheels")
    out = Path(out_dir)
    public_file = out / f"{KEY_NAME}.key"
    if public_file.exists() and not force:
        raise UserError(f"{public_file} already exists; use another {flag} or pass --force")
    try:
        (out / ALLOWED_DIR).mkdir(parents=True, exist_ok=True)
        public_path, secret_path = zmq.auth.create_certificates(str(out), KEY_NAME)
        os.chmod(secret_path, 0o600)
        identity = load_identity(out)
        assert identity.public_key is not None
        shutil.copyfile(public_path, out / ALLOWED_DIR / f"{identity.peer_id}.key")
    except OSError as exc:
        raise UserError(
            f"cannot write keys to {out}: {exc.strerror}; pick a writable {flag}"
        ) from exc
    return identity


def load_identity(keys_dir: str | Path) -> Identity:
    """Read ``DIR/peer.key_secret`` (which holds both halves) into an ``Identity``."""
    import zmq.auth

    secret_file = Path(keys_dir) / f"{KEY_NAME}.key_secret"
    if not secret_file.is_file():
        raise UserError(
            f"no secret key at {secret_file}; create one with 'fedweave keys new --out {keys_dir}'"
        )
    try:
        public, secret = zmq.auth.load_certificate(str(secret_file))
    except (OSError, ValueError) as exc:
        raise UserError(
            f"cannot read {secret_file} ({exc}); recreate it with 'fedweave keys new'"
        ) from exc
    if not secret:
        raise UserError(f"{secret_file} holds no secret key; recreate it with 'fedweave keys new'")
    return Identity(peer_id_from_public_key(public), public, secret)


def load_allowed(keys_dir: str | Path) -> dict[str, bytes]:
    """Public keys in ``DIR/allowed/*.key`` by peer id (files that fail to parse are errors)."""
    import zmq.auth

    allowed_dir = Path(keys_dir) / ALLOWED_DIR
    if not allowed_dir.is_dir():
        raise UserError(
            f"{allowed_dir} is missing; put the public keys of the peers to accept there"
        )
    out: dict[str, bytes] = {}
    for path in sorted(allowed_dir.glob("*.key")):
        try:
            public, _ = zmq.auth.load_certificate(str(path))
            out[peer_id_from_public_key(public)] = public
        except (OSError, ValueError) as exc:
            raise UserError(
                f"{path} is not a public key file ({exc}); remove or replace it"
            ) from exc
    return out


def load_keyring(keys_dir: str | Path) -> KeyRing:
    """Identity and allow-list from one ``--keys`` directory."""
    return KeyRing(load_identity(keys_dir), load_allowed(keys_dir))


def open_keyring(keys_dir: Path | None) -> KeyRing:
    """The keys ``fedweave peer`` runs with: ``--keys DIR`` as given, or ``DEFAULT_KEYS_DIR``,
    where a key pair is made on first start (said once on the console).

    A peer whose allow-list holds no key but its own could talk to nobody: that is refused
    now, naming the fix, instead of after ``--connect-timeout``."""
    where = keys_dir if keys_dir is not None else DEFAULT_KEYS_DIR
    made = ""
    if keys_dir is None and not (where / f"{KEY_NAME}.key_secret").exists():
        if (where / f"{KEY_NAME}.key").exists():
            raise UserError(
                f"{where / KEY_NAME}.key has no {KEY_NAME}.key_secret beside it: restore it, or "
                f"remove {where} to make a new key pair (a new peer id the others must allow)"
            )
        identity = new_keys(where, flag="--keys DIR")
        made = f"made a CURVE key pair in {where}/ (peer id {identity.peer_id}); "
        log.warning(
            "%sshare %s with the other peers (it goes into their %s/), keep %s here",
            made,
            where / f"{KEY_NAME}.key",
            ALLOWED_DIR,
            where / f"{KEY_NAME}.key_secret",
        )
    keyring = load_keyring(where)
    others = set(keyring.allowed) - {keyring.identity.peer_id}
    log.info(
        "CURVE keys from %s/ (peer id %s; %d other peers allowed)",
        where,
        keyring.identity.peer_id,
        len(others),
    )
    if not others:
        raise UserError(
            f"{made}{where / ALLOWED_DIR}/ holds no other peer's public key: add each other "
            f"site's peer.key with `fedweave keys allow THEIR.key --keys {where}`, give them "
            f"{where / KEY_NAME}.key, then start again (or pass --insecure for plaintext "
            "gossip, testing only)"
        )
    return keyring


def allow_key(keys_dir: str | Path, public_file: str | Path) -> tuple[str, Path, bool]:
    """Copy another peer's public key file into ``keys_dir/allowed/<peer id>.key``.

    Named by the key's peer id, so every site's ``peer.key`` gets its own file (they are all
    called ``peer.key`` where they were made). Returns (peer id, the file written, whether it
    was new). A secret key file, or anything that is not a public key, is refused."""
    import zmq.auth

    source = Path(public_file)
    try:
        public, secret = zmq.auth.load_certificate(str(source))
    except (OSError, ValueError) as exc:
        raise UserError(
            f"{source} is not a CURVE public key file ({exc}); pass the other site's {KEY_NAME}.key"
        ) from None
    if secret:
        raise UserError(
            f"{source} holds a secret key: never copy it; pass the other site's public "
            f"{KEY_NAME}.key"
        )
    peer_id = peer_id_from_public_key(public)
    allowed = Path(keys_dir) / ALLOWED_DIR
    if not allowed.is_dir():
        raise UserError(
            f"{allowed} is missing: make this site's keys first (`fedweave keys new --out "
            f"{keys_dir}`, or start the peer once)"
        )
    target = allowed / f"{peer_id}.key"
    new = not target.exists()
    shutil.copyfile(source, target)
    return peer_id, target, new


def new_key_group(dirs: list[Path]) -> list[Identity]:
    """Key pairs in ``dirs`` that all allow each other (a simulation's peers, tests)."""
    identities = [new_keys(d) for d in dirs]
    for d in dirs:
        for other, identity in zip(dirs, identities, strict=True):
            shutil.copyfile(other / f"{KEY_NAME}.key", d / ALLOWED_DIR / f"{identity.peer_id}.key")
    return identities
