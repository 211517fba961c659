"""The one version guard over fedweave's changes to Flower internals."""

import logging

import flwr
import pytest

from fedweave import flower_patches
from fedweave.errors import UserError


def test_the_pinned_flower_is_patchable():
    assert flwr.__version__ == flower_patches.PATCHED_FLOWER_VERSION
    assert flower_patches.tune_simulation_engine() is True


def test_another_flower_warns_once_and_runs_stock_or_refuses(monkeypatch, caplog):
    monkeypatch.setattr(flwr, "__version__", "9.9.9")
    monkeypatch.setattr(flower_patches, "_warned", set())
    with caplog.at_level(logging.WARNING, logger="fedweave.flower_patches"):
        assert flower_patches.tune_simulation_engine() is False
        assert flower_patches.tune_simulation_engine() is False
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 1 and "stock polls and dispatcher" in warnings[0]
    # SecAgg+ masks must match on every side: no silent fallback to Flower's generator
    with pytest.raises(UserError, match="SecAgg\\+ needs flwr 1.41.0 \\(installed: 9.9.9\\)"):
        flower_patches.use_fedweave_secagg()


def test_supernode_reply_wait_ends_once_no_clientapp_is_left(monkeypatch):
    """On Flower's own node state: the wait lasts while a ClientApp task is alive and ends
    (nothing to push) once the task finished without a reply, instead of never."""
    import threading
    import time

    from flwr.supercore.constant import TaskType
    from flwr.supercore.object_store import ObjectStoreFactory
    from flwr.supernode.nodestate.in_memory_nodestate import InMemoryNodeState

    from fedweave.flower_patches import supernode_waits

    monkeypatch.setattr(supernode_waits, "NO_TASK_GRACE_SECONDS", 0.3)
    state = InMemoryNodeState(ObjectStoreFactory().store())
    task = state.create_task(task_type=TaskType.CLIENT_APP, run_id=7, fab_hash="f" * 64)
    finisher = threading.Timer(1.0, state.finish_task, (task, "failed", "exited, no reply"))
    finisher.start()
    started = time.monotonic()
    assert supernode_waits._wait_for_replies(state) is None
    assert 1.0 <= time.monotonic() - started < 3.0  # waited for the live task, then ended
    finisher.join()


def test_stock_flower_switch_skips_the_speedups(monkeypatch):
    monkeypatch.setenv(flower_patches.STOCK_FLOWER_ENV, "1")
    assert flower_patches.tune_deployed_polling() is False
    assert flower_patches.bound_supernode_waits() is False


def test_a_restarted_site_takes_its_online_node_back(monkeypatch):
    """On Flower's own SuperLink state: a node whose site was killed still counts as online
    until its heartbeat lapses; stock Flower refuses to activate it again meanwhile, the
    patched SuperLink lets its key's holder take it over at once."""
    from flwr.server.superlink.linkstate.in_memory_linkstate import InMemoryLinkState
    from flwr.supercore.constant import NodeStatus
    from flwr.supercore.object_store import ObjectStoreFactory
    from flwr.superlink.federation.noop_federation_manager import NoOpFederationManager

    from fedweave.flower_patches import node_restarts

    monkeypatch.setattr(InMemoryLinkState, "activate_node", InMemoryLinkState.activate_node)
    state = InMemoryLinkState(NoOpFederationManager(), ObjectStoreFactory().store())
    node = state.create_node("owner", "site0", b"site0-public-key", 30)
    assert state.activate_node(node, 30) is True  # the site's first process
    assert state.activate_node(node, 30) is False  # stock: its restart is refused
    node_restarts.install()
    assert state.activate_node(node, 30) is True  # patched: the restart takes the node
    (info,) = state.get_node_info(node_ids=[node])
    assert info.status == NodeStatus.ONLINE
    unknown = 12345
    assert state.activate_node(unknown, 30) is False  # no node, nothing to take over


def _fresh_python(code: str) -> str:
    """Run ``code`` in a new interpreter (no patch applied yet: an applied patch has replaced
    the very functions whose source is fingerprinted); its stdout."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr
    return done.stdout + done.stderr


def test_every_flower_function_a_patch_relies_on_matches_its_fingerprint():
    import json

    out = _fresh_python(
        "import json\n"
        "from fedweave.flower_patches.fingerprints import WRAPPED, mismatches\n"
        "print(json.dumps({patch: mismatches(patch) for patch in WRAPPED}))\n"
    )
    changed = json.loads(out.strip().splitlines()[-1])
    assert len(changed) >= 11  # every patch, the site's ClientApp worker included
    assert not any(changed.values()), f"Flower code changed under these patches: {changed}"


def test_an_altered_flower_function_is_named_and_its_patch_not_applied():
    out = _fresh_python(
        "import logging\n"
        "logging.basicConfig(level=logging.WARNING)\n"
        "from flwr.superlink.grid import http_grid\n"
        "def send_and_receive(self, messages, *, timeout=None):\n"
        "    return []  # an edited copy of Flower\n"
        "http_grid.HttpGrid.send_and_receive = send_and_receive\n"
        "import flwr.superlink.main as main\n"
        "main._get_middleware = lambda: []\n"
        "from fedweave import flower_patches\n"
        "print('speed-up applied:', flower_patches.tune_deployed_polling())\n"
        "print('security:', flower_patches.security_patch_problem())\n"
    )
    assert "speed-up applied: False" in out
    assert "changed here: flwr.superlink.grid.http_grid:HttpGrid.send_and_receive" in out
    assert "security: Flower's code differs from flwr 1.41.0's " \
           "(flwr.superlink.main:_get_middleware)" in out
