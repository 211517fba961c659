"""The pieces that close the coordinator's doors, one by one (the whole, against real Flower
processes from another network namespace, is ``test_deploy_outsider.py``)."""

from __future__ import annotations

import asyncio
import hashlib
import io
import zipfile
from types import SimpleNamespace

import pytest

from fedweave.app_bundle import bundle_problem
from fedweave.coordinator.command.superlink import build_fab
from fedweave.flower_patches import fingerprints, security_patch_problem
from fedweave.flower_patches.admin_apis import LocalAdminOnly, is_local_caller


@pytest.mark.parametrize(
    ("client", "server", "local"),
    [
        ("127.0.0.1", "127.0.0.1", True),
        ("127.0.0.5", "10.0.0.1", True),  # any loopback address
        ("::1", "::1", True),
        ("::ffff:127.0.0.1", "0.0.0.0", True),
        ("10.0.0.1", "10.0.0.1", True),  # this host reaching its own address (the SuperExec)
        ("10.0.0.2", "10.0.0.1", False),  # another host
        ("fd00::2", "fd00::1", False),
        ("testclient", "testserver", False),  # not an address: never trusted
        (None, "10.0.0.1", False),
    ],
)
def test_local_caller(client, server, local):
    assert is_local_caller(client, server) is local


def _call(path: str, client: str, server: str = "10.0.0.1") -> tuple[int, list]:
    reached = []

    async def app(scope, receive, send):
        reached.append(scope["path"])
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    sent = []

    async def send(message):
        sent.append(message)

    async def receive():
        return {"type": "http.request", "body": b""}

    scope = {"type": "http", "path": path, "client": (client, 40000), "server": (server, 9092)}
    asyncio.run(LocalAdminOnly(app)(scope, receive, send))
    return sent[0]["status"], reached


def test_admin_paths_answer_this_machine_only():
    for path in ("/v1/control/start-run", "/v1/control/register-node",
                 "/v1/runtime/acquire-task", "/docs", "/openapi.json"):  # fmt: skip
        assert _call(path, "10.0.0.2") == (403, []), path
        assert _call(path, "127.0.0.1") == (200, [path]), path
    # the sites' Fleet API and health checks stay open to everyone
    assert _call("/v1/fleet/pull-messages", "10.0.0.2") == (200, ["/v1/fleet/pull-messages"])
    assert _call("/health", "10.0.0.2")[0] == 200


def _fab(files: dict[str, bytes]) -> bytes:
    from flwr.cli.build import build_fab_from_files

    return build_fab_from_files(files)[0]


def _pyproject(serverapp: str, clientapp: str) -> bytes:
    return (
        '[build-system]\nrequires = ["hatchling"]\nbuild-backend = "hatchling.build"\n'
        '[project]\nname = "x"\nversion = "1.0.0"\ndependencies = []\n'
        '[tool.flwr.app]\npublisher = "x"\n[tool.flwr.app.components]\n'
        f'serverapp = "{serverapp}"\nclientapp = "{clientapp}"\n[tool.flwr.app.config]\n'
    ).encode()


def test_only_fedweaves_own_bundles_pass():
    from fedweave.contract import CLIENT_APP_REF, SERVER_APP_REF

    assert bundle_problem(build_fab({"rounds": 3})) is None
    ours = _pyproject(SERVER_APP_REF, CLIENT_APP_REF)
    carrying = _fab({"pyproject.toml": ours, "README.md": b"x", "evil.py": b"import os"})
    assert "carries files (evil.py)" in bundle_problem(carrying)
    shadowing = _fab({"pyproject.toml": ours, "README.md": b"x",
                      "fedweave/client/deployed_app.py": b"app = None"})  # fmt: skip
    assert "carries files" in bundle_problem(shadowing)
    foreign = _fab({"pyproject.toml": _pyproject("evil:app", CLIENT_APP_REF), "README.md": b"x"})
    assert "serverapp 'evil:app'" in bundle_problem(foreign)
    foreign = _fab({"pyproject.toml": _pyproject(SERVER_APP_REF, "evil:app"), "README.md": b"x"})
    assert "clientapp 'evil:app'" in bundle_problem(foreign)
    assert "not a FAB" in bundle_problem(b"not a zip")
    empty = io.BytesIO()
    zipfile.ZipFile(empty, "w").close()
    assert "not a FAB" in bundle_problem(empty.getvalue())
    assert "bytes" in bundle_problem(b"x" * (2 << 20))


