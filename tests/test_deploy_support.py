"""Helpers for the deployment tests: real ``fedweave`` processes on loopback, each in its own
process group (killed as a group, so no SuperLink/SuperNode/flwr-* process outlives a test).

Holds no tests itself; ``test_deploy_*.py`` import it (pytest puts ``tests/`` on sys.path).
"""

from __future__ import annotations

import atexit
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def fedweave_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "fedweave.cli", *args]


def free_port() -> int:
    from fedweave.addresses import free_port as drawn

    return drawn()


def run_fedweave(
    *args: str, cwd: Path, timeout: float = 120, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    """Run a short fedweave command to completion (its own group; killed on timeout;
    ``env`` added to its environment)."""
    proc = subprocess.Popen(
        fedweave_cmd(*args),
        cwd=cwd,
        env={**os.environ, **env} if env else None,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        kill_group(proc)
        out, err = proc.communicate()
        raise AssertionError(
            f"fedweave {' '.join(args)} timed out; stderr: {err[-2000:]}"
        ) from None
    finally:
        kill_group(proc)
    return subprocess.CompletedProcess(args, proc.returncode, out, err)


class Processes:
    """Long-running fedweave processes of one test; ``close()`` kills every group."""

    def __init__(self, cwd: Path) -> None:
        self.cwd = cwd
        self.procs: list[subprocess.Popen] = []

    def start(
        self, name: str, *args: str, host=None, env: dict[str, str] | None = None
    ) -> subprocess.Popen:
        """Start ``fedweave ARGS`` (inside ``host``'s network namespace when given, a
        ``fedweave.simulations.netns.Host``; ``env`` added to this process's environment)."""
        out = open(self.cwd / f"{name}.out", "w")  # noqa: SIM115 - the child owns it
        argv = fedweave_cmd(*args)
        proc = subprocess.Popen(
            host.command(argv) if host is not None else argv,
            cwd=self.cwd,
            stdout=out,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
            env={**os.environ, **env} if env else None,
        )
        proc.name = name  # type: ignore[attr-defined]
        self.procs.append(proc)
        return proc

    def output(self, name: str) -> str:
        path = self.cwd / f"{name}.out"
        return path.read_text(errors="replace") if path.exists() else ""

    def close(self) -> None:
        for proc in self.procs:
            kill_group(proc)


def kill_group(proc: subprocess.Popen, sig: int = signal.SIGKILL) -> None:
    try:
        os.killpg(proc.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass
    if sig == signal.SIGKILL:
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            pass


def signal_tree(proc: subprocess.Popen, sig: int) -> list[int]:
    """Send ``sig`` to a process and all its descendants at once (whatever sessions they
    started); returns the pids signalled."""
    table: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                table[int(entry.name)] = int(
                    (entry / "stat").read_text().rsplit(")", 1)[1].split()[1]
                )
            except (OSError, IndexError, ValueError):
                pass
    tree, queue = [proc.pid], [proc.pid]
    while queue:
        parent = queue.pop()
        for pid, ppid in table.items():
            if ppid == parent:
                tree.append(pid)
                queue.append(pid)
    for pid in tree:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass
    return tree


def kill_tree_now(proc: subprocess.Popen) -> list[int]:
    """SIGKILL a process and all its descendants at once (a machine losing the processes, not
    a polite stop); returns the pids killed."""
    tree = signal_tree(proc, signal.SIGKILL)
    proc.wait(10)
    return tree


def wait_for(
    predicate: Callable[[], object],
    timeout: float,
    what: str,
    alive: subprocess.Popen | None = None,
    log: Callable[[], str] | None = None,
):
    """Poll ``predicate`` until truthy; fail naming ``what`` (and a log tail) on timeout."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        if alive is not None and alive.poll() is not None:
            raise AssertionError(
                f"process exited ({alive.returncode}) while waiting for {what}: "
                f"{(log() if log else '')[-3000:]}"
            )
        time.sleep(0.25)
    raise AssertionError(
        f"timed out after {timeout:.0f} s waiting for {what}: {(log() if log else '')[-3000:]}"
    )


def start_coordinator(
    procs: Processes, *args: str, timeout: float = 60, env: dict[str, str] | None = None
) -> subprocess.Popen:
    """Start ``fedweave ARGS`` (a coordinator, e.g. ``coordinator_args(...)``; ``env`` added
    to its environment) as ``coordinator`` and wait until it listens (its console says
    ``sites connected``)."""
    proc = procs.start("coordinator", *args, env=env)
    wait_for(
        lambda: "sites connected" in procs.output("coordinator"), timeout,
        "the coordinator to listen", proc, lambda: procs.output("coordinator"),
    )  # fmt: skip
    return proc


def wait_for_success(
    procs: Processes, proc: subprocess.Popen, what: str, timeout: float = 600
) -> str:
    """Wait for ``proc`` (started by ``procs``) to exit, assert it exited 0, return its output."""
    name = proc.name  # type: ignore[attr-defined]
    wait_for(lambda: proc.poll() is not None, timeout, what, log=lambda: procs.output(name))
    out = procs.output(name)
    assert proc.returncode == 0, out
    return out


def recorded(db_url: str) -> tuple[list[dict], list[dict], object]:
    """(rounds, site rows, run info) of the only run in the history (empty before it exists)."""
    from fedweave.history import open_store

    store = open_store(db_url)
    try:
        runs = store.list_runs()
        if not runs:
            return [], [], None
        run = runs[0]
        return store.rounds(run.run_id), store.site_results(run.run_id), store.get_run(run.run_id)
    finally:
        store.close()


def refused_every_round(db_url: str, rounds: int, sites: int) -> list[dict]:
    """Check the run completed ``rounds`` rounds, in each of which exactly one of ``sites``
    sampled sites refused (its own status, sent as data) and the others replied; return the
    refusing site's row of each round."""
    recorded_rounds, site_rows, run = recorded(db_url)
    assert [r["round"] for r in recorded_rounds] == list(range(1, rounds + 1))
    assert run.status == "completed"
    assert recorded_rounds[-1]["eval_accuracy"] > 0.5  # chance is 0.1 on ten digits
    failed_rows = []
    for n in range(1, rounds + 1):
        rows = [s for s in site_rows if s["round"] == n]
        assert sorted(s["status"] for s in rows) == ["ok"] * (sites - 1) + ["refused"], rows
        failed_rows += [s for s in rows if s["status"] == "refused"]
    return failed_rows


_MADE: dict[tuple[int, int], Path] = {}


def make_deployment(root: Path, sites: int, unregistered: int = 0) -> None:
    """Certificates, site keys (``sites`` registered, ``unregistered`` not) and a data split in
    ``root``, made with the fedweave commands a user would run.

    The commands run once per test session for each ``(sites, unregistered)``, into a folder
    of their own; every test then gets a copy of it (modes kept: site keys stay 0600), so a
    test that registers, revokes or edits a file changes only its own copy (each command is
    a new Python process, about a second here; a deployed test ran 4 to 12 of them).
    """
    made = _MADE.get((sites, unregistered))
    if made is None:
        made = Path(tempfile.mkdtemp(prefix=f"fedweave-deployment-{sites}-{unregistered}-"))
        atexit.register(shutil.rmtree, made, ignore_errors=True)
        _make_deployment_here(made, sites, unregistered)
        _MADE[(sites, unregistered)] = made
    shutil.copytree(made, root, dirs_exist_ok=True)


def _make_deployment_here(root: Path, sites: int, unregistered: int) -> None:
    for args in (
        ("certs", "init", "--out", "tls", "--host", "localhost"),
        ("data", "split", "--task", "digits", "--clients", str(sites), "--partition", "iid",
         "--seed", "0", "--out", "split"),
    ):  # fmt: skip
        done = run_fedweave(*args, cwd=root)
        assert done.returncode == 0, done.stderr
    for i in range(sites + unregistered):
        done = run_fedweave("sites", "new-key", "--out", f"site{i}.key", cwd=root)
        assert done.returncode == 0, done.stderr
        if i < sites:
            done = run_fedweave("sites", "add-key", "tls", f"site{i}.pub", cwd=root)
            assert done.returncode == 0, done.stderr


def register_named_sites(root: Path, names: list[str]) -> None:
    """A CA and server certificate in ``root/tls`` and, for site ``i``, a key pair
    ``site<i>.key`` / ``.pub`` registered under ``names[i]``, made with the commands a user
    runs (``new-key`` naming the ``.pub`` it wrote)."""
    done = run_fedweave("certs", "init", "--out", "tls", "--host", "localhost", cwd=root)
    assert done.returncode == 0, done.stderr
    for i, name in enumerate(names):
        done = run_fedweave("sites", "new-key", "--out", f"site{i}.key", cwd=root)
        assert done.returncode == 0 and f"site{i}.pub" in done.stdout, done.stderr
        done = run_fedweave("sites", "add-key", "tls", f"site{i}.pub", "--name", name, cwd=root)
        assert done.returncode == 0, done.stderr


FIXED_DEADLINE = "120"
"""The round deadline the deployed tests give (``--round-timeout``) unless they say otherwise:
the 120 s floor a default deadline is sized to on ``digits``. Sizing it times the task's local
training in the coordinator process, which otherwise loads no torch (~5 s of CPU, ~3 s before
it listens, in every deployed test); tests of a default deadline pass ``sized_deadline=True``
(test_deploy_e2e's first test; the sizing itself: test_round_deadlines.py)."""


def coordinator_args(
    port: int, db: str, rounds: int, sites: int, *extra: str, sized_deadline: bool = False
) -> list[str]:
    deadline = [] if sized_deadline or "--round-timeout" in extra else [
        "--round-timeout", FIXED_DEADLINE]  # fmt: skip
    return [
        "coordinator",
        "--address",
        f"127.0.0.1:{port}",
        "--task",
        "digits",
        "--rounds",
        str(rounds),
        "--min-clients",
        str(sites),
        "--db",
        db,
        "--tls-dir",
        "tls",
        "--test-data",
        "split/test.npz",
        "--local-epochs",
        "2",
        *deadline,
        *extra,
    ]


def site_args(port: int, index: int, key_index: int | None = None, *extra: str) -> list[str]:
    key = index if key_index is None else key_index
    return [
        "client",
        "--coordinator",
        f"127.0.0.1:{port}",
        "--task",
        "digits",
        "--data",
        f"split/site-{index}.npz" if index >= 0 else "split/site-0.npz",
        "--ca-cert",
        "tls/ca.pem",
        "--site-key",
        f"site{key}.key",
        "--log-file",
        f"site{key}-{index}.log",
        *extra,
    ]


def descendants(pid: int) -> list[int]:
    """Pids of ``pid``'s living descendants (children, their children, ...), from /proc: every
    Flower process a coordinator started, while it lives."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            state, ppid = (entry / "stat").read_text().rsplit(")", 1)[1].split()[:2]
        except (OSError, ValueError):
            continue
        if state != "Z":
            parents[int(entry.name)] = int(ppid)
    found: list[int] = []
    frontier = {pid}
    while frontier:
        children = [child for child, parent in parents.items() if parent in frontier]
        found += children
        frontier = set(children)
    return found


def alive(pids: list[int]) -> list[int]:
    """Those of ``pids`` that still run (not zombies)."""
    living = []
    for pid in pids:
        try:
            if Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z":
                living.append(pid)
        except (OSError, IndexError):
            continue
    return living


def processes_mentioning(text: str) -> list[int]:
    """Pids whose command line or environment contains ``text``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if (entry / "stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
                continue
            blob = (entry / "cmdline").read_bytes() + (entry / "environ").read_bytes()
        except OSError:
            continue
        if text.encode() in blob:
            found.append(int(entry.name))
    return found
