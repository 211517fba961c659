"""The folder a direct transfer goes through, shared by the ServerApp and the coordinator's
transfer server (two processes of one host, one user: a 0700 folder beside the deployment
file).

- ``blobs/DIGEST``: a model the ServerApp sends, written once, named by its sha256.
- ``grants/ID.json``: what one message's token allows, ``ID`` being the sha256 of the token
  (the token itself is only in the message, which Flower delivers to its site alone): the
  node it was sent to, the blobs it may fetch, the most bytes it may upload, when it expires.
- ``uploads/ID`` and ``uploads/ID.json``: what a site uploaded under a grant, and its digest
  and size as the server measured them (``ID.part`` while it arrives, ``ID.taken`` once the
  ServerApp has taken it to read).
- ``held/HANDLE``: an update the ServerApp keeps on disk past its exchange, until its round
  has added it into the mean (``coordinator/rounds/spooled_updates.py``); the sweep removes
  one a ServerApp that died left behind.

Files appear in one step (written aside, then renamed), so a reader sees all of one or none.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import time
from dataclasses import dataclass
from pathlib import Path

BLOB_GRACE_S = 120.0
"""A blob no live grant names is removed by ``sweep`` once it is this old (a grant naming it
may be on its way)."""
HELD_GRACE_S = 3600.0
"""A held update is removed by ``sweep`` once it is this old (its round reads it within seconds
of the exchange's end; an older one belongs to a ServerApp that stopped)."""
MAX_GRANT_BYTES = 1 << 20
"""The most of a grant file read: it names a few digests."""
HELD_STYPE = "fedweave.spooled"
"""The stype of an ``Array`` that stands in a reply for tensors held in ``held/``: its bytes
are a handle only the coordinator's registry (``spooled_updates.py``) can resolve."""


@dataclass(frozen=True)
class Grant:
    """What one message's token allows (see the module).

    Attributes:
        id: sha256 hex of the token; names the grant's files.
        node: the Flower node id the message went to.
        fetch: digests of the blobs it may fetch.
        upload_limit: the most bytes it may upload (0: none).
        expires: Unix time after which it allows nothing.
    """

    id: str
    node: int
    fetch: tuple[str, ...]
    upload_limit: int
    expires: float


@dataclass(frozen=True)
class Upload:
    """What a site uploaded under a grant: the file it is in (the taker's to read and remove),
    its sha256 hex and the node that held the grant."""

    path: Path
    digest: str
    node: int


def grant_id(token: str) -> str:
    """The id a token's grant is filed under."""
    return hashlib.sha256(token.encode("utf-8", "replace")).hexdigest()


def _is_hex_id(text: str) -> bool:
    return len(text) == 64 and all(c in "0123456789abcdef" for c in text)


class Spool:
    """The shared folder (see the module); ``root`` is made 0700 if it is not there."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        for sub in ("", "blobs", "grants", "uploads", "held"):
            (self.root / sub).mkdir(mode=0o700, parents=True, exist_ok=True)

    # -- the ServerApp's side -------------------------------------------------------------

    def put_blob(self, blob: bytes) -> str:
        """Write ``blob`` under its digest (once; a second put of the same bytes reuses it);
        returns the digest."""
        return self.put_parts([blob])[0]

    def put_parts(self, parts: list[bytes]) -> tuple[str, int]:
        """``put_blob`` for a blob given as its pieces (``records.encoded_parts``), written and
        hashed piece by piece: no copy of it is made. Returns its digest and size."""
        hasher, size = hashlib.sha256(), 0
        aside = self.root / "blobs" / f".{secrets.token_hex(8)}.part"
        try:
            with open(aside, "xb") as file:
                for part in parts:
                    hasher.update(part)
                    file.write(part)
                    size += len(part)
            path = self.blob_path(hasher.hexdigest())
            if path.exists():
                os.utime(path)  # fresh again: the sweep counts its age from here
            else:
                os.replace(aside, path)
        finally:
            aside.unlink(missing_ok=True)
        return hasher.hexdigest(), size

    def grant(self, node: int, fetch: list[str], upload_limit: int, lifetime_s: float) -> str:
        """File a grant for ``node`` and return its token (which only the message carries)."""
        token = secrets.token_urlsafe(32)
        record = {
            "node": int(node), "fetch": list(fetch), "upload_limit": int(upload_limit),
            "expires": time.time() + lifetime_s,
        }  # fmt: skip
        self._write(self.root / "grants" / f"{grant_id(token)}.json", json.dumps(record).encode())
        return token

    def take_upload(self, grant: str, node: int) -> Upload | None:
        """The upload filed under grant id ``grant`` if that grant was ``node``'s (``None``:
        no such upload, or another node's), moved aside (``ID.taken``) so it is taken once."""
        if not _is_hex_id(grant):
            return None
        held = self.grant_of_id(grant, expired_too=True)
        if held is None or held.node != node:
            return None
        path = self.root / "uploads" / grant
        taken = path.with_suffix(".taken")
        try:
            meta = json.loads((path.with_suffix(".json")).read_text(encoding="utf-8"))
            os.replace(path, taken)
            size = taken.stat().st_size
        except (OSError, ValueError):
            return None
        finally:
            path.with_suffix(".json").unlink(missing_ok=True)
        if not isinstance(meta, dict) or meta.get("size") != size:
            taken.unlink(missing_ok=True)
            return None
        return Upload(taken, str(meta.get("digest")), held.node)

    def hold(self, upload: Upload) -> Path:
        """Move a taken upload out of its grant's reach (releasing the grant leaves it) into
        ``held/``; returns where it is now, the holder's to remove."""
        held = self.root / "held" / secrets.token_hex(16)
        os.replace(upload.path, held)
        return held

    def release(self, tokens: list[str]) -> None:
        """Remove the grants of ``tokens`` and anything uploaded under them."""
        for token in tokens:
            self._remove_grant(grant_id(token))

    # -- the transfer server's side -------------------------------------------------------

    def blob_path(self, name: str) -> Path:
        """Where the blob of digest ``name`` is (or would be)."""
        if not _is_hex_id(name):
            raise ValueError("not a sha256 hex digest")
        return self.root / "blobs" / name

    def grant_of(self, token: str) -> Grant | None:
        """The live grant ``token`` holds, or ``None`` (unknown, expired, unreadable)."""
        return self.grant_of_id(grant_id(token))

    def grant_of_id(self, name: str, expired_too: bool = False) -> Grant | None:
        """The grant filed as ``name`` (``None``: none, or expired unless ``expired_too``)."""
        if not _is_hex_id(name):
            return None
        try:
            with open(self.root / "grants" / f"{name}.json", "rb") as file:
                record = json.loads(file.read(MAX_GRANT_BYTES))
            grant = Grant(
                name, int(record["node"]), tuple(str(d) for d in record["fetch"]),
                int(record["upload_limit"]), float(record["expires"]),
            )  # fmt: skip
        except (OSError, ValueError, KeyError, TypeError):
            return None
        if not expired_too and grant.expires < time.time():
            return None
        return grant

    def upload_part(self, grant: Grant):  # type: ignore[no-untyped-def]
        """A new file for ``grant``'s upload (``FileExistsError``: one is there already, or
        arriving: a grant takes one upload)."""
        final = self.root / "uploads" / grant.id
        if final.exists():
            raise FileExistsError(final)
        fd = os.open(final.with_suffix(".part"), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        return os.fdopen(fd, "wb")

    def finish_upload(self, grant: Grant, digest: str, size: int) -> None:
        """File the upload of ``grant`` that ``upload_part`` received, with its measurements."""
        final = self.root / "uploads" / grant.id
        measured = json.dumps({"digest": digest, "size": size}).encode()
        self._write(final.with_suffix(".json"), measured)
        os.replace(final.with_suffix(".part"), final)

    def drop_part(self, grant: Grant) -> None:
        """Forget an upload that did not complete (the grant may try again)."""
        (self.root / "uploads" / grant.id).with_suffix(".part").unlink(missing_ok=True)
        (self.root / "uploads" / grant.id).with_suffix(".json").unlink(missing_ok=True)

    def sweep(self, now: float | None = None) -> int:
        """Remove expired grants with their uploads, blobs no live grant names and held
        updates older than ``HELD_GRACE_S``; returns how many files went."""
        now = time.time() if now is None else now
        removed, named = 0, set()
        for path in (self.root / "grants").glob("*.json"):
            grant = self.grant_of_id(path.stem, expired_too=True)
            if grant is None or grant.expires < now:
                removed += self._remove_grant(path.stem)
            else:
                named.update(grant.fetch)
        for path in (self.root / "blobs").iterdir():
            try:
                old = now - path.stat().st_mtime > BLOB_GRACE_S
            except OSError:
                continue
            if path.name not in named and old:
                path.unlink(missing_ok=True)
                removed += 1
        for path in (self.root / "held").iterdir():
            try:
                old = now - path.stat().st_mtime > HELD_GRACE_S
            except OSError:
                continue
            if old:
                path.unlink(missing_ok=True)
                removed += 1
        return removed

    def _remove_grant(self, name: str) -> int:
        removed = 0
        upload = self.root / "uploads" / name
        for path in (
            self.root / "grants" / f"{name}.json", upload, upload.with_suffix(".json"),
            upload.with_suffix(".part"), upload.with_suffix(".taken"),
        ):  # fmt: skip
            if path.exists():
                path.unlink(missing_ok=True)
                removed += 1
        return removed

    @staticmethod
    def _write(path: Path, data: bytes) -> None:
        aside = path.with_name(f".{path.name}.{secrets.token_hex(4)}")
        fd = os.open(aside, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as file:
            file.write(data)
        os.replace(aside, path)
