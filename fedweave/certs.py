"""TLS certificates for the coordinator and key pairs for site (SuperNode) authentication.

Why our own code and not ``openssl`` one-liners: a newcomer gets a working CA + server
certificate with the right subject alternative names in one command, private keys land with
mode 0600, and the formats are exactly the ones Flower 1.41 loads:

- the coordinator's SuperLink serves TLS with ``server.pem`` / ``server.key`` signed by
  ``ca.pem`` (sites verify the coordinator with ``--ca-cert ca.pem``);
- a site authenticates with an ECDSA P-384 key in OpenSSH format (``site.key``); the
  coordinator registers its public half (``site.pub``, ``ecdsa-sha2-nistp384 ...``).
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
import re
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.exceptions import InvalidSignature, UnsupportedAlgorithm
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from fedweave.errors import UserError

CA_CERT = "ca.pem"
CA_KEY = "ca.key"
SERVER_CERT = "server.pem"
SERVER_KEY = "server.key"
SITE_KEYS_DIR = "sites"
"""Inside a TLS directory: the registered site public keys (``<name>.pub``)."""

DEFAULT_DAYS = 825
"""Server certificate validity in days (the longest most TLS clients accept); the CA: 10 years."""

PRIVATE_MODE = 0o600


@dataclass(frozen=True)
class TlsFiles:
    """The files a coordinator serves TLS with (all inside one directory)."""

    ca_cert: Path
    server_cert: Path
    server_key: Path

    @classmethod
    def in_dir(cls, directory: Path) -> TlsFiles:
        return cls(directory / CA_CERT, directory / SERVER_CERT, directory / SERVER_KEY)

    def check_readable(self) -> None:
        """Fail with one line naming the file and the fix when any file is missing or unreadable."""
        for path in (self.ca_cert, self.server_cert, self.server_key):
            try:
                data = path.read_bytes()
            except OSError as exc:
                raise UserError(
                    f"cannot read TLS file {path} ({exc.strerror or exc}); create the directory "
                    "with `fedweave certs init --out DIR --host NAME` or pass --insecure"
                ) from exc
            if b"-----BEGIN" not in data:
                raise UserError(
                    f"TLS file {path} is not PEM; recreate it with `fedweave certs init`"
                )


def _write_private(path: Path, data: bytes) -> None:
    """Write ``data`` so that only the owner can read it, from the first byte on."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, PRIVATE_MODE)
    with os.fdopen(fd, "wb") as handle:
        handle.write(data)
    os.chmod(path, PRIVATE_MODE)  # an existing file keeps its old mode through O_CREAT


def _write_public(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)


def _pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


_DNS_LABEL = re.compile(r"^(?!-)[A-Za-z0-9-]{1,63}(?<!-)$")


def san_entry(host: str) -> x509.GeneralName:
    """``host`` as a certificate name: an IP address (v4 or v6) or a DNS name; anything else
    (a port, a URL, ``10.0.0.300``) is a one-line error naming it."""
    try:
        return x509.IPAddress(ipaddress.ip_address(host))
    except ValueError:
        pass
    labels = host.rstrip(".").split(".")
    if (
        len(host) <= 253
        and all(_DNS_LABEL.match(label) for label in labels)
        and not labels[-1].isdigit()  # a top-level label is never all digits: a mistyped IP
    ):
        return x509.DNSName(host.rstrip(".").lower())
    raise UserError(
        f"--host {host!r} is neither an IP address nor a DNS name; give the name or address "
        "sites use to reach the coordinator, without port or scheme (e.g. coord.example.org "
        "or 10.0.0.5)"
    )


def _san_entries(hosts: list[str]) -> list[x509.GeneralName]:
    """DNS names and IP addresses the server certificate is valid for (always loopback too)."""
    names: list[x509.GeneralName] = []
    for host in [*hosts, "localhost", "127.0.0.1"]:
        entry = san_entry(host)
        if entry not in names:
            names.append(entry)
    return names


