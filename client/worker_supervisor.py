"""Starts a site's ClientApp worker (``fedweave.client.worker``) and starts it again if it
dies, so the site operator still runs one command. The first worker's word on the site's task
and data (``inputs_problem``) decides whether the site connects at all.

A worker that dies mid-message loses only that message: Flower's SuperNode answers it with its
"ClientApp crashed" error once the worker's heartbeat is missed, and the coordinator records the
site failed for that round. The new worker takes the next message. Restarts wait 1 s, doubling
to 30 s while the worker keeps dying within a minute of its start.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

from fedweave.private_files import open_private
from fedweave.processes import stop_process_group, tied_to_us

STABLE_SECONDS = 60.0
"""A worker that ran this long before dying is restarted after the shortest wait again."""


def worker_command(
    runtime_api_address: str,
    task: str,
    data: Path,
    label_column: str | None,
    eval_data: Path | None = None,
    columns: Path | None = None,
    device: str | None = None,
    nproc: int = 1,
    more_tasks: dict[str, Path] | None = None,
) -> list[str]:
    """The worker's command line for this site (``eval_data``: its ``--eval-data``, read at
    start with ``data``; ``columns``: its column map, ``--columns``; ``device`` and
    ``nproc``: where and in how many processes it trains, checked at start; ``more_tasks``:
    its other tasks and their data files, read at start too)."""
    cmd = [
        sys.executable, "-m", "fedweave.client.worker",
        "--runtime-api-address", runtime_api_address,
        "--task", task, "--data", str(data.resolve()),
    ]  # fmt: skip
    if eval_data is not None:
        cmd += ["--eval-data", str(eval_data.resolve())]
    if columns is not None:
        cmd += ["--columns", str(columns.resolve())]
    if device:
        cmd += ["--device", device]
    if nproc != 1:
        cmd += ["--nproc-per-node", str(nproc)]
    if more_tasks:
        cmd += ["--more-tasks", more_tasks_entry(more_tasks)]
    return cmd + (["--label-column", label_column] if label_column else [])


def more_tasks_entry(more_tasks: dict[str, Path]) -> str:
    """``--more-tasks`` as the worker and the node config take it: absolute paths."""
    return ",".join(f"{task}={path.resolve()}" for task, path in more_tasks.items())


MAX_RECORD_CHARS = 64 * 1024
"""A site record longer than this (a task reporting thousands of metrics) is not kept."""


class WorkerSupervisor:
    """Keeps one worker process alive until ``stop()``.

    Args:
        command: the worker's command line (``worker_command``).
        env: its environment.
        log_path: file its output is appended to (the site's log).
        echo: where restart notices go (the operator's terminal).
        on_record: given each site record the worker reports (``client/mods.py``'s
            ``site_record``, a dict); default: dropped.
    """

    def __init__(
        self,
        command: list[str],
        env: dict[str, str],
        log_path: Path,
        echo: Callable[[str], None],
        on_record: Callable[[dict], None] | None = None,
    ) -> None:
        self.command, self.env, self.log_path, self.echo = command, env, log_path, echo
        self.on_record = on_record
        self.restarts = 0
        self._inputs_read = threading.Event()  # the first worker's verdict is in
        self._inputs_problem: str | None = None
        self._stop = threading.Event()
        self._proc: subprocess.Popen | None = None
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._keep_alive, name="worker", daemon=True)

    def start(self) -> WorkerSupervisor:
        self._thread.start()
        return self

    def _spawn(self) -> subprocess.Popen:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open_private(self.log_path, "ab") as log:
            proc = subprocess.Popen(
                self.command, stdout=subprocess.PIPE, stderr=log, stdin=subprocess.DEVNULL,
                env=self.env, text=True, errors="replace", **tied_to_us(),
            )  # fmt: skip
        self._copier = threading.Thread(target=self._copy_stdout, args=(proc,), daemon=True)
        self._copier.start()
        return proc

    def _copy_stdout(self, proc: subprocess.Popen) -> None:
        """The worker's stdout to the log; its notices (``NOTICE_PREFIX``) to the console;
        its records (``RECORD_PREFIX``) to ``on_record``."""
        from fedweave.client.worker import INPUTS_OK, INPUTS_PREFIX, NOTICE_PREFIX, RECORD_PREFIX

        with open_private(self.log_path, "a", encoding="utf-8") as log:
            for line in proc.stdout:
                if line.startswith(RECORD_PREFIX):
                    self._record(line[len(RECORD_PREFIX) :])
                    continue
                if line.startswith(INPUTS_PREFIX) and not self._inputs_read.is_set():
                    verdict = line[len(INPUTS_PREFIX) :].strip()
                    self._inputs_problem = None if verdict == INPUTS_OK else verdict
                    self._inputs_read.set()
                    continue  # the worker logged a problem itself
                log.write(line)
                log.flush()
                if line.startswith(NOTICE_PREFIX):
                    self.echo(line[len(NOTICE_PREFIX) :].rstrip())

    def _record(self, text: str) -> None:
        import json

        if self.on_record is None or len(text) > MAX_RECORD_CHARS:
            return
        try:
            record = json.loads(text)
        except ValueError:
            return
        if isinstance(record, dict):
            self.on_record(record)

    def _keep_alive(self) -> None:
        wait = 1.0
        while not self._stop.is_set():
            with self._lock:
                if self._stop.is_set():
                    return
                self._proc = proc = self._spawn()
            started = time.monotonic()
            code = proc.wait()
            if not self._inputs_read.is_set():
                self._copier.join(5)  # its last lines may still be in the pipe
            if not self._inputs_read.is_set():
                self._inputs_problem = (
                    f"the site's ClientApp worker exited (code {code}) before it had read the "
                    f"task and data; see {self.log_path}"
                )
                self._inputs_read.set()
            if self._stop.is_set():
                return
            wait = 1.0 if time.monotonic() - started > STABLE_SECONDS else wait
            self.restarts += 1
            self.echo(
                f"ClientApp worker exited (code {code}); restarting it in {wait:.0f} s "
                "(a message it held is answered as failed)"
            )
            self._stop.wait(wait)
            wait = min(wait * 2, 30.0)

    def inputs_problem(self, timeout: float) -> str | None:
        """Wait for the first worker to read the site's task and data files: None when they
        read well, else the problem in one line (a worker that died first, or that took
        longer than ``timeout`` seconds, included)."""
        if not self._inputs_read.wait(timeout):
            return (
                f"the site's ClientApp worker had not read the task and data after "
                f"{timeout:.0f} s; see {self.log_path}"
            )
        return self._inputs_problem

    def pid(self) -> int | None:
        """The running worker's pid (None before the first start)."""
        proc = self._proc
        return proc.pid if proc is not None and proc.poll() is None else None

    def stop(self) -> None:
        """Stop the worker (SIGTERM, then SIGKILL after a grace period) and stop restarting."""
        with self._lock:
            self._stop.set()
            proc = self._proc
        if proc is not None:
            stop_process_group(proc, grace=5.0)
        self._thread.join(10)