def test_the_site_worker_runs_fedweaves_app_and_refuses_any_other(capsys):
    from flwr.supercore.fab import Fab

    from fedweave.client.deployed_app import app as our_app
    from fedweave.client.worker import NOTICE_PREFIX, ClientAppRunner, ForeignRunRefused

    def fab(content: bytes) -> Fab:
        return Fab(hashlib.sha256(content).hexdigest(), content, {})

    runner = ClientAppRunner("127.0.0.1:1")  # no connection is made for this
    run = SimpleNamespace(run_id=42, fab_id="x", fab_version="1")
    assert runner._client_app(run, fab(build_fab({"rounds": 1}))) is our_app
    from fedweave.contract import CLIENT_APP_REF, SERVER_APP_REF

    evil = fab(_fab({"pyproject.toml": _pyproject(SERVER_APP_REF, CLIENT_APP_REF),
                     "README.md": b"x", "evil.py": b"raise SystemExit"}))  # fmt: skip
    for _ in range(2):
        with pytest.raises(ForeignRunRefused, match="run 42: the bundle"):
            runner._client_app(run, evil)
    out = capsys.readouterr().out.splitlines()
    notices = [line for line in out if line.startswith(NOTICE_PREFIX)]
    assert notices == [NOTICE_PREFIX + "refused run 42: the bundle carries files (evil.py); "
                       "code never travels"]  # fmt: skip


def test_security_patches_check_their_fingerprints(monkeypatch):
    assert security_patch_problem() is None  # the pinned Flower, unmodified
    ref = "flwr.superlink.main:_get_middleware"
    monkeypatch.setitem(fingerprints.WRAPPED, "admin_apis", {ref: "0" * 16})
    problem = security_patch_problem()
    assert problem is not None and ref in problem and "reinstall flwr==" in problem