def init_certificates(
    out: Path, hosts: list[str], days: int = DEFAULT_DAYS, force: bool = False
) -> TlsFiles:
    """Create a CA and a server certificate for ``hosts`` in ``out``.

    Args:
        out: directory to write ``ca.pem``, ``ca.key``, ``server.pem``, ``server.key`` to.
        hosts: names/IPs sites use to reach the coordinator (``localhost`` and
            ``127.0.0.1`` are always added, so a local test needs nothing else).
        days: server certificate validity (default 825).
        force: overwrite existing files (default: refuse, so a CA is never replaced by accident).
    """
    if not hosts or any(not h.strip() for h in hosts):
        raise UserError("--host needs the name or IP address sites use to reach the coordinator")
    if days < 1:
        raise UserError(f"--days {days} must be at least 1")
    san = _san_entries([h.strip() for h in hosts])  # a bad host fails before any file is written
    files = TlsFiles.in_dir(out)
    existing = [
        p for p in (files.ca_cert, out / CA_KEY, files.server_cert, files.server_key) if p.exists()
    ]
    if existing and not force:
        raise UserError(f"{existing[0]} already exists; use another --out or --force to replace it")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UserError(
            f"cannot create {out} ({exc.strerror or exc}); choose a writable --out"
        ) from exc

    now = dt.datetime.now(dt.timezone.utc) - dt.timedelta(minutes=5)  # tolerate small clock skew
    ca_key = ec.generate_private_key(ec.SECP384R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "fedweave CA")])
    ca_cert = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now)
        .not_valid_after(now + dt.timedelta(days=3650))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(False, False, False, False, False, True, True, False, False),
            critical=True,
        )
        .add_extension(
            x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False
        )
        .sign(ca_key, hashes.SHA384())
    )
    server_key, server_cert = _server_certificate(ca_key, ca_name, hosts[0], san, days, now)
    try:
        _write_private(out / CA_KEY, _pem_key(ca_key))
        _write_private(files.server_key, _pem_key(server_key))
        _write_public(files.ca_cert, ca_cert.public_bytes(serialization.Encoding.PEM))
        _write_public(files.server_cert, server_cert.public_bytes(serialization.Encoding.PEM))
    except OSError as exc:
        raise UserError(f"cannot write certificates to {out} ({exc.strerror or exc})") from exc
    return files


def _server_certificate(
    ca_key: ec.EllipticCurvePrivateKey, ca_name: x509.Name, common_name: str,
    san: list[x509.GeneralName], days: int, now: dt.datetime,
) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    """A new server key and its certificate for ``san``, signed by the CA."""
    server_key = ec.generate_private_key(ec.SECP384R1())
    server_cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)]))
        .issuer_name(ca_name)
        .public_key(server_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now)
        .not_valid_after(now + dt.timedelta(days=days))
        .add_extension(x509.SubjectAlternativeName(san), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False
        )
        .sign(ca_key, hashes.SHA384())
    )
    return server_key, server_cert


