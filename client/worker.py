"""``python -m fedweave.client.worker``: a site's long-lived ClientApp worker.

Flower 1.41's SuperNode hands each message to a new ``flwr-clientapp`` process, which imports
Python, Flower and torch, installs the run's FAB, loads the ClientApp, answers one message
and exits: about 7 s of start-up per training message on 2 cores, against well under a second
of training (docs/deploy.md, "How fast"). This worker takes the SuperNode's place as the
executor: the SuperNode runs with ``--isolation process``, and the worker

1. imports torch, loads the site's task and data, tells ``fedweave client`` whether they
   read well (``INPUTS_PREFIX``: the site ends with the problem before it connects), and
   warms the optimizer path once;
2. claims each ClientApp task from the SuperNode's Runtime API (``AcquireTask``, what
   ``flower-superexec`` calls), then runs it in this process with Flower's own functions
   for the pinned version (``fedweave.flower_patches.clientapp_worker``: Flower's
   ``pull_task_input`` with a shorter first object-pull backoff, its ``push_message`` and
   ``push_task_output``), keeping a heartbeat while it runs (Flower's Runtime API client,
   task claims and heartbeat come from that module too: Flower exports none of them);
3. checks each run's FAB (``fedweave.app_bundle``): it must name fedweave's own apps and
   carry no code. Whatever a run names, this worker runs the installed
   ``fedweave.client.deployed_app`` and nothing else; a foreign run is refused (an error reply
   with the ``SiteRefusal`` code and the reason), logged, and shown in the site's console with
   its run id. The
   FAB is never installed, so none of its files can be imported.

An exception in the ClientApp becomes an error reply, as in ``flwr-clientapp``. A worker that
dies mid-task stops its heartbeat; the SuperNode then answers that message with Flower's
"ClientApp crashed" error (so the coordinator records the site failed), and ``fedweave client``
starts a new worker (``fedweave.client.worker_supervisor``).

It takes no part in what the ClientApp computes: the same app, message and context as under
``flwr-clientapp``, so a run's results do not depend on which executor ran it.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import threading
import time

from fedweave.contract import SiteOutcome, SiteRefusal, one_line

NOTICE_PREFIX = "site notice: "
"""Starts a line this worker writes to stdout for the site's console (``WorkerSupervisor``)."""
RECORD_PREFIX = "site record: "
"""Before one JSON line of ``client/mods.py``'s ``site_record`` on the worker's stdout."""
INPUTS_PREFIX = "site inputs: "
"""Before the one line a starting worker writes once it has read the site's task and data
files: ``INPUTS_OK``, or the problem in one line (``WorkerSupervisor.inputs_problem``)."""
INPUTS_OK = "ok"

POLL_SECONDS = 0.1
"""Seconds between asks for a task when none is pending while the site is busy (stock
``flower-superexec``: 1 s). Measured on 2 cores: 0.1 s cost ~0.07 CPU-s/s per site, the
worker's and its SuperNode's together, so a site idle longer asks less often
(``fedweave.poll_pace``)."""
IDLE_POLL_SECONDS = 1.0
"""Seconds between asks once no task came for ``ACTIVE_SECONDS`` (``STARTING_SECONDS`` after
the first ask)."""
ACTIVE_SECONDS = 10.0
"""How long after its last task the worker asks every ``POLL_SECONDS``: a run's next message
comes within it, unless its round waits for a slow site."""
STARTING_SECONDS = 30.0
"""How long after its first ask the worker asks every ``POLL_SECONDS``: the site's SuperNode
connects meanwhile, and the run's first message follows."""

log = logging.getLogger("fedweave.client.worker")


def warm_up(
    task: str | None,
    data_paths: tuple[str | None, ...],
    label_column: str | None,
    columns: str | None = None,
    device: str | None = None,
    nproc: int = 1,
    more_tasks: dict[str, str] | None = None,
) -> None:
    """Pay every first-use cost before the first message: the task, this site's data files
    (``data_paths``: its data, then its evaluation data; None entries skipped; ``columns``:
    their column map's path), its other tasks and their files (``more_tasks``), torch, and
    the optimizer path (its first use imports ``torch._dynamo``, ~2 s). Says on stdout
    whether the task and data read well, and the site can train on ``device`` in ``nproc``
    processes (``INPUTS_PREFIX``) first: the site's SuperNode waits for that."""
    problem = _inputs_problem(task, data_paths, label_column, columns, device, nproc)
    for other, path in (more_tasks or {}).items():
        if problem is None:
            problem = _inputs_problem(other, (path,), None, None, device, nproc)
    print(INPUTS_PREFIX + (problem or INPUTS_OK), flush=True)
    import torch

    torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1).step()


