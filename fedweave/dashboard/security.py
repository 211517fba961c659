"""Who may see the dashboard and its metrics, and over what.

Loopback by default. Any other address needs TLS (the server certificate and key of
``fedweave certs init``) and a credential file (``--auth-file``): one ``NAME:scrypt:SALT:HASH``
line per credential, made by ``fedweave dashboard add-credential``. A request shows its
credential as HTTP basic auth (a browser asks for it; Prometheus' ``basic_auth``) or as a
bearer token (the password alone). Passwords are never stored, only their scrypt hashes; a
request with a wrong credential gets 401 and nothing else, in the time a known name's check
takes, whether or not the name it gave exists.

Failed logins slow down (``FailedLogins``): after ``FREE_FAILURES`` wrong credentials from one
source address, or for one name, the next try must wait, twice as long after each further
failure (at most ``MAX_WAIT_SECONDS``); until then a request with a credential gets 429 and
no check. A header verified before is still accepted (a logged-in user is not locked out by
someone failing at their name), and the checks themselves run off the server's event loop, at
most ``CONCURRENT_CHECKS`` at a time (``app.Guard``), so a flood of wrong passwords cannot
starve the requests of those logged in.

On loopback, where a page is plain HTTP, a request must name this machine in its ``Host:``
header (a loopback name or the bound address): a web page elsewhere whose own name an
attacker points at 127.0.0.1 (DNS rebinding) is refused, 421. Elsewhere TLS already refuses a
name the server's certificate does not carry. Whether an address is loopback is decided by
every address it resolves to, never by its name (``localhost`` may be made to resolve
elsewhere).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import ipaddress
import os
import secrets
import socket
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from fedweave.errors import UserError

SCRYPT = {"n": 2**14, "r": 8, "p": 1, "dklen": 32}
"""scrypt's cost: about 30 ms a check here, so a verified header is remembered a while."""
REMEMBER_SECONDS = 300.0
"""How long a verified Authorization header is accepted without hashing it again."""
REALM = "fedweave dashboard"
FREE_FAILURES = 5
"""Wrong credentials a source (or a name) may send before its next try must wait."""
FIRST_WAIT_SECONDS = 1.0
"""The wait after the first failure beyond ``FREE_FAILURES``; it doubles with each further one."""
MAX_WAIT_SECONDS = 60.0
CONCURRENT_CHECKS = 2
"""scrypt checks running at once (each in a worker thread); more wait their turn."""
LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1"})
"""The ``Host:`` names a loopback server answers to, besides the address it is bound to."""


def is_loopback(host: str) -> bool:
    """Whether ``host`` only reaches this machine: a loopback address, or a name every address
    of which is loopback (a name that does not resolve is not)."""
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        pass
    try:
        found = socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)
    except (OSError, UnicodeError):
        return False
    return bool(found) and all(
        ipaddress.ip_address(str(info[4][0]).split("%")[0]).is_loopback for info in found
    )


def host_name(header: str) -> str:
    """The name of a ``Host:`` header (its port and an IPv6 address' brackets taken off),
    lower case."""
    if header.startswith("["):
        return header[1:].partition("]")[0].lower()
    return (header.rpartition(":")[0] if header.count(":") == 1 else header).lower()


def _hash(password: str, salt: bytes) -> bytes:
    return hashlib.scrypt(password.encode(), salt=salt, **SCRYPT)


def credential_line(name: str, password: str) -> str:
    """The ``--auth-file`` line for ``name`` with ``password`` (its scrypt hash, salted)."""
    salt = secrets.token_bytes(16)
    return f"{name}:scrypt:{salt.hex()}:{_hash(password, salt).hex()}"


@dataclass(frozen=True)
class _Entry:
    name: str
    salt: bytes
    digest: bytes