def renew_server_certificate(
    directory: Path, hosts: list[str], days: int = DEFAULT_DAYS
) -> TlsFiles:
    """A new ``server.pem`` / ``server.key`` in ``directory``, signed by its ``ca.key``: the
    sites keep their ``ca.pem``. ``hosts`` as for ``init_certificates``."""
    if not hosts or any(not h.strip() for h in hosts):
        raise UserError("--host needs the name or IP address sites use to reach the coordinator")
    if days < 1:
        raise UserError(f"--days {days} must be at least 1")
    san = _san_entries([h.strip() for h in hosts])
    files = TlsFiles.in_dir(directory)
    ca_key_path = directory / CA_KEY
    try:
        ca_cert = x509.load_pem_x509_certificate(files.ca_cert.read_bytes())
        ca_key = serialization.load_pem_private_key(ca_key_path.read_bytes(), password=None)
    except OSError as exc:
        raise UserError(
            f"cannot read {exc.filename} ({exc.strerror or exc}); renewing needs the CA's "
            f"{CA_CERT} and {CA_KEY} in {directory}"
        ) from None
    except (ValueError, TypeError):
        raise UserError(
            f"{files.ca_cert} or {ca_key_path} is not the PEM file `fedweave certs init` wrote"
        ) from None
    if not isinstance(ca_key, ec.EllipticCurvePrivateKey) or (
        ca_key.public_key().public_numbers() != ca_cert.public_key().public_numbers()
    ):
        raise UserError(
            f"{ca_key_path} is not the key of {files.ca_cert}; renew with the CA's own key"
        )
    now = dt.datetime.now(dt.timezone.utc) - dt.timedelta(minutes=5)
    server_key, server_cert = _server_certificate(
        ca_key, ca_cert.subject, hosts[0].strip(), san, days, now
    )
    try:
        _write_private(files.server_key, _pem_key(server_key))
        _write_public(files.server_cert, server_cert.public_bytes(serialization.Encoding.PEM))
    except OSError as exc:
        raise UserError(f"cannot write to {directory} ({exc.strerror or exc})") from exc
    return files


EXPIRY_WARNING_DAYS = 30
"""A server certificate this close to its end is warned about (at start and daily)."""


@dataclass(frozen=True)
class ServerCertificate:
    """What the coordinator serves with, checked: its end and the names it is valid for."""

    not_after: dt.datetime
    names: tuple[str, ...]

    def days_left(self, now: dt.datetime) -> float:
        return (self.not_after - now).total_seconds() / 86400

    def expiry_warning(self, files: TlsFiles, now: dt.datetime) -> str | None:
        """One line when fewer than ``EXPIRY_WARNING_DAYS`` days are left, else None."""
        left = self.days_left(now)
        if left >= EXPIRY_WARNING_DAYS:
            return None
        return (
            f"warning: {files.server_cert} expires on {self.not_after:%Y-%m-%d %H:%M} UTC (in "
            f"{left:.0f} days); renew it with `fedweave certs renew --dir "
            f"{files.server_cert.parent} --host NAME` and restart the coordinator with --resume"
        )


def check_server_certificate(files: TlsFiles, now: dt.datetime | None = None) -> ServerCertificate:
    """The coordinator's certificate as sites will check it: refused in one line naming the
    file and the fix when it has expired, is not valid yet, does not match ``server.key`` or
    was not signed by ``ca.pem`` (or ``ca.pem`` itself has expired)."""
    now = now or dt.datetime.now(dt.timezone.utc)
    renew = f"`fedweave certs renew --dir {files.server_cert.parent} --host NAME`"
    try:
        cert = x509.load_pem_x509_certificate(files.server_cert.read_bytes())
        ca = x509.load_pem_x509_certificate(files.ca_cert.read_bytes())
    except ValueError:
        raise UserError(
            f"{files.server_cert} or {files.ca_cert} is not a PEM certificate; recreate it with "
            "`fedweave certs init`"
        ) from None
    try:
        key = serialization.load_pem_private_key(files.server_key.read_bytes(), password=None)
    except (ValueError, TypeError):
        raise UserError(
            f"{files.server_key} is not an unencrypted PEM private key; renew it with {renew}"
        ) from None
    if ca.not_valid_after_utc < now:
        raise UserError(
            f"{files.ca_cert} (the CA sites verify the coordinator with) expired on "
            f"{ca.not_valid_after_utc:%Y-%m-%d %H:%M} UTC; make a new one with `fedweave certs "
            "init --force` and give every site the new ca.pem"
        )
    try:
        cert.verify_directly_issued_by(ca)
    except (ValueError, TypeError, InvalidSignature):
        raise UserError(
            f"{files.server_cert} was not signed by {files.ca_cert} (the CA sites verify it "
            f"with): sites would refuse it; renew it with the CA's key: {renew}"
        ) from None
    spki = serialization.PublicFormat.SubjectPublicKeyInfo
    if key.public_key().public_bytes(serialization.Encoding.DER, spki) != cert.public_key(
    ).public_bytes(serialization.Encoding.DER, spki):
        raise UserError(
            f"{files.server_key} is not the key of {files.server_cert}; renew both with {renew}"
        )
    if cert.not_valid_before_utc > now:
        raise UserError(
            f"{files.server_cert} is not valid until {cert.not_valid_before_utc:%Y-%m-%d %H:%M} "
            f"UTC, and this machine's clock says {now:%Y-%m-%d %H:%M} UTC: set the clock right, "
            f"or renew it with {renew}"
        )
    if cert.not_valid_after_utc < now:
        raise UserError(
            f"{files.server_cert} expired on {cert.not_valid_after_utc:%Y-%m-%d %H:%M} UTC: "
            f"sites refuse it; renew it with {renew} (the sites keep their ca.pem), then start "
            "the coordinator again (--resume continues a run)"
        )
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        names = tuple(
            [*san.get_values_for_type(x509.DNSName),
             *(str(ip) for ip in san.get_values_for_type(x509.IPAddress))]
        )  # fmt: skip
    except x509.ExtensionNotFound:
        names = ()
    return ServerCertificate(cert.not_valid_after_utc, names)


