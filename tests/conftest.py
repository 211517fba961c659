"""Shared fixtures: database URLs for a real SQLite file and a real PostgreSQL server.

PostgreSQL comes from ``FEDWEAVE_TEST_PG_URL`` (start one with
``export FEDWEAVE_TEST_PG_URL="$(scripts/start-postgres.sh)"``); without it, or when the server
cannot be reached, the PostgreSQL cases are skipped with the reason. Each test gets its own
PostgreSQL schema (via ``search_path`` in the URL), dropped afterwards, so tests never see
each other's rows and need no database-creation rights.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

pytest_plugins = ["suite_costs"]  # each test's CPU into the JUnit XML (suite_costs.py)

PG_URL_ENVVAR = "FEDWEAVE_TEST_PG_URL"


SHARED_RAY = pytest.StashKey()
PRIVATE_RAY_ENVVAR = "FEDWEAVE_TEST_PRIVATE_RAY"
"""Set to 1 to give every simulation its own Ray instance, as outside the tests."""


def pytest_configure(config: pytest.Config) -> None:
    """Keep Flower and Ray offline in tests that call the library, as ``fedweave`` does; start
    the session's shared Ray cluster (``ray_nodes.py``) unless ``RAY_ADDRESS`` already names
    one. Under pytest-xdist each worker starts its own, not the controller: Flower sizes a
    simulation's actors from the cluster's total CPUs, so two simulations side by side on one
    cluster would wait for each other's sites, and a worker runs one test at a time.
    A test that sets a fault by environment for an in-process simulation drops ``RAY_ADDRESS``:
    the head's actors started before it and never see the variable."""
    from fedweave.offline import make_flower_offline

    make_flower_offline()
    if not hasattr(config, "workerinput") and config.getoption("numprocesses", None):
        return  # the pytest-xdist controller runs no test
    if "RAY_ADDRESS" in os.environ or os.environ.get(PRIVATE_RAY_ENVVAR) == "1":
        return
    from ray_nodes import shared_cluster

    node = shared_cluster()
    if node is not None:
        config.stash[SHARED_RAY] = node
        os.environ["RAY_ADDRESS"] = node.address


PHASE_ENVVAR = "FEDWEAVE_TEST_PHASE"
"""Which tests a run of pytest keeps (``scripts/test`` sets it): ``shared``, the tests not
marked ``alone`` (its phase with workers); ``alone``, only those (its phase in one process
after it); unset, every test. Applied after ``-k``, ``-m`` and paths, so they compose."""


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    phase = os.environ.get(PHASE_ENVVAR, "")
    if not phase:
        return
    if phase not in ("shared", "alone"):
        raise pytest.UsageError(f"{PHASE_ENVVAR}={phase!r}: use 'shared', 'alone' or unset it")
    keep = [item for item in items if (item.get_closest_marker("alone") is not None)
            == (phase == "alone")]  # fmt: skip
    if len(keep) < len(items):
        config.hook.pytest_deselected(items=[item for item in items if item not in keep])
        items[:] = keep


def pytest_unconfigure(config: pytest.Config) -> None:
    node = config.stash.get(SHARED_RAY, None)
    if node is not None:
        os.environ.pop("RAY_ADDRESS", None)
        node.stop()


def _psycopg_url(url: str) -> str:
    for prefix in ("postgres://", "postgresql://"):
        if url.startswith(prefix):
            return "postgresql+psycopg://" + url[len(prefix):]
    return url


@pytest.fixture(scope="session")
def pg_server_url() -> str:
    """The PostgreSQL server URL from the environment; skips when unset or unreachable."""
    url = os.environ.get(PG_URL_ENVVAR)
    if not url:
        pytest.skip(f"{PG_URL_ENVVAR} is not set; run "
                    f'`export {PG_URL_ENVVAR}="$(scripts/start-postgres.sh)"` for PostgreSQL tests')
    from sqlalchemy import create_engine, text

    from fedweave.errors import mask_url_password

    engine = create_engine(_psycopg_url(url), connect_args={"connect_timeout": 3})
    try:
        with engine.connect() as conn:
            conn.execute(text("SELECT 1"))
    except Exception as exc:  # any failure means "cannot test against it"
        pytest.skip(f"PostgreSQL at {mask_url_password(url)} unreachable: "
                    f"{str(exc).splitlines()[0]}")
    finally:
        engine.dispose()
    return _psycopg_url(url)