class Credentials:
    """The credentials of an ``--auth-file``; ``allows`` checks a request's header."""

    def __init__(self, entries: list[_Entry]) -> None:
        self._entries = entries
        self._decoy = _Entry("", secrets.token_bytes(16), secrets.token_bytes(32))
        self._remembered: dict[bytes, float] = {}
        self._lock = threading.Lock()

    @classmethod
    def load(cls, path: Path) -> Credentials:
        """Read ``path``; a missing, unreadable, empty or malformed file is a one-line error."""
        try:
            text = path.read_text()
        except OSError as exc:
            raise UserError(
                f"--auth-file {path}: cannot read it ({exc.strerror or exc}); make one with "
                f"`fedweave dashboard add-credential NAME --auth-file {path}`"
            ) from None
        entries = []
        for number, line in enumerate(text.splitlines(), 1):
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            parts = line.split(":")
            try:
                if len(parts) != 4 or parts[1] != "scrypt" or not parts[0]:
                    raise ValueError
                entries.append(_Entry(parts[0], bytes.fromhex(parts[2]), bytes.fromhex(parts[3])))
            except ValueError:
                raise UserError(
                    f"--auth-file {path} line {number} is not NAME:scrypt:SALT:HASH; write "
                    "credentials with `fedweave dashboard add-credential`"
                ) from None
        if not entries:
            raise UserError(
                f"--auth-file {path} holds no credential; add one with "
                f"`fedweave dashboard add-credential NAME --auth-file {path}`"
            )
        return cls(entries)

    def remembers(self, authorization: str | None) -> bool:
        """Whether ``authorization`` was verified within ``REMEMBER_SECONDS`` (no hashing)."""
        if not authorization:
            return False
        key = hashlib.sha256(authorization.encode()).digest()
        with self._lock:
            return self._remembered.get(key, 0.0) > time.monotonic()

    def allows(self, authorization: str | None) -> bool:
        """Whether an ``Authorization`` header (basic or bearer) carries a valid credential."""
        if not authorization:
            return False
        key = hashlib.sha256(authorization.encode()).digest()
        now = time.monotonic()
        with self._lock:
            if self._remembered.get(key, 0.0) > now:
                return True
        scheme, _, value = authorization.partition(" ")
        name, password = None, None
        if scheme.lower() == "basic":
            try:
                name, _, password = base64.b64decode(value, validate=True).decode().partition(":")
            except (binascii.Error, UnicodeDecodeError):
                return False
        elif scheme.lower() == "bearer":
            password = value.strip()
        else:
            return False
        named = [entry for entry in self._entries if name is None or entry.name == name]
        checks = [
            hmac.compare_digest(_hash(password, entry.salt), entry.digest)
            for entry in named or [self._decoy]  # an unknown name costs a check too
        ]
        ok = bool(named) and any(checks)
        if ok:
            with self._lock:
                if len(self._remembered) > 1000:
                    self._remembered.clear()
                self._remembered[key] = now + REMEMBER_SECONDS
        return ok


def claimed_name(authorization: str) -> str | None:
    """The name a basic ``Authorization`` header gives (None for a bearer token or garbage)."""
    scheme, _, value = authorization.partition(" ")
    if scheme.lower() != "basic":
        return None
    try:
        return base64.b64decode(value, validate=True).decode().partition(":")[0]
    except (binascii.Error, UnicodeDecodeError):
        return None