def certificate_end(path: Path) -> dt.datetime | None:
    """When the certificate in ``path`` ends (read now: a renewed file counts at once);
    None when it cannot be read."""
    try:
        return x509.load_pem_x509_certificate(path.read_bytes()).not_valid_after_utc
    except (OSError, ValueError):
        return None


def serves_host(certificate: ServerCertificate, host: str) -> bool:
    """Whether a site reaching the coordinator as ``host`` accepts ``certificate``'s names
    (a wildcard listening address says nothing about them: True)."""
    if host in ("", "0.0.0.0", "::", "[::]"):
        return True
    try:
        return str(ipaddress.ip_address(host.strip("[]"))) in certificate.names
    except ValueError:
        return host.rstrip(".").lower() in certificate.names


def public_key_path(private_key: Path) -> Path:
    """``site.key`` → ``site.pub`` (the file an operator sends to the coordinator)."""
    return private_key.with_suffix(".pub")


def new_site_key(out: Path, force: bool = False) -> tuple[Path, Path]:
    """Create a site's authentication key pair: ``out`` (private, 0600) and ``out.pub``.

    ECDSA P-384 in OpenSSH format, which is what ``flower-supernode
    --auth-supernode-private-key`` and the SuperLink's node registration accept.
    """
    pub = public_key_path(out)
    if out.suffix == ".pub":
        raise UserError(
            f"{out} looks like a public key name; give the private key file, e.g. site.key"
        )
    for path in (out, pub):
        if path.exists() and not force:
            raise UserError(f"{path} already exists; use another --out or --force to replace it")
    key = ec.generate_private_key(ec.SECP384R1())
    private = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.OpenSSH,
        serialization.NoEncryption(),
    )
    public = key.public_key().public_bytes(
        serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH
    )
    try:
        _write_private(out, private)
        _write_public(pub, public + b"\n")
    except OSError as exc:
        raise UserError(
            f"cannot write {out} ({exc.strerror or exc}); choose a writable --out"
        ) from exc
    return out, pub


def load_site_public_key(path: Path) -> bytes:
    """Read and check a site's public key file; return it as written (OpenSSH text).

    Refuses anything Flower's node registration would refuse (not EC, not a NIST curve), so
    the mistake shows up when the key is added, not when the site first connects.
    """
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise UserError(f"cannot read site key {path} ({exc.strerror or exc})") from exc
    try:
        key = serialization.load_ssh_public_key(data.strip())
    except (ValueError, TypeError, UnsupportedAlgorithm) as exc:
        raise UserError(
            f"{path} is not an OpenSSH public key; "
            "make one with `fedweave sites new-key --out site.key`"
        ) from exc
    if not isinstance(key, ec.EllipticCurvePublicKey) or key.curve.name not in {
        "secp256r1",
        "secp384r1",
        "secp521r1",
    }:
        raise UserError(
            f"{path} is not an ECDSA (NIST P-256/384/521) key; "
            "make one with `fedweave sites new-key`"
        )
    return data.strip() + b"\n"


