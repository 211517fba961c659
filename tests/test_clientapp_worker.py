"""The site's long-lived ClientApp worker: its supervisor restarts it when it dies and stops
it cleanly. (That deployed sites use it, and what a crash mid-message does to the round, is in
``test_deploy_worker.py``.)"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from fedweave.client.worker import INPUTS_OK, INPUTS_PREFIX
from fedweave.client.worker_supervisor import WorkerSupervisor, worker_command


def _pids(path: Path) -> list[int]:
    return [int(p) for p in path.read_text().split()] if path.exists() else []


def test_the_supervisor_restarts_a_dying_worker_and_stops_the_running_one(tmp_path):
    pids = tmp_path / "pids"
    script = (
        "import os, sys, time\n"
        f"open({str(pids)!r}, 'a').write(f'{{os.getpid()}}\\n')\n"
        f"if len(open({str(pids)!r}).read().split()) < 3: sys.exit(3)\n"
        "time.sleep(600)\n"
    )  # dies twice at once, then stays up like a healthy worker
    notices: list[str] = []
    supervisor = WorkerSupervisor(
        [sys.executable, "-c", script], {}, tmp_path / "site.log", notices.append
    ).start()
    try:
        deadline = time.monotonic() + 30
        while len(_pids(pids)) < 3 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert len(set(_pids(pids))) == 3, notices
        assert supervisor.restarts == 2
        assert all("worker exited (code 3); restarting it" in n for n in notices), notices
        time.sleep(0.5)
        running = supervisor.pid()
        assert running == _pids(pids)[-1]
    finally:
        supervisor.stop()
    assert supervisor.pid() is None
    assert not Path(f"/proc/{running}").exists() or "Z" in _state(running)
    assert supervisor.restarts == 2  # stopping is not a crash: no restart after it


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "gone"


def test_the_site_hears_whether_the_first_worker_read_its_task_and_data(tmp_path):
    """The verdict of the first worker decides; one that dies before it is a problem too."""

    def verdict(script: str, timeout: float = 30) -> str | None:
        supervisor = WorkerSupervisor(
            [sys.executable, "-c", script], {}, tmp_path / "site.log", lambda _: None
        ).start()
        try:
            return supervisor.inputs_problem(timeout)
        finally:
            supervisor.stop()

    said = "import time; print({!r}, flush=True); time.sleep(600)"
    assert verdict(said.format(INPUTS_PREFIX + INPUTS_OK)) is None
    problem = "data file /x.npz does not exist; pass --data with a .npz or .csv file"
    assert verdict(said.format(INPUTS_PREFIX + problem)) == problem
    died = verdict("import sys; print('starting', flush=True); sys.exit(7)")
    assert "exited (code 7) before it had read the task and data" in (died or ""), died
    assert "site.log" in died
    slow = verdict("import time; time.sleep(600)", timeout=0.5)
    assert "had not read the task and data after 0 s" in (slow or ""), slow


def test_the_worker_command_names_the_sites_task_and_data(tmp_path):
    data = tmp_path / "site.csv"
    cmd = worker_command("127.0.0.1:9094", "digits", data, "label")
    assert cmd[1:3] == ["-m", "fedweave.client.worker"]
    assert cmd[cmd.index("--runtime-api-address") + 1] == "127.0.0.1:9094"
    assert cmd[cmd.index("--data") + 1] == str(data.resolve())
    assert cmd[-2:] == ["--label-column", "label"]
    assert "--eval-data" not in cmd
    held_out = worker_command("127.0.0.1:9094", "digits", data, None, tmp_path / "eval.csv")
    assert held_out[held_out.index("--eval-data") + 1] == str((tmp_path / "eval.csv").resolve())


def test_the_worker_stops_when_its_site_process_is_killed():
    """A site killed with kill -9 leaves no worker behind (it used to retry a vanished
    SuperNode's Runtime API forever, holding torch and the data)."""
    import subprocess
    import sys
    import time

    from fedweave.addresses import free_port
    from fedweave.history.liveness import pid_alive

    port = free_port()  # nothing listens: the worker keeps retrying, as after its site died
    launcher = subprocess.Popen(
        [sys.executable, "-c",
         "import subprocess, sys, time\n"
         "worker = subprocess.Popen([sys.executable, '-m', 'fedweave.client.worker',\n"
         f"    '--runtime-api-address', '127.0.0.1:{port}'])\n"
         "print(worker.pid, flush=True)\n"
         "time.sleep(300)\n"],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        worker = int(launcher.stdout.readline())
        time.sleep(4)  # up, and retrying the absent Runtime API
        assert pid_alive(worker)
        launcher.kill()
        launcher.wait()
        deadline = time.monotonic() + 15
        while pid_alive(worker) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not pid_alive(worker)
    finally:
        launcher.kill()