@pytest.fixture
def pg_url(pg_server_url: str) -> Iterator[str]:
    """A PostgreSQL URL whose ``search_path`` is a fresh, empty schema (dropped afterwards)."""
    from sqlalchemy import create_engine, text
    from sqlalchemy.engine import make_url

    schema = f"test_{uuid.uuid4().hex[:12]}"
    admin = create_engine(pg_server_url)
    with admin.begin() as conn:
        conn.execute(text(f'CREATE SCHEMA "{schema}"'))
    url = make_url(pg_server_url).update_query_dict({"options": f"-csearch_path={schema}"})
    try:
        yield url.render_as_string(hide_password=False)
    finally:
        with admin.begin() as conn:
            conn.execute(text(f'DROP SCHEMA "{schema}" CASCADE'))
        admin.dispose()


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request: pytest.FixtureRequest, tmp_path) -> str:
    """An empty database: a SQLite file in ``tmp_path``, or a fresh PostgreSQL schema."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'history.db'}"
    return request.getfixturevalue("pg_url")


@contextmanager
def namespace_hosts(count: int) -> Iterator[list]:
    """``count`` network namespaces on one bridge (``simulations/netns.py``), removed after;
    the test skips, saying why, where namespaces cannot be made (not root)."""
    from fedweave.simulations.netns import bridged_hosts, why_namespaces_unavailable

    why = why_namespaces_unavailable()
    if why is not None:
        pytest.skip(f"cannot make network namespaces: {why}")
    with bridged_hosts(count) as made:
        yield made


# Deployed tests: each starts a coordinator with its SuperLink and ServerApp, and a SuperNode
# and a worker per site; their deadlines are seconds. The Docker test deploys too (a coordinator
# and a site in containers), so it takes its turn with them.
DEPLOYED = ("test_deploy_", "test_dashboard_browser.py", "test_docker_image.py")


@pytest.hookimpl(optionalhook=True)  # pytest-xdist's hook: absent where xdist is not installed
def pytest_xdist_make_scheduler(config: pytest.Config, log):
    """With pytest-xdist workers (``scripts/test``): a file's tests stay on one worker (module
    fixtures are made once), and the deployed tests are one unit of work, so they run one at a
    time beside the rest of the suite: two deployments side by side on 2 cores missed their
    deadlines (docs/testing.md). (``--dist loadgroup`` cannot say this under pytest 9: xdist
    3.8 writes the group into an attribute pytest 9 no longer reads.)"""
    from xdist.scheduler import LoadScopeScheduling

    junit = config.getoption("xmlpath", None) or ".test-artefacts/junit.xml"
    seconds = previous_seconds(Path(junit))

    class DeploymentsTakeTurns(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            path = nodeid.split("::", 1)[0]
            return "deployments" if Path(path).name.startswith(DEPLOYED) else path

        def _assign_work_unit(self, node) -> None:
            """The longest unit left first (the deployments, then by the last run's seconds
            where a JUnit XML of it is at hand, else by ``FILE_SECONDS``, else by test count),
            so that no long file starts last while the other worker has nothing left."""
            def weight(scope: str) -> tuple[bool, float, int]:
                return scope == "deployments", seconds.get(scope, 0.0), len(self.workqueue[scope])

            self.workqueue.move_to_end(max(self.workqueue, key=weight), last=False)
            super()._assign_work_unit(node)

    return DeploymentsTakeTurns(config, log)


FILE_SECONDS = Path(__file__).with_name("file_seconds.json")
"""Seconds per test file of one earlier run (``scripts/test-times.py --save-seconds``): the
workers' order where no JUnit XML of an earlier run is at hand, as in a fresh clone."""


def previous_seconds(junit: Path) -> dict[str, float]:
    """Seconds per scheduling unit (a test file, or "deployments") in a previous run's JUnit
    XML (``scripts/test`` writes one every run), else in ``FILE_SECONDS``; empty when neither
    can be read."""
    import json
    import xml.etree.ElementTree as ET  # our own pytest's output, never a network reply

    per_file: dict[str, float] = {}
    try:
        cases = list(ET.parse(junit).getroot().iter("testcase"))
    except (OSError, ET.ParseError):
        try:
            per_file = json.loads(FILE_SECONDS.read_text())["seconds"]
        except (OSError, ValueError, KeyError, TypeError):
            return {}
        cases = []
    for case in cases:
        module = case.get("classname", "").split("[", 1)[0].split(".")
        while module and not module[-1].startswith("test_"):
            module.pop()  # a test class inside the module
        if module:
            path = "/".join(module) + ".py"
            per_file[path] = per_file.get(path, 0.0) + float(case.get("time", 0) or 0)
    seconds: dict[str, float] = {}
    for path, secs in per_file.items():
        scope = "deployments" if Path(path).name.startswith(DEPLOYED) else path
        seconds[scope] = seconds.get(scope, 0.0) + float(secs)
    return seconds