def add_site_key(directory: Path, public_key: Path, name: str | None = None) -> Path:
    """Register a site's public key with the coordinator's TLS directory (``DIR/sites/NAME.pub``).

    The coordinator registers every key found there with its SuperLink (at start, and keys
    added later within seconds), and admits only sites whose key is there (unless
    ``--allow-unregistered-sites``).
    """
    data = load_site_public_key(public_key)
    stem = name or public_key.stem
    if not stem or "/" in stem or stem.startswith("."):
        raise UserError(f"site name {stem!r} is not a plain file name; pass --name")
    target = directory / SITE_KEYS_DIR / f"{stem}.pub"
    for other in registered_site_keys(directory):
        if other.read_bytes().strip() == data.strip() and other != target:
            raise UserError(f"this key is already registered as {other.stem}")
    try:
        _write_public(target, data)
    except OSError as exc:
        raise UserError(f"cannot write {target} ({exc.strerror or exc})") from exc
    return target


def registered_site_keys(directory: Path) -> list[Path]:
    """The site public keys registered in ``directory`` (sorted by name)."""
    return sorted((directory / SITE_KEYS_DIR).glob("*.pub"))


REVOKED_KEYS_DIR = "revoked"
"""Where ``remove_site_key`` moves a key (``DIR/revoked/NAME.pub``): kept for the record, never
registered again; a coordinator registers ``DIR/sites/*.pub`` only."""


def key_fingerprint(public_key: bytes) -> str:
    """``SHA256:...`` of an OpenSSH public key, as ``ssh-keygen -l`` prints it."""
    import base64
    import hashlib

    blob = base64.b64decode(public_key.split()[1])
    return "SHA256:" + base64.b64encode(hashlib.sha256(blob).digest()).decode().rstrip("=")


def public_key_fingerprint(key: ec.EllipticCurvePublicKey) -> str:
    """``key_fingerprint`` of a loaded public key (a site key's public half, or a key Flower
    received in PEM form)."""
    return key_fingerprint(
        key.public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
    )


def site_keys_table(directory: Path) -> list[tuple[str, str, str]]:
    """(name, state, fingerprint) of every site key in ``directory``: ``registered`` ones first,
    then ``revoked`` ones."""
    rows = []
    for state, folder in (("registered", SITE_KEYS_DIR), ("revoked", REVOKED_KEYS_DIR)):
        for path in sorted((directory / folder).glob("*.pub")):
            try:
                fingerprint = key_fingerprint(path.read_bytes())
            except (OSError, IndexError, ValueError):
                fingerprint = "unreadable"
            rows.append((path.stem, state, fingerprint))
    return rows


def remove_site_key(directory: Path, name: str) -> Path:
    """Revoke site ``name``: move ``DIR/sites/NAME.pub`` to ``DIR/revoked/``. A running
    coordinator disconnects and refuses that site within a second; a restarted one never
    registers it."""
    source = directory / SITE_KEYS_DIR / f"{name}.pub"
    if not source.is_file():
        known = ", ".join(path.stem for path in registered_site_keys(directory)) or "none"
        raise UserError(
            f"no registered site {name!r} in {directory / SITE_KEYS_DIR} (registered: {known}); "
            f"see `fedweave sites list {directory}`"
        )
    target = directory / REVOKED_KEYS_DIR / f"{name}.pub"
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        source.replace(target)
    except OSError as exc:
        raise UserError(f"cannot move {source} to {target} ({exc.strerror or exc})") from exc
    return target