def _inputs_problem(
    task: str | None,
    data_paths: tuple[str | None, ...],
    label_column: str | None,
    columns: str | None = None,
    device: str | None = None,
    nproc: int = 1,
) -> str | None:
    """None when the task loads, every data file reads as training reads it, and the site
    can train on ``device`` in ``nproc`` processes; else the problem in one line (a run's
    first message is refused again with it, if the site runs)."""
    if task is None:
        return None
    from fedweave.client.site_app import cached_site_data, cached_task
    from fedweave.errors import UserError

    said = _NoticeHandler(logging.WARNING)  # what reading the files warns of is the operator's
    logging.getLogger("fedweave.data").addHandler(said)
    try:
        loaded = cached_task(task)
        for path in data_paths:
            if path is not None:
                cached_site_data(path, task, label_column, columns)
        from fedweave.learning.site_processes import check_processes

        check_processes(nproc, device, loaded)
    except UserError as exc:
        problem = one_line(str(exc), limit=2000)
        log.warning("site data not preloaded: %s", problem)
        return problem
    except Exception as exc:  # a task module's own failure: its traceback goes to the log
        log.error("task %r or its data failed to load", task, exc_info=exc)
        why = f"{type(exc).__name__}: {one_line(str(exc))}"
        return f"task {task!r} or its data failed to load ({why}); see the site's log"
    finally:
        logging.getLogger("fedweave.data").removeHandler(said)
    return None


def parse_more_tasks(entry: str | None) -> dict[str, str]:
    """The site's other tasks (``--more-tasks``, as ``fedweave client`` checked and wrote
    it: ``TASK=ABSOLUTE_PATH`` joined by ``,``) as task → data path."""
    tasks: dict[str, str] = {}
    for part in filter(None, (entry or "").split(",")):
        task, _, path = part.partition("=")
        tasks[task] = path
    return tasks


class ForeignRunRefused(SiteRefusal):
    """A run whose bundle is not fedweave's: answered with the refusal, never run."""


class ClientAppRunner:
    """Runs claimed ClientApp tasks in this process, one at a time."""

    def __init__(self, runtime_api_address: str) -> None:
        self.address = runtime_api_address
        self._app: object | None = None  # fedweave's ClientApp, imported on first use
        self._verdicts: dict[bytes, str | None] = {}  # FAB content digest -> its problem

    def client(self, token: str | None):
        """A Runtime API client: with ``token`` for one task's calls, else for ``AcquireTask``."""
        from fedweave.flower_patches.clientapp_worker import runtime_client

        return runtime_client(self.address, token)

    def _client_app(self, run, fab):
        """fedweave's installed ClientApp, once the run's FAB is checked to name it (code
        never travels: a FAB's own files are never installed or imported)."""
        import hashlib

        from fedweave.app_bundle import bundle_problem
        from fedweave.contract import CLIENT_APP_REF

        content = bytes(fab.content)
        digest = hashlib.sha256(content).digest()  # our own digest: not the hash we were told
        if digest not in self._verdicts:  # once per bundle, not once per message
            problem = self._verdicts[digest] = bundle_problem(content)
            if problem is not None:
                notice = f"refused run {run.run_id}: {problem}"
                log.error(notice)
                print(NOTICE_PREFIX + notice, flush=True)
        problem = self._verdicts[digest]
        if problem is not None:
            raise ForeignRunRefused(f"run {run.run_id}: {problem}")
        if self._app is None:
            import importlib

            module, _, attribute = CLIENT_APP_REF.partition(":")
            self._app = getattr(importlib.import_module(module), attribute)
        return self._app

    def acquire(self, client) -> str | None:
        """A token for the next pending ClientApp task, or None."""
        from fedweave.flower_patches.clientapp_worker import acquire_task

        return acquire_task(client)

    def run_task(self, token: str) -> None:
        """What ``flwr-clientapp`` does for one message, minus process start and exit."""
        from fedweave.flower_patches.clientapp_worker import (
            ErrorCode,
            LoadClientAppError,
            SubStatus,
            error_reply,
            pull_task_input,
            push_outcome,
            push_reply,
            task_heartbeat,
        )

        started = time.perf_counter()
        client = self.client(token)
        heartbeat = task_heartbeat(client)
        message = context = reply = None
        sub_status, details = SubStatus.FAILED, "ClientApp task failed due to unknown reason"
        try:
            heartbeat.start()
            message, context, run, fab = pull_task_input(client)
            reply = self._client_app(run, fab)(message=message, context=context)
            sub_status, details = SubStatus.COMPLETED, ""
        except Exception as exc:  # the ClientApp's failure becomes the site's error reply
            code = ErrorCode.CLIENT_APP_RAISED_EXCEPTION
            reason = f"{type(exc)}:<'{exc}'>"
            if isinstance(exc, SiteOutcome):  # the refusal of a foreign bundle
                code, reason = exc.code, one_line(str(exc))
            elif isinstance(exc, LoadClientAppError):
                code = ErrorCode.LOAD_CLIENT_APP_EXCEPTION
                reason = "An exception was raised when attempting to load `ClientApp`"
            if not isinstance(exc, ForeignRunRefused):
                log.error("ClientApp raised an exception", exc_info=exc)
            details = reason
            if message is not None:
                reply = error_reply(message, code, reason)
        finally:
            try:
                if reply is not None and context is not None:
                    push_reply(client, reply, context)
            finally:
                push_outcome(client, context, sub_status, details)
                if heartbeat.is_running:
                    heartbeat.stop()
                client.close()
        if message is not None:
            log.info(
                "%s message of round %s: %s in %.2f s", message.metadata.message_type,
                message.metadata.group_id or "-", sub_status.lower(), time.perf_counter() - started,
            )  # fmt: skip


