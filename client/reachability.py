"""Can this site reach its coordinator, and does the coordinator's certificate verify?

``probe`` asks the network itself, before the SuperNode starts and while it retries: name
resolution, a TCP connection and, with TLS, a handshake against ``--ca-cert``. Every answer
comes from a structured signal (the resolver's error, the socket's errno, OpenSSL's verify
code), never from a log line, so a wrong host, a wrong port and a wrong CA each get their own
one-line message within seconds, instead of the same "unreachable" after the connect timeout.
"""

from __future__ import annotations

import errno
import socket
import ssl
from dataclasses import dataclass
from pathlib import Path

PROBE_TIMEOUT_S = 10.0
"""How long one probe waits for the coordinator's machine to answer."""

X509_V_ERR_CERT_NOT_YET_VALID = 9
X509_V_ERR_CERT_HAS_EXPIRED = 10
X509_V_ERR_HOSTNAME_MISMATCH = 62
X509_V_ERR_IP_ADDRESS_MISMATCH = 64


@dataclass(frozen=True)
class Probe:
    """What one probe found.

    Attributes:
        kind: ``ok``; ``unresolvable`` (no such host); ``refused`` (the host answers, nothing
            listens on the port); ``silent`` (no answer within the timeout: a firewall, or
            the wrong host); ``untrusted`` (the certificate does not verify with the CA);
            ``wrong-name`` (a valid certificate, for another host); ``expired`` and
            ``not-yet-valid`` (a certificate the CA did sign, outside its dates: the
            coordinator's to renew, or a clock to set); ``not-tls`` (the port answers, but not
            with TLS).
        detail: OpenSSL's or the resolver's own words for it, when it has some.
    """

    kind: str
    detail: str = ""

    @property
    def fatal(self) -> bool:
        """Whether waiting cannot help (the certificate or the name is wrong)."""
        return self.kind in ("untrusted", "wrong-name", "not-tls", "unresolvable")


def probe(host: str, port: int, ca_cert: Path | None, timeout: float = PROBE_TIMEOUT_S) -> Probe:
    """Resolve ``host``, connect to ``port`` and, with ``ca_cert``, complete a TLS handshake
    verifying the coordinator's certificate and name against it."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        if exc.errno == socket.EAI_AGAIN:  # the resolver itself is unreachable: may pass
            return Probe("silent", exc.strerror or "")
        return Probe("unresolvable", exc.strerror or "")
    try:
        family, kind, proto, _, address = infos[0]
        with socket.socket(family, kind, proto) as raw:
            raw.settimeout(timeout)
            raw.connect(address)
            if ca_cert is None:
                return Probe("ok")
            context = ssl.create_default_context(cafile=str(ca_cert))
            context.set_alpn_protocols(["h2"])  # what gRPC offers
            with context.wrap_socket(raw, server_hostname=host):
                return Probe("ok")
    except ssl.SSLCertVerificationError as exc:
        name_codes = (X509_V_ERR_HOSTNAME_MISMATCH, X509_V_ERR_IP_ADDRESS_MISMATCH)
        kind = (
            "wrong-name" if exc.verify_code in name_codes
            else "expired" if exc.verify_code == X509_V_ERR_CERT_HAS_EXPIRED
            else "not-yet-valid" if exc.verify_code == X509_V_ERR_CERT_NOT_YET_VALID
            else "untrusted"
        )  # fmt: skip
        return Probe(kind, exc.verify_message or "")
    except ssl.SSLError as exc:
        return Probe("not-tls", exc.reason or "")
    except TimeoutError:
        return Probe("silent")
    except OSError as exc:
        if exc.errno in (errno.ECONNREFUSED, errno.ECONNRESET):
            return Probe("refused")
        if exc.errno in (errno.EHOSTUNREACH, errno.ENETUNREACH, errno.ETIMEDOUT):
            return Probe("silent", exc.strerror or "")
        return Probe("silent", exc.strerror or str(exc.errno))


def explained(found: Probe, coordinator: str, ca_cert: Path | None) -> str:
    """One line naming the problem ``found`` and its fix (empty for ``ok``)."""
    said = f" ({found.detail})" if found.detail else ""
    return {
        "ok": "",
        "unresolvable": f"cannot resolve the coordinator's host in {coordinator}{said}; "
        "check --coordinator",
        "refused": f"nothing listens at {coordinator} (connection refused): check the port in "
        "--coordinator and that the coordinator runs",
        "silent": f"no answer from {coordinator}{said}: check the host in --coordinator and "
        "the firewall between this site and the coordinator",
        "untrusted": f"the coordinator at {coordinator} presents a certificate that --ca-cert "
        f"{ca_cert} does not verify{said}; get the coordinator's ca.pem from its operator",
        "expired": f"the coordinator at {coordinator} presents a certificate that has expired"
        f"{said}; this site's --ca-cert is right: the coordinator's operator must renew it "
        "(`fedweave certs renew`); this site connects once it is",
        "not-yet-valid": f"the coordinator at {coordinator} presents a certificate that is not "
        f"valid yet{said}: this site's clock or the coordinator's is wrong; set it right",
        "wrong-name": f"the coordinator's certificate is not for the host in {coordinator}"
        f"{said}; connect by a name it was made for (`fedweave certs init --host NAME`)",
        "not-tls": f"{coordinator} answers, but not with TLS{said}: the coordinator may run "
        "with --insecure (then start this site with --insecure too), or the port is another "
        "service's",
    }[found.kind]
