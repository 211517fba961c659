"""``openssl s_client`` against a default coordinator: TLS 1.2 accepts AEAD suites only (ECDHE
with AES-GCM or ChaCha20-Poly1305), TLS 1.3 is offered, TLS 1.1 and older are not.

Every TLS 1.2 suite this machine's OpenSSL knows is offered alone, one connection each.
"""

from __future__ import annotations

import shutil
import signal
import subprocess

import pytest
from test_deploy_support import Processes, free_port, make_deployment, wait_for

AEAD_MARKERS = ("GCM", "CHACHA20", "CCM")


def _handshake(port: int, *options: str) -> bool:
    done = subprocess.run(
        ["openssl", "s_client", "-connect", f"127.0.0.1:{port}", "-servername", "localhost",
         *options],
        input="", capture_output=True, text=True, timeout=20,
    )  # fmt: skip
    return done.returncode == 0 and "Cipher is (NONE)" not in done.stdout


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_coordinator_offers_only_aead_suites(tmp_path):
    if shutil.which("openssl") is None:
        pytest.skip("openssl is not installed")
    make_deployment(tmp_path, sites=1)
    port = free_port()
    procs = Processes(tmp_path)
    try:
        coordinator = procs.start(
            "coordinator", "coordinator", "--address", f"127.0.0.1:{port}", "--task", "digits",
            "--min-clients", "3", "--db", f"sqlite:///{tmp_path / 'h.db'}", "--tls-dir", "tls",
            "--test-data", "split/test.npz", "--once",
        )  # fmt: skip
        wait_for(
            lambda: "sites connected" in procs.output("coordinator"), 120,
            "the SuperLink to listen", coordinator, lambda: procs.output("coordinator"),
        )  # fmt: skip
        suites = subprocess.run(
            ["openssl", "ciphers", "-tls1_2", "ALL:COMPLEMENTOFALL"],
            capture_output=True, text=True, check=True,
        ).stdout.strip().split(":")  # fmt: skip
        tls12 = [s for s in suites if not s.startswith("TLS_")]  # TLS 1.3 names start TLS_
        accepted = [s for s in tls12 if _handshake(port, "-tls1_2", "-cipher", s)]
        print(f"TLS 1.2: {len(accepted)} of {len(tls12)} suites accepted: {', '.join(accepted)}")
        assert accepted, "no TLS 1.2 suite accepted at all"
        assert all(any(m in s for m in AEAD_MARKERS) for s in accepted), accepted
        assert all(s.startswith(("ECDHE-",)) for s in accepted), accepted
        assert _handshake(port, "-tls1_3")
        for old in ("-tls1_1", "-tls1"):
            assert not _handshake(port, old, "-cipher", "ALL:@SECLEVEL=0"), old
        coordinator.send_signal(signal.SIGTERM)
        coordinator.wait(30)
    finally:
        procs.close()
