"""`fedweave certs init` and site keys: formats Flower loads, 0600 private keys, refusals."""

from __future__ import annotations

import stat

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519
from cryptography.x509.oid import ExtensionOID

from fedweave.certs import (
    add_site_key,
    init_certificates,
    key_fingerprint,
    load_site_public_key,
    new_site_key,
    registered_site_keys,
    remove_site_key,
    site_keys_table,
)
from fedweave.errors import UserError


def mode(path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_init_makes_a_ca_and_a_server_certificate_for_the_host(tmp_path):
    files = init_certificates(tmp_path / "tls", ["coord.example.org", "10.0.0.5"])
    ca = x509.load_pem_x509_certificate(files.ca_cert.read_bytes())
    server = x509.load_pem_x509_certificate(files.server_cert.read_bytes())
    server.verify_directly_issued_by(ca)  # raises if not signed by the CA
    san = server.extensions.get_extension_for_oid(ExtensionOID.SUBJECT_ALTERNATIVE_NAME).value
    assert "coord.example.org" in san.get_values_for_type(x509.DNSName)
    assert "localhost" in san.get_values_for_type(x509.DNSName)
    assert {str(ip) for ip in san.get_values_for_type(x509.IPAddress)} == {"10.0.0.5", "127.0.0.1"}
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    assert mode(files.server_key) == 0o600 and mode(tmp_path / "tls" / "ca.key") == 0o600
    key = serialization.load_pem_private_key(files.server_key.read_bytes(), None)
    assert key.public_key().public_numbers() == server.public_key().public_numbers()


def test_init_refuses_to_replace_a_ca_unless_forced(tmp_path):
    init_certificates(tmp_path, ["localhost"])
    first = (tmp_path / "ca.pem").read_bytes()
    with pytest.raises(UserError, match="already exists"):
        init_certificates(tmp_path, ["localhost"])
    assert (tmp_path / "ca.pem").read_bytes() == first
    init_certificates(tmp_path, ["localhost"], force=True)
    assert (tmp_path / "ca.pem").read_bytes() != first
    with pytest.raises(UserError, match="--host"):
        init_certificates(tmp_path / "other", [])


def test_site_key_pair_is_what_flower_loads(tmp_path):
    private, public = new_site_key(tmp_path / "site.key")
    assert public.name == "site.pub" and mode(private) == 0o600
    key = serialization.load_ssh_private_key(private.read_bytes(), None)
    assert isinstance(key, ec.EllipticCurvePrivateKey) and key.curve.name == "secp384r1"
    assert public.read_text().startswith("ecdsa-sha2-nistp384 ")
    assert load_site_public_key(public).strip() == public.read_bytes().strip()
    with pytest.raises(UserError, match="already exists"):
        new_site_key(tmp_path / "site.key")


def test_add_key_registers_checks_and_refuses_duplicates(tmp_path):
    tls = tmp_path / "tls"
    _, pub_a = new_site_key(tmp_path / "a.key")
    _, pub_b = new_site_key(tmp_path / "b.key")
    add_site_key(tls, pub_a)
    add_site_key(tls, pub_b, name="hospital-b")
    assert [p.stem for p in registered_site_keys(tls)] == ["a", "hospital-b"]
    with pytest.raises(UserError, match="already registered as a"):
        add_site_key(tls, pub_a, name="again")

    wrong = tmp_path / "ed.pub"
    wrong.write_bytes(
        ed25519.Ed25519PrivateKey.generate()
        .public_key()
        .public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
    )
    with pytest.raises(UserError, match="ECDSA"):
        add_site_key(tls, wrong)
    garbage = tmp_path / "garbage.pub"
    garbage.write_text("not a key\n")
    with pytest.raises(UserError, match="not an OpenSSH public key"):
        add_site_key(tls, garbage)
    with pytest.raises(UserError, match="cannot read"):
        add_site_key(tls, tmp_path / "missing.pub")


def test_remove_key_revokes_for_good_and_lists_both(tmp_path):
    import subprocess

    tls = tmp_path / "tls"
    _, pub_a = new_site_key(tmp_path / "a.key")
    _, pub_b = new_site_key(tmp_path / "b.key")
    add_site_key(tls, pub_a)
    add_site_key(tls, pub_b)
    remove_site_key(tls, "a")
    # what a (re)started coordinator registers: the revoked key is not among them
    assert [p.stem for p in registered_site_keys(tls)] == ["b"]
    table = site_keys_table(tls)
    assert [(name, state) for name, state, _ in table] == [("b", "registered"), ("a", "revoked")]
    ssh = subprocess.run(["ssh-keygen", "-lf", str(pub_a)], capture_output=True, text=True)
    if ssh.returncode == 0:  # the same fingerprint an operator gets from OpenSSH
        assert ssh.stdout.split()[1] == key_fingerprint(pub_a.read_bytes())
    assert table[1][2] == key_fingerprint(pub_a.read_bytes())
    with pytest.raises(UserError, match="no registered site 'a'.*registered: b"):
        remove_site_key(tls, "a")


def test_init_takes_several_names_and_addresses_and_refuses_anything_else(tmp_path):
    hosts = ["coord.example.org", "fl-hub", "10.0.0.5", "192.168.7.1", "fd00::1"]
    files = init_certificates(tmp_path / "tls", hosts)
    server = x509.load_pem_x509_certificate(files.server_cert.read_bytes())
    san = server.extensions.get_extension_for_oid(ExtensionOID.SUBJECT_ALTERNATIVE_NAME).value
    assert {"coord.example.org", "fl-hub", "localhost"} == set(
        san.get_values_for_type(x509.DNSName)
    )
    assert {str(ip) for ip in san.get_values_for_type(x509.IPAddress)} == {
        "10.0.0.5", "192.168.7.1", "fd00::1", "127.0.0.1",
    }  # fmt: skip
    for bad in ["10.0.0.300", "coord:9092", "https://coord.example.org", "a b", "-x.org"]:
        with pytest.raises(UserError, match="neither an IP address nor a DNS name"):
            init_certificates(tmp_path / "bad", ["coord.example.org", bad])
        assert not (tmp_path / "bad").exists()  # nothing written


def test_certs_init_with_a_bad_host_is_one_line_and_exit_2(tmp_path):
    import subprocess
    import sys

    result = subprocess.run(
        [sys.executable, "-m", "fedweave.cli", "certs", "init", "--out", str(tmp_path / "t"),
         "--host", "10.0.0.5", "--host", "coord:9092"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "'coord:9092' is neither" in lines[0], result.stderr
    assert not (tmp_path / "t").exists()


def test_new_key_names_the_public_key_it_wrote(tmp_path):
    import subprocess
    import sys

    result = subprocess.run(
        [sys.executable, "-m", "fedweave.cli", "sites", "new-key", "--out",
         str(tmp_path / "clinic-3.key")],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "clinic-3.pub").exists()
    assert "fedweave sites add-key DIR clinic-3.pub" in result.stdout


def _expired_server_certificate(directory, days_ago: int = 10) -> None:
    """Replace ``server.pem`` / ``server.key`` in ``directory`` with a pair the same CA
    signed, valid for one day ``days_ago`` days ago."""
    import datetime as dt

    from fedweave.certs import _pem_key, _server_certificate, san_entry

    ca = x509.load_pem_x509_certificate((directory / "ca.pem").read_bytes())
    ca_key = serialization.load_pem_private_key((directory / "ca.key").read_bytes(), None)
    then = dt.datetime.now(dt.timezone.utc) - dt.timedelta(days=days_ago)
    names = [san_entry("localhost"), san_entry("127.0.0.1")]
    key, cert = _server_certificate(ca_key, ca.subject, "localhost", names, 1, then)
    (directory / "server.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    (directory / "server.key").write_bytes(_pem_key(key))


def test_the_coordinators_certificate_is_checked_as_sites_will_check_it(tmp_path):
    """Issue 80: an expired, a not-yet-valid, a mismatched or a foreign-signed certificate is
    one line naming the file and the fix, before the coordinator serves; `certs renew` makes
    a new one with the same CA (sites keep their ca.pem)."""
    import datetime as dt

    from fedweave.certs import (
        check_server_certificate,
        renew_server_certificate,
        serves_host,
    )

    files = init_certificates(tmp_path / "tls", ["coord.example.org"], days=20)
    now = dt.datetime.now(dt.timezone.utc)
    good = check_server_certificate(files, now)
    assert set(good.names) == {"coord.example.org", "localhost", "127.0.0.1"}
    assert serves_host(good, "coord.example.org") and serves_host(good, "0.0.0.0")
    assert not serves_host(good, "10.0.0.9")
    warning = good.expiry_warning(files, now)  # 20 days: under the 30 days warned about
    assert warning is not None and "expires on" in warning and "fedweave certs renew" in warning
    with pytest.raises(UserError, match=r"server.pem expired on .* renew it with `fedweave "
                       r"certs renew --dir .* --host NAME` \(the sites keep their ca.pem\)"):
        check_server_certificate(files, now + dt.timedelta(days=21))
    with pytest.raises(UserError, match=r"server.pem is not valid until .* set the clock right"):
        check_server_certificate(files, now - dt.timedelta(days=1))
    other = init_certificates(tmp_path / "other", ["coord.example.org"])
    (tmp_path / "tls" / "server.key").write_bytes(other.server_key.read_bytes())
    with pytest.raises(UserError, match=r"server.key is not the key of .*server.pem"):
        check_server_certificate(files, now)
    (tmp_path / "tls" / "server.pem").write_bytes(other.server_cert.read_bytes())
    with pytest.raises(UserError, match=r"server.pem was not signed by .*ca.pem"):
        check_server_certificate(files, now)
    ca_before = files.ca_cert.read_bytes()
    renew_server_certificate(tmp_path / "tls", ["coord.example.org"])
    assert files.ca_cert.read_bytes() == ca_before  # the sites' ca.pem still verifies it
    renewed = check_server_certificate(files, now)
    assert renewed.expiry_warning(files, now) is None and renewed.days_left(now) > 800
    assert mode(files.server_key) == 0o600
    (tmp_path / "tls" / "ca.key").unlink()
    with pytest.raises(UserError, match=r"cannot read .*ca.key .* renewing needs the CA's"):
        renew_server_certificate(tmp_path / "tls", ["coord.example.org"])


def test_a_site_tells_an_expired_coordinator_certificate_from_a_wrong_ca(tmp_path):
    """Issue 80: a real TLS handshake against a server with an expired certificate its CA
    did sign says the coordinator must renew it (this site's ca.pem is right); another CA
    still says get the coordinator's ca.pem."""
    import socket
    import ssl
    import threading

    from fedweave.client.reachability import explained, probe

    files = init_certificates(tmp_path / "tls", ["localhost"])
    _expired_server_certificate(tmp_path / "tls")
    other = init_certificates(tmp_path / "other", ["localhost"])
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(files.server_cert, files.server_key)
    server = socket.create_server(("127.0.0.1", 0))
    server.settimeout(10)
    port = server.getsockname()[1]

    def serve(count: int) -> None:
        for _ in range(count):
            try:
                conn, _ = server.accept()
            except OSError:
                return
            try:
                context.wrap_socket(conn, server_side=True).close()
            except (ssl.SSLError, OSError):
                pass  # the client refused the certificate: what is tested
            finally:
                conn.close()

    thread = threading.Thread(target=serve, args=(2,), daemon=True)
    thread.start()
    try:
        expired = probe("127.0.0.1", port, files.ca_cert, timeout=10)
        foreign = probe("127.0.0.1", port, other.ca_cert, timeout=10)
    finally:
        thread.join(15)
        server.close()
    assert expired.kind == "expired" and not expired.fatal
    said = explained(expired, f"127.0.0.1:{port}", files.ca_cert)
    assert "has expired" in said and "--ca-cert is right" in said and "renew" in said
    assert foreign.kind == "untrusted" and "get the coordinator's ca.pem" in explained(
        foreign, f"127.0.0.1:{port}", other.ca_cert)  # fmt: skip


def test_metrics_count_the_days_the_coordinators_certificate_has_left(tmp_path):
    import datetime as dt

    from fedweave.certs import certificate_end
    from fedweave.dashboard.prometheus import HistoryCollector
    from fedweave.dashboard.views import Views
    from fedweave.history import open_store
    from fedweave.history.alerts import AlertRules

    files = init_certificates(tmp_path / "tls", ["localhost"], days=12)
    with open_store(f"sqlite:///{tmp_path / 'h.db'}") as store:
        collector = HistoryCollector(
            Views(store, AlertRules()), certificate_ends=lambda: certificate_end(files.server_cert)
        )
        days = {s.name: s.value for f in collector.collect() for s in f.samples}
        assert 11.9 < days["fedweave_certificate_days_left"] <= 12.01
        without = HistoryCollector(Views(store, AlertRules()))
        assert "fedweave_certificate_days_left" not in {
            s.name for f in without.collect() for s in f.samples}  # fmt: skip
    assert certificate_end(tmp_path / "missing.pem") is None
    assert certificate_end(files.server_cert) > dt.datetime.now(dt.timezone.utc)


def test_the_dashboard_footer_warns_of_the_certificate_it_serves_nearing_its_end(tmp_path):
    """Issue 80: `fedweave dashboard --tls-dir` serves the coordinator's server.pem; from 30
    days before its end every page says so, with the renewal, and /metrics counts the days."""
    import datetime as dt

    from starlette.testclient import TestClient

    from fedweave.dashboard.app import certificate_notice, make_app
    from fedweave.dashboard.views import Views
    from fedweave.history import open_store
    from fedweave.history.alerts import AlertRules

    near = init_certificates(tmp_path / "near", ["localhost"], days=12)
    far = init_certificates(tmp_path / "far", ["localhost"])
    with open_store(f"sqlite:///{tmp_path / 'h.db'}") as store:
        views = Views(store, AlertRules())
        page = TestClient(make_app(views, certificate=near.server_cert)).get("/")
        assert page.status_code == 200
        assert '<footer class="muted"><p class="alert" role="alert">the certificate server.pem' in (
            page.text)  # fmt: skip
        assert "ends on" in page.text and "fedweave certs renew --dir" in page.text
        scrape = TestClient(make_app(views, certificate=near.server_cert)).get("/metrics").text
        assert "fedweave_certificate_days_left 11." in scrape
        quiet = TestClient(make_app(views, certificate=far.server_cert)).get("/")
        assert 'role="alert">the certificate' not in quiet.text
    later = dt.datetime.now(dt.timezone.utc) + dt.timedelta(days=13)
    assert "ended on" in certificate_notice(near.server_cert, later)
    assert certificate_notice(None) is None