def exit_with_site(site_pid: int, poll_seconds: float = 1.0) -> None:
    """Leave at once when the ``fedweave client`` that started us is gone (even by kill -9).

    Its SIGTERM (PDEATHSIG) only asks the serve loop to stop, and Flower's Runtime API
    client retries a vanished SuperNode without limit, so a worker whose site died could
    wait forever, holding torch and the site's data in memory. Nobody is left to answer.
    """

    def watch() -> None:
        while os.getppid() == site_pid:
            time.sleep(poll_seconds)
        log.warning("the site process %d is gone; this worker stops", site_pid)
        os._exit(0)

    threading.Thread(target=watch, name="site-watch", daemon=True).start()


class _NoticeHandler(logging.Handler):
    """The site console's lines (``client/mods.py``) as notices for ``fedweave client``."""

    def emit(self, record: logging.LogRecord) -> None:
        print(NOTICE_PREFIX + record.getMessage(), flush=True)


class _RecordHandler(logging.Handler):
    """The site's records (``client/mods.py``) as JSON lines for ``fedweave client``."""

    def emit(self, record: logging.LogRecord) -> None:
        import json

        fields = getattr(record, "site_record", None)
        if isinstance(fields, dict):
            print(RECORD_PREFIX + json.dumps(fields, default=str), flush=True)


def serve(
    runtime_api_address: str,
    stop: threading.Event,
    poll_seconds: float = POLL_SECONDS,
) -> None:
    """Claim and run ClientApp tasks until ``stop`` is set.

    Args:
        runtime_api_address: the SuperNode's Runtime API, ``host:port`` on loopback.
        stop: set to end the loop after the task in hand (SIGTERM/SIGINT set it).
        poll_seconds: seconds between asks when no task is pending and the site is busy
            (default ``POLL_SECONDS``; idle: ``IDLE_POLL_SECONDS``, or this if longer).
    """
    import httpx

    from fedweave.poll_pace import PollPace

    pace = PollPace(poll_seconds, max(poll_seconds, IDLE_POLL_SECONDS), ACTIVE_SECONDS,
                    starting=STARTING_SECONDS)  # fmt: skip
    runner = ClientAppRunner(runtime_api_address)
    control = runner.client(None)
    try:
        while not stop.is_set():
            try:
                token = runner.acquire(control)
            except httpx.HTTPError as exc:  # the SuperNode is (re)starting: ask again soon
                log.debug("Runtime API %s not answering: %s", runtime_api_address, exc)
                stop.wait(1.0)
                continue
            if token is not None:
                runner.run_task(token)
                pace.worked()
            else:
                stop.wait(pace.wait())
    finally:
        control.close()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m fedweave.client.worker",
        description="A site's long-lived ClientApp worker (started by `fedweave client`).",
    )
    parser.add_argument("--runtime-api-address", required=True, help="the SuperNode's host:port")
    parser.add_argument("--task", help="the task this site holds, loaded before the first message")
    parser.add_argument("--data", help="this site's data file, loaded before the first message")
    parser.add_argument("--label-column", help="label column of a CSV data file")
    parser.add_argument("--columns", help="column map: the data's headers -> the task's columns")
    parser.add_argument("--eval-data", help="this site's evaluation file, read at start too")
    parser.add_argument("--device", help="where the site trains (checked at start)")
    parser.add_argument("--more-tasks", help="the site's other tasks: TASK=DATA,...")
    parser.add_argument(
        "--nproc-per-node",
        type=int,
        default=1,
        help="processes the site trains in (checked at start)",
    )
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per poll otherwise
    logging.getLogger("fedweave.site.console").addHandler(_NoticeHandler())
    logging.getLogger("fedweave.site.records").addHandler(_RecordHandler())

    stop = threading.Event()
    # Flower's HTTP retry SIGINTs its own process on a 401, meant to end a one-message
    # flwr-clientapp. Here a 401 only means the SuperNode restarted and forgot the task in
    # hand: that task fails and the worker goes on. (It runs in its own session, so a
    # terminal's Ctrl-C never reaches it; `fedweave client` stops it with SIGTERM.)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    exit_with_site(os.getppid())
    # SIGTERM: exit at once
    warm_up(
        args.task,
        (args.data, args.eval_data),
        args.label_column,
        args.columns,
        args.device,
        args.nproc_per_node,
        parse_more_tasks(args.more_tasks),
    )
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    log.info("ClientApp worker ready (pid %d)", os.getpid())
    serve(args.runtime_api_address, stop)


if __name__ == "__main__":
    main()