class FailedLogins:
    """Wrong credentials by source address and by name, and how long each must wait before
    its next try (see the module's text). ``clock``: ``time.monotonic`` (a test's own)."""

    MAX_TRACKED = 10_000

    def __init__(self, clock=time.monotonic) -> None:
        self._clock = clock
        self._failures: dict[str, tuple[int, float]] = {}  # key -> (failures, last one)
        self._lock = threading.Lock()

    @staticmethod
    def _keys(source: str | None, name: str | None) -> list[str]:
        return [f"source {source}"] * (source is not None) + [f"name {name}"] * (name is not None)

    def wait(self, source: str | None, name: str | None) -> float:
        """Seconds before ``source`` (for ``name``) may try again; 0: now."""
        now, longest = self._clock(), 0.0
        with self._lock:
            for key in self._keys(source, name):
                failures, last = self._failures.get(key, (0, 0.0))
                if failures >= FREE_FAILURES:
                    doubled = FIRST_WAIT_SECONDS * 2 ** (failures - FREE_FAILURES)
                    wait = min(MAX_WAIT_SECONDS, doubled)
                    longest = max(longest, last + wait - now)
        return max(0.0, longest)

    def failed(self, source: str | None, name: str | None) -> None:
        now = self._clock()
        with self._lock:
            if len(self._failures) > self.MAX_TRACKED:
                self._failures.clear()
            for key in self._keys(source, name):
                failures, _ = self._failures.get(key, (0, 0.0))
                self._failures[key] = (failures + 1, now)

    def succeeded(self, source: str | None, name: str | None) -> None:
        with self._lock:
            for key in self._keys(source, name):
                self._failures.pop(key, None)


@dataclass(frozen=True)
class Exposure:
    """How a fedweave web endpoint is served.

    Attributes:
        host / port: where it listens.
        certfile / keyfile: TLS (the coordinator's ``server.pem`` / ``server.key``), or None.
        credentials: who may look, or None (loopback only).
    """

    host: str
    port: int
    certfile: Path | None = None
    keyfile: Path | None = None
    credentials: Credentials | None = None

    @property
    def host_names(self) -> frozenset[str] | None:
        """The ``Host:`` names a request may carry: on loopback, its loopback names and the
        bound host; None (any) elsewhere, where TLS refuses a name its certificate lacks."""
        if not is_loopback(self.host):
            return None
        return LOOPBACK_NAMES | {self.host.strip("[]").lower()}

    @property
    def scheme(self) -> str:
        return "https" if self.certfile else "http"

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{self.scheme}://{host}:{self.port}"


def exposure(
    address: str, flag: str, tls_dir: Path | None, auth_file: Path | None
) -> Exposure:
    """Check and build how ``address`` is served: loopback as is (TLS and credentials if
    given); anything else only with both ``--tls-dir`` and ``--auth-file``."""
    from fedweave.addresses import parse_host_port
    from fedweave.certs import TlsFiles

    host, port = parse_host_port(address, flag)
    if not is_loopback(host) and (tls_dir is None or auth_file is None):
        missing = " and ".join(
            name for name, given in (("--tls-dir", tls_dir), ("--auth-file", auth_file))
            if given is None
        )  # fmt: skip
        raise UserError(
            f"{flag} {address} is reachable from other machines, which needs TLS and a "
            f"credential: give {missing} (`fedweave certs init`, `fedweave dashboard "
            "add-credential`), or listen on 127.0.0.1"
        )
    certfile = keyfile = None
    if tls_dir is not None:
        files = TlsFiles.in_dir(tls_dir.resolve())
        files.check_readable()
        certfile, keyfile = files.server_cert, files.server_key
    credentials = Credentials.load(auth_file) if auth_file is not None else None
    return Exposure(host, port, certfile, keyfile, credentials)


def write_credential(path: Path, name: str) -> str:
    """Append a new credential for ``name`` to ``path`` (made 0600); return its password."""
    if not name or ":" in name or any(c.isspace() for c in name):
        raise UserError(f"credential name {name!r}: use letters, digits, '-' or '_' (no ':')")
    password = secrets.token_urlsafe(18)
    existing = path.read_text() if path.exists() else ""
    if any(line.split(":", 1)[0] == name for line in existing.splitlines()):
        raise UserError(f"{path} already has a credential named {name}; pick another name")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    with os.fdopen(fd, "a") as handle:
        handle.write(credential_line(name, password) + "\n")
    os.chmod(path, 0o600)
    return password