def test_flowers_real_app_refuses_other_hosts_whatever_the_path_spelling():
    """Flower's own SuperLink app with the patches on, called as another host would: every
    spelling that reaches an administrative route is refused, the rest route nowhere (fresh
    interpreter: the patches replace Flower functions process-wide)."""
    import subprocess
    import sys

    code = (
        "from starlette.testclient import TestClient\n"
        "from fedweave.flower_patches import close_control_surface\n"
        "close_control_surface()\n"
        "from flwr.superlink.main import create_app\n"
        "client = TestClient(create_app(), client=('10.0.0.2', 5555),\n"
        "                    base_url='http://10.0.0.1:9092')\n"
        "for path in ['/v1/control/list-nodes', '/v1/control/list-nodes/',\n"
        "             '/v1/%63ontrol/list-nodes', '//v1/control/list-nodes',\n"
        "             '/V1/control/list-nodes', '/v1/runtime/acquire-task', '/openapi.json']:\n"
        "    response = client.post(path, content=b'',\n"
        "                           headers={'content-type': 'application/protobuf'})\n"
        "    print(path, response.status_code)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr
    status = dict(line.split() for line in done.stdout.splitlines())
    assert status == {
        "/v1/control/list-nodes": "403",
        "/v1/control/list-nodes/": "403",
        "/v1/%63ontrol/list-nodes": "403",  # percent-decoded before the gate and the router
        "//v1/control/list-nodes": "404",  # matches no route either
        "/V1/control/list-nodes": "404",
        "/v1/runtime/acquire-task": "403",
        "/openapi.json": "403",
    }, status


def test_what_an_outsider_sends_cannot_grow_the_coordinators_memory_or_disk(tmp_path, monkeypatch):
    """Refused callers are logged once each, up to a bound; refused site keys are noted once
    each, up to a bound (anyone with the CA certificate can sign with fresh keys)."""
    import json

    from cryptography.hazmat.primitives.asymmetric import ec
    from flwr.supercore.primitives.asymmetric import public_key_to_bytes

    from fedweave.flower_patches import admin_apis, refused_keys

    monkeypatch.setattr(admin_apis, "MAX_LOGGED_CALLERS", 3)
    gate = LocalAdminOnly(None)  # never reaches the app: every caller below is refused
    sent = []

    async def send(message):
        sent.append(message)

    for i in range(10):
        for path in ("/v1/control/a", "/v1/control/b"):
            scope = {"type": "http", "path": path, "client": (f"10.0.0.{i + 2}", 1),
                     "server": ("10.0.0.1", 9092)}  # fmt: skip
            asyncio.run(gate(scope, None, send))
    assert len(gate._logged) == 3
    assert [m["status"] for m in sent if "status" in m] == [403] * 20

    monkeypatch.setattr(refused_keys, "MAX_NOTED_KEYS", 4)
    notes, noted = tmp_path / "refused.jsonl", set()
    keys = [public_key_to_bytes(ec.generate_private_key(ec.SECP384R1()).public_key())
            for _ in range(6)]  # fmt: skip
    for key in keys + keys:  # every key tried twice
        refused_keys.note_refusal(str(notes), key, noted)
    lines = [json.loads(line) for line in notes.read_text().splitlines()]
    assert [line["fingerprint"] for line in lines] == [
        refused_keys.ssh_fingerprint(key) for key in keys[:4]
    ]
    assert all(line["fingerprint"].startswith("SHA256:") for line in lines)


def test_a_key_refused_before_registration_is_named_again_once_revoked(tmp_path):
    """A site that connects a moment before its key is registered is refused and noted; once
    registered it activates; revoked later, its next refusal is noted again and the console
    names it revoked (both were noted once per key before: the revocation went unsaid)."""
    import json

    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from flwr.supercore.primitives.asymmetric import public_key_to_bytes

    from fedweave.certs import remove_site_key
    from fedweave.coordinator.command.refused_key_notices import RefusedKeys
    from fedweave.flower_patches import refused_keys

    private = ec.generate_private_key(ec.SECP384R1())
    key = public_key_to_bytes(private.public_key())
    (tmp_path / "tls" / "sites").mkdir(parents=True)
    (tmp_path / "tls" / "sites" / "site2.pub").write_bytes(
        private.public_key().public_bytes(
            serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH
        )
    )

    class State:  # the two answers Flower's link state gives the wrapped handler
        node = None

        def get_node_id_by_public_key(self, _key):
            return self.node

    notes = tmp_path / "refused.jsonl"
    shown: list[str] = []
    console = RefusedKeys(notes, tmp_path / "tls", shown.append)
    state = State()
    stock = lambda request, state: None  # noqa: E731 - Flower's handler, not under test
    import flwr.superlink.servicer.fleet.fleet_handlers as handlers

    original = handlers.activate_node
    handlers.activate_node = stock
    try:
        import os

        os.environ[refused_keys.REFUSED_KEYS_FILE_ENV] = str(notes)
        refused_keys.install()
        request = type("Request", (), {"public_key": key})()
        handlers.activate_node(request, state)  # before registration: refused, noted
        handlers.activate_node(request, state)  # retried: not noted twice
        console.poll()
        state.node = 7  # registered: activates
        handlers.activate_node(request, state)
        remove_site_key(tmp_path / "tls", "site2")
        state.node = None  # revoked: refused again
        handlers.activate_node(request, state)
        console.poll()
    finally:
        handlers.activate_node = original
        os.environ.pop(refused_keys.REFUSED_KEYS_FILE_ENV, None)
    assert len(notes.read_text().splitlines()) == 2
    assert json.loads(notes.read_text().splitlines()[1])["fingerprint"].startswith("SHA256:")
    assert len(shown) == 2
    assert "not registered" in shown[0] and "site2's key, revoked" in shown[1]
