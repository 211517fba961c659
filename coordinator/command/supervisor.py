"""``fedweave coordinator``: check everything, start the SuperLink, wait for the sites, run,
print each round as the history records it, and shut down cleanly.

Every check a user can fail (the ``--track`` package, TLS files, site keys, task, port,
database, resume) runs before the SuperLink starts, so a mistake costs one line and exit
code 2, never a half-started server. The ServerApp itself runs in Flower's
``flwr-serverapp`` process and records rounds in the history; this process follows the
history to print progress, which is also why a restarted coordinator shows exactly the
rounds that were recorded, no more.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from dataclasses import replace
from datetime import datetime, timezone
from pathlib import Path
from typing import NoReturn

import typer

from fedweave.addresses import parse_host_port
from fedweave.certs import (
    TlsFiles,
    certificate_end,
    check_server_certificate,
    registered_site_keys,
    serves_host,
)
from fedweave.config import Resolved, RunConfig
from fedweave.config.sections import ConnectionSection
from fedweave.coordinator.command.refused_key_notices import RefusedKeys
from fedweave.coordinator.command.superlink import (
    SuperLinkOptions,
    await_superlink,
    build_fab,
    check_port_free,
    child_env,
    launch_superlink,
    parse_address,
)
from fedweave.coordinator.plan import (
    SITE_NAMES_FILE,
    Deployment,
    DeployPlan,
    write_deployment_file,
    write_site_names,
)
from fedweave.errors import UserError
from fedweave.flower_patches.refused_keys import KEYS_SYNCED_FILE_ENV, REFUSED_KEYS_FILE_ENV
from fedweave.history.metrics import evaluation_lines, evaluation_of, headline_value
from fedweave.history.round_summary import privacy_spent, shown
from fedweave.processes import raise_interrupt, stop_process_group

POLL_S = 0.5


def _echo(message: str) -> None:
    typer.echo(message, err=True)


def _absolute_db_url(url: str | None) -> str:
    """SQLite paths made absolute: Flower's ServerApp process may run in another directory."""
    from fedweave.config.sections import DEFAULT_DB_URL

    url = url or DEFAULT_DB_URL
    prefix = "sqlite:///"
    if url.startswith(prefix) and not url.startswith(prefix + "/") and ":memory:" not in url:
        return prefix + str(Path(url[len(prefix) :]).resolve())
    return url


def _tls(options: ConnectionSection, host: str = "") -> TlsFiles | None:
    """The TLS files of ``--tls-dir``, read and checked as sites will check them
    (``certs.check_server_certificate``; a certificate near its end, or not for ``host``, the
    address it listens on, is warned about); ``--insecure`` or ``--tls-dir``, one of them, was
    given (a rule of the options: ``fedweave/config/rules.py``)."""
    if options.insecure or options.tls_dir is None:
        return None  # no TLS, no site authentication: the run header says so
    files = TlsFiles.in_dir(options.tls_dir.resolve())
    files.check_readable()
    certificate = check_server_certificate(files)
    warning = certificate.expiry_warning(files, datetime.now(timezone.utc))
    if warning is not None:
        _echo(warning)
    if not serves_host(certificate, host.strip("[]")):
        _echo(
            f"warning: {files.server_cert} is not valid for {host} (it names "
            f"{', '.join(certificate.names) or 'no host'}): sites that reach the coordinator as "
            f"{host} will refuse it; renew it with `fedweave certs renew --dir "
            f"{files.server_cert.parent} --host {host}`"
        )
    if sites_must_register(options) and not registered_site_keys(options.tls_dir):
        _echo(
            f"no site keys in {options.tls_dir}/sites yet: sites are refused until you add "
            "theirs with `fedweave sites add-key DIR site.pub` (or pass "
            "--allow-unregistered-sites)"
        )
    return files


CERTIFICATE_CHECK_S = 86400.0
"""A serving coordinator checks its certificate again this often (its end draws near)."""


def _say_certificate(files: TlsFiles) -> None:
    """The daily look at the certificate being served: a line when it ends within
    ``EXPIRY_WARNING_DAYS`` days, or has ended, or no longer checks."""
    try:
        certificate = check_server_certificate(files)
    except UserError as exc:
        _echo(f"warning: {exc}")
        return
    warning = certificate.expiry_warning(files, datetime.now(timezone.utc))
    if warning is not None:
        _echo(warning)


def sites_must_register(options: ConnectionSection) -> bool:
    """Site authentication: on with TLS unless the operator says --allow-unregistered-sites
    (Flower cannot authenticate sites without TLS)."""
    return not options.insecure and not options.allow_unregistered_sites


def run_headline(config) -> str:  # type: ignore[no-untyped-def]
    """The metric the coordinator's console leads with (``headline_metric``)."""
    from fedweave.learning.task_metrics import headline_metric
    from fedweave.learning.tasks import load_task

    return headline_metric(load_task(config.data.task), config.evaluation.select_metric)


def round_lines(
    row: dict, site_rows: list[dict], rounds: int, headline: str, revoked: dict[str, str]
) -> list[str]:
    """A recorded round as the console prints it: its line, then its sites that were not ok,
    its evaluations and its warnings (``revoked``: node id → the name of a revoked key)."""
    seconds = (row.get("extra") or {}).get("seconds")
    failed = (row.get("extra") or {}).get("failed")
    lines = [
        f"round {row['round']}/{rounds}: {headline} "
        f"{shown(headline_value(row, headline))} "
        f"loss {shown(row['eval_loss'])}, sites {row['replied']}/{row['sampled']} ok"
        + (f", {seconds:.1f} s" if seconds is not None else "")
        + privacy_spent((row.get("extra") or {}).get("privacy")).replace("  ", ", ", 1)
        + (f"; FAILED: {failed}" if failed else "")
    ]
    for site in site_rows:
        if site["status"] != "ok":
            reason = site.get("reason") or "no reason given"
            node = (site.get("metrics") or {}).get("node_id", site["site_id"])
            name = revoked.get(str(node))
            who = f"{site['site_id']} ({name}, key revoked)" if name else site["site_id"]
            lines.append(f"  site {who} {site['status']}: {reason}")
    lines.extend(f"  {line}" for line in evaluation_lines(evaluation_of(row)))
    lines.extend(f"  warning: {w}" for w in (row.get("extra") or {}).get("warnings") or ())
    return lines


class _Watcher:
    """Prints each newly recorded round (and its failed sites) exactly once, and a warning
    line when a site is late ``--stall-after`` rounds in a row or the round in flight runs
    past its deadlines and ``--stall-grace`` (``fedweave/history/alerts.py``). A history
    database it cannot reach is said once, and again once it is back (the rounds' own writes
    retry for ``--db-outage``); it follows on meanwhile."""

    def __init__(self, store, plan: DeployPlan, revoked: dict[str, str], say=_echo) -> None:
        from fedweave.history.alerts import AlertRules, LateStreaks

        self.store, self.plan, self.revoked, self.say = store, plan, revoked, say
        self.rounds = plan.config.training.rounds
        self.headline = run_headline(plan.config)
        self.printed = {r["round"] for r in store.rounds(plan.run_id)}
        monitoring = plan.config.monitoring
        self.rules = AlertRules(monitoring.stall_after, monitoring.stall_grace)
        self.streaks = LateStreaks()
        self.streaks.add_rows(store.site_results(plan.run_id))
        self.warned_overdue: set[int] = set()
        self.waiting_said: tuple | None = None
        self.unreachable_since: float | None = None

    def poll(self) -> None:
        from fedweave.history.store_errors import HistoryUnavailableError

        try:
            self._poll()
        except HistoryUnavailableError as exc:
            if self.unreachable_since is None:
                self.unreachable_since = time.monotonic()
                self.say(
                    f"warning: {exc}; the run goes on, its rounds recorded once the database is "
                    f"back (retried for up to {self.plan.config.history.db_outage:g} s, "
                    "--db-outage)"
                )
            return
        if self.unreachable_since is not None:
            away = time.monotonic() - self.unreachable_since
            self.say(f"the history database is back after {away:.0f} s")
            self.unreachable_since = None

    def _poll(self) -> None:
        for row in self.store.rounds(self.plan.run_id, after=max(self.printed, default=0)):
            if row["round"] in self.printed:
                continue
            self.printed.add(row["round"])
            site_rows = self.store.site_results(self.plan.run_id, row["round"])
            for line in round_lines(row, site_rows, self.rounds, self.headline, self.revoked):
                self.say(line)
            self.streaks.add_rows(site_rows)
            for late in self.streaks.flagged(self.rules):
                if len(late.rounds) == self.rules.late_in_a_row and late.rounds[-1] == row["round"]:
                    self.say(f"warning: {late.line()}")
        run = self.store.get_run(self.plan.run_id)
        self._say_sites_wait(run)
        self._warn_if_overdue(run)

    def _say_sites_wait(self, run) -> None:
        """Say a wait for sites when it begins and as its count changes, and its end."""
        waiting = run.sites_wait if run.status == "running" else None
        said = None if waiting is None else (waiting.since, waiting.connected, waiting.missing)
        if said == self.waiting_said:
            return
        if waiting is not None:
            self.say(f"warning: {waiting.line()}")
        elif run.status == "running":
            self.say("sites back: the run goes on")
        self.waiting_said = said

    def _warn_if_overdue(self, run) -> None:
        from fedweave.history.alerts import overdue_round

        overdue = overdue_round(run, datetime.now(timezone.utc), self.rules)
        if overdue is not None and overdue.round not in self.warned_overdue:
            self.warned_overdue.add(overdue.round)
            self.say(f"warning: {overdue.line()}")


def _sync_site_keys(
    client, tls_dir: Path | None, known: dict[Path, bytes], revoked: dict[str, str]
) -> bool:
    """Register site keys added to ``DIR/sites`` and revoke those removed from it (at start,
    and every poll while serving: `fedweave sites remove-key` takes effect within a second).
    ``revoked`` gathers node id → site name of every node disconnected so. Returns whether
    any key was registered or revoked."""
    if tls_dir is None:
        return False
    before = dict(known)
    present = {}
    for path in registered_site_keys(tls_dir):
        try:
            present[path] = path.read_bytes()
        except OSError:
            continue  # being written or removed right now: next poll
    for path, key in list(known.items()):
        if present.get(path) == key:
            continue
        del known[path]
        try:
            nodes = client.unregister(key)
        except Exception as exc:  # noqa: BLE001 - the next poll tries again
            _echo(f"warning: site key {path.stem} not revoked yet: {str(exc).splitlines()[0]}")
            known[path] = key
            continue
        revoked.update({str(node): path.stem for node in nodes})
        detail = f"node {', '.join(map(str, nodes))} disconnected" if nodes else "no node online"
        _echo(f"site key {path.stem} revoked ({detail}); its requests are refused from now on")
    for path, key in present.items():
        if path in known:
            continue
        known[path] = key
        try:
            state = client.register(key, path.stem)
        except Exception as exc:  # noqa: BLE001 - a bad key must not stop the coordinator
            _echo(f"warning: site key {path} not registered: {str(exc).splitlines()[0]}")
            continue
        if state == "registered":
            _echo(f"site key {path.stem} registered")
    return known != before


def _write_site_names(client, known: dict[Path, bytes], folder: Path) -> None:
    """Node id → the name each registered key is filed under, for the ServerApp to record
    sites by (``plan.SITE_NAMES_FILE``): a site's name is bound to its key."""
    name_of = {client.flower_key(key): path.stem for path, key in known.items()}
    names = {
        str(node.node_id): name_of[bytes(node.public_key)]
        for node in client.nodes() if bytes(node.public_key) in name_of
    }  # fmt: skip
    write_site_names(folder, names)


def _bulk_address(address: str | None, fleet: tuple[str, int]) -> tuple[str, int] | None:
    """``--bulk-address``, checked before anything starts (``None``: not asked for)."""
    if address is None:
        return None
    host, port = parse_host_port(address, "--bulk-address", "0.0.0.0:9095")
    if port == fleet[1]:
        raise UserError(f"--bulk-address {address} uses --address's port; pick another port")
    check_port_free(host, port, "--bulk-address")
    return host, port


def _serve_bulk(address: tuple[str, int], folder: Path, tls: TlsFiles | None, revoked):  # type: ignore[no-untyped-def]
    """The transfer server of ``--bulk-address`` (``fedweave/bulk/server.py``), started, with
    an empty spool in ``folder``; a node in ``revoked`` (node id → site name, as the site keys
    are revoked) is refused from then on."""
    import shutil

    from fedweave.bulk.server import BulkServer
    from fedweave.bulk.spool import Spool

    shutil.rmtree(folder, ignore_errors=True)  # a crashed coordinator's leftovers
    files = (tls.server_cert, tls.server_key) if tls is not None else None
    try:
        server = BulkServer(address, Spool(folder), files, lambda node: str(node) not in revoked)
    except OSError as exc:
        raise UserError(
            f"cannot listen on {address[0]}:{address[1]} ({exc.strerror or exc}); "
            "pick another --bulk-address"
        ) from None
    return server.start()


def _metrics_exposure(config: RunConfig):
    """``--metrics-address``: checked (loopback, or TLS with the coordinator's certificate and
    ``--auth-file``) and its socket bound before anything starts; ``None`` when not asked."""
    monitoring = config.monitoring
    if monitoring.metrics_address is None:
        return None
    from fedweave.dashboard.security import exposure
    from fedweave.dashboard.server import bind

    tls_dir = None if config.connection.insecure else config.connection.tls_dir
    serving = exposure(monitoring.metrics_address, "--metrics-address", tls_dir,
                       monitoring.auth_file)  # fmt: skip
    return serving, bind(serving, "--metrics-address")


def _serve_metrics(metrics, store, config: RunConfig, run_id: str | None, client):
    """Serve ``/metrics`` of run ``run_id``, or of every run where None (a coordinator with
    an operator door: its studies too, and their queue); sites connected: the SuperLink's
    own count; alerts by ``--stall-after`` and ``--stall-grace``."""
    from fedweave.dashboard.app import make_app
    from fedweave.dashboard.prometheus import HistoryCollector
    from fedweave.dashboard.server import BackgroundServer
    from fedweave.dashboard.views import Views
    from fedweave.history.alerts import AlertRules

    serving, sock = metrics
    last = [0]

    def connected() -> int:
        try:
            last[0] = len(client.online_nodes())
        except Exception:  # noqa: BLE001 - a scrape must not fail on a busy Control API
            pass
        return last[0]

    monitoring = config.monitoring
    views = Views(store, AlertRules(monitoring.stall_after, monitoring.stall_grace))
    tls = None if config.connection.insecure else config.connection.tls_dir
    ends = None
    if tls is not None:
        server_cert = TlsFiles.in_dir(tls.resolve()).server_cert
        ends = lambda: certificate_end(server_cert)  # noqa: E731
    collector = HistoryCollector(views, run_id=run_id, connected=connected, certificate_ends=ends)
    app = make_app(views, serving.credentials, pages=False, collector=collector,
                   hosts=serving.host_names)  # fmt: skip
    which = f"run {run_id}" if run_id is not None else "every run"
    _echo(f"Prometheus metrics of {which} at {serving.url}/metrics")
    return BackgroundServer(app, serving, sock)


def _online_count(client, plan: DeployPlan):  # type: ignore[no-untyped-def]
    """How many of the plan's sites are connected: every online site, or, for a run naming
    its sites (``--sites``), those online whose key is registered under one of the names."""
    from fedweave.config.rules import site_names
    from fedweave.coordinator.plan import registered_site_names

    names = frozenset(site_names(plan.config.federation.sites))
    if not names:
        return lambda: len(client.online_nodes())
    registered = registered_site_names(plan.deployment_file)

    def named_online() -> int:
        name_of = registered() if registered is not None else {}
        return sum(name_of.get(str(node.node_id)) in names for node in client.online_nodes())

    return named_online


def _wait_for_sites(client, proc, needed: int, timeout: float | None, keys, say=_echo,
                    online_count=None, on_change=None) -> None:  # fmt: skip
    """Until ``needed`` sites are connected (``online_count()``, default: every online site);
    ``on_change(online, needed)`` hears each new count."""
    last, deadline = -1, None if timeout is None else time.monotonic() + timeout
    count = online_count or (lambda: len(client.online_nodes()))
    while True:
        online = count()
        if online != last:
            waiting = "" if online >= needed else "; waiting"
            say(f"{online} sites connected, {needed} needed" if online > needed
                else f"{online}/{needed} sites connected{waiting}")  # fmt: skip
            if on_change is not None:
                on_change(online, needed)
            last = online
        if online >= needed:
            return
        if proc.poll() is not None:
            raise UserError(f"the SuperLink stopped (exit {proc.returncode})")
        if deadline is not None and time.monotonic() > deadline:
            raise UserError(
                f"only {online} of --min-clients {needed} sites connected within "
                f"{timeout:.0f} s; start more sites or lower --min-clients"
            )
        keys()
        time.sleep(POLL_S)


def _operator_exposure(config: RunConfig):
    """``--operator-address``: checked (HTTPS with the coordinator's certificate, or loopback
    with ``--insecure``) and its socket bound before anything starts; ``None`` when not
    asked."""
    address = config.deployment.operator_address
    if address is None:
        return None
    from fedweave.dashboard.security import Exposure, is_loopback
    from fedweave.dashboard.server import bind

    if config.deployment.once:
        raise UserError(
            "--operator-address takes studies once the first run has ended, which --once "
            "does not wait for; drop --once"
        )
    host, port = parse_host_port(address, "--operator-address")
    if config.connection.insecure:
        if not is_loopback(host):
            raise UserError(
                f"--operator-address {address} is reachable from other machines, which "
                "needs TLS: drop --insecure and give --tls-dir, or listen on 127.0.0.1"
            )
        exposure = Exposure(host, port)
    else:
        files = TlsFiles.in_dir(config.connection.tls_dir.resolve())
        files.check_readable()
        exposure = Exposure(host, port, files.server_cert, files.server_key)
    return exposure, bind(exposure, "--operator-address")


def _serve_door(door, store, config: RunConfig):
    """Serve the operator door (``operator_door.make_door``): studies are checked against
    ``config``'s serving settings."""
    from fedweave.config.resume import stored_settings
    from fedweave.coordinator.command import run_checks, training_setup
    from fedweave.coordinator.command.operator_door import make_door
    from fedweave.coordinator.command.study import resolve_study
    from fedweave.coordinator.command.study_models import run_model_for
    from fedweave.dashboard.server import BackgroundServer

    exposure, sock = door

    def check_study(text: str, source: str, operator) -> None:  # noqa: ANN001 - OperatorInfo
        run_model = run_model_for(store, operator, config.history.checkpoint_dir, source)
        study, resolved = resolve_study(config, text, source, run_model)
        try:
            run_checks.check_run(study)
            training_setup.check_run_input(store, study, resolved)
        except UserError:
            raise
        except Exception as exc:  # noqa: BLE001 - a study's task may raise anything
            raise UserError(f"{source}: {_raised(exc)}") from None

    def lines(run_id: str, after: int) -> tuple[list[str], int]:
        _command, values = stored_settings(store.get_run(run_id).config)
        study = RunConfig().replace(**values)
        headline, rounds = run_headline(study), study.training.rounds
        out, last = [], after
        for row in store.rounds(run_id, after=after):
            out += round_lines(row, store.site_results(run_id, row["round"]), rounds, headline, {})
            last = row["round"]
        return out, last

    app = make_door(store, check_study, lines)
    _echo(f"operator door at {exposure.url}: `fedweave run submit` queues studies here")
    return BackgroundServer(app, exposure, sock)


def _follow(client, proc, link_options, flower_run: int, watcher, keys, stop_asked=None):
    """Print a Flower run's rounds as they are recorded until it finishes; returns its
    (sub_status, details) and who stopped it (``stop_asked()``: an operator's name once one
    asks, the run then stopped through the Control API), if anyone did."""
    stopped_by = None
    while True:
        watcher.poll()
        status, sub_status, details = client.run_status(flower_run)
        if status == "finished":
            watcher.poll()
            return sub_status, details, stopped_by
        if proc.poll() is not None:
            raise UserError(
                f"the SuperLink stopped (exit {proc.returncode}); see {link_options.log_path}"
            )
        if stop_asked is not None and stopped_by is None:
            stopped_by = stop_asked()
            if stopped_by is not None:
                client.stop_run(flower_run)
        keys()
        time.sleep(POLL_S)


def _raised(exc: BaseException) -> str:
    """An unexpected error of a study's task code, in one line."""
    lines = str(exc).strip().splitlines()
    return f"its task raised {type(exc).__name__}" + (f": {lines[0][:200]}" if lines else "")


class _StoppedWaiting(Exception):
    """An operator stopped a study while it waited for its sites."""


class _Closing(BaseException):
    """The coordinator is stopping: a study's thread ends, its study recorded failed."""


def _run_submission(submission, config: RunConfig, store, client, proc, link_options,
                    revoked: dict[str, str], deployment_file: Path,
                    closing: threading.Event) -> None:  # fmt: skip
    """Run one queued study to its end as the command line's run ran, recording its
    submission's state; a study refused at its turn (its task gone, sites that do not come)
    fails alone, the coordinator serves on. Runs in a thread of its own (``_Studies``):
    ``closing`` set ends it, the study recorded failed for the coordinator's stop."""
    from fedweave.coordinator.command import run_checks, training_setup
    from fedweave.coordinator.command.study import resolve_study
    from fedweave.coordinator.command.study_models import run_model_for
    from fedweave.history.operators import OperatorRegistry
    from fedweave.history.submissions import Submissions

    submissions = Submissions(store)
    who = f"submission {submission.id} ({submission.source}, by {submission.operator})"

    def say(line: str) -> None:
        _echo(f"[submission {submission.id}] {line}")

    resuming = submission.run_id  # its run, kept when a coordinator stopped during it
    _echo(f"{who}: its turn" + (f"; resuming its run {resuming}" if resuming else ""))
    try:
        operator = OperatorRegistry(store).named(submission.operator)  # its roles of now
        run_model = run_model_for(store, operator, config.history.checkpoint_dir, submission.source)
        study, resolved = resolve_study(
            config, submission.config_toml, submission.source, run_model
        )
        if resuming is not None:
            study = study.replace(resume=resuming)
            resolved = replace(resolved, explicit=resolved.explicit | {"resume"})
        run_checks.check_run(study)
        checked = training_setup.check_run_input(store, study, resolved)
        plan = training_setup.prepare_run(
            store, checked, site_authentication=sites_must_register(config.connection),
            operator=submission.operator,
        )  # fmt: skip
    except Exception as exc:  # noqa: BLE001 - a study's task may raise anything; it fails alone
        line = str(exc) if isinstance(exc, UserError) else _raised(exc)
        submissions.ended(submission.id, "failed", line)
        _echo(f"{who} failed: {line}")
        return
    plan = replace(plan, deployment_file=deployment_file)
    if not submissions.started(submission.id, plan.run_id):
        store.finish_run(plan.run_id, "interrupted", "stopped by an operator before it started")
        return

    def closing_or_stop() -> None:
        if closing.is_set():
            raise _Closing
        stopped_by = submissions.get(submission.id).stop_requested_by
        if stopped_by is not None:
            raise _StoppedWaiting(f"stopped by operator {stopped_by} while it waited for sites")

    def closing_only() -> None:
        if closing.is_set():
            raise _Closing

    def note_wait(online: int, needed: int) -> None:  # why it waits, for `fedweave run list`
        waits = online < needed
        submissions.note(submission.id, f"waits for its sites: {online} of {needed} connected"
                         if waits else None)  # fmt: skip

    try:
        try:
            _wait_for_sites(client, proc, plan.config.federation.min_clients,
                            config.deployment.site_timeout or None, closing_or_stop,
                            say, _online_count(client, plan), note_wait)  # fmt: skip
        except (UserError, _StoppedWaiting) as exc:
            if proc.poll() is not None:
                raise
            stopped = isinstance(exc, _StoppedWaiting)
            store.finish_run(plan.run_id, "interrupted" if stopped else "failed", str(exc))
            submissions.ended(submission.id, "stopped" if stopped else "failed", str(exc))
            _echo(f"{who} {'' if stopped else 'failed: '}{exc}")
            return
        try:
            flower_run = client.start_run(build_fab(plan.to_run_config()))
        except UserError as exc:  # the SuperLink refused this run: it fails alone
            store.finish_run(plan.run_id, "failed", str(exc))
            submissions.ended(submission.id, "failed", str(exc))
            _echo(f"{who} failed: {exc}")
            return
        _echo(f"run {plan.run_id} started for submission {submission.id} (Flower run {flower_run})")
        sub_status, details, stopped_by = _follow(
            client, proc, link_options, flower_run, _Watcher(store, plan, revoked, say),
            closing_only, stop_asked=lambda: submissions.get(submission.id).stop_requested_by,
        )  # fmt: skip
    except BaseException as exc:
        reason = "the coordinator stopped during it"
        if store.get_run(plan.run_id).status == "running":
            store.finish_run(plan.run_id, "interrupted", reason)
        again = f"{reason}; it resumes its run when the coordinator serves again"
        if isinstance(exc, (_Closing, UserError)) and submissions.requeue(submission.id, again):
            _echo(f"{who}: {again}")
        else:
            submissions.ended(submission.id, "failed", reason)
        raise
    client.save_logs(
        flower_run, link_options.state_dir / f"serverapp-{plan.run_id}-{flower_run}.log"
    )
    run = store.get_run(plan.run_id)
    if stopped_by is not None:
        reason = f"stopped by operator {stopped_by}"
        if run.status != "completed":  # the ServerApp may have called it failed as it stopped
            store.finish_run(plan.run_id, "interrupted", reason)
        submissions.ended(submission.id, "stopped", reason)
        _echo(f"run {plan.run_id} of submission {submission.id} {reason}")
    elif sub_status != "completed" or run.status != "completed":
        reason = (details or run.reason or sub_status or "unknown").splitlines()[0]
        if run.status == "running":
            store.finish_run(plan.run_id, "failed", reason)
        submissions.ended(submission.id, "failed", reason)
        _echo(f"run {plan.run_id} of submission {submission.id} failed: {reason}")
    else:
        submissions.ended(submission.id, "completed")
        rounds = len(store.rounds(plan.run_id))
        _echo(f"run {plan.run_id} of submission {submission.id} completed: {rounds} rounds")


class _Studies:
    """The operators' queued studies, run at once up to ``--max-studies``, each in a thread
    of its own (``_run_submission``); the oldest queued goes first."""

    def __init__(self, run_one, limit: int) -> None:
        """``run_one(submission, closing)`` runs one study to its end."""
        from fedweave.history.submissions import Submissions

        self.run_one, self.limit = run_one, limit
        self.closing = threading.Event()
        self.running: dict[int, threading.Thread] = {}
        self._queue: Submissions | None = None
        self._submissions = Submissions

    def start_due(self, store) -> None:
        """Start the oldest queued studies while fewer than the limit run."""
        if self._queue is None:
            self._queue = self._submissions(store)
        self.running = {key: t for key, t in self.running.items() if t.is_alive()}
        while len(self.running) < self.limit:
            waiting = self._queue.next_queued(skip=frozenset(self.running))
            if waiting is None:
                return
            thread = threading.Thread(target=self._run, args=(waiting,),
                                      name=f"submission-{waiting.id}", daemon=True)  # fmt: skip
            self.running[waiting.id] = thread
            thread.start()

    def _run(self, submission) -> None:
        try:
            self.run_one(submission, self.closing)
        except _Closing:
            pass
        except UserError as exc:  # the SuperLink stopped: the main loop says so and exits
            _echo(f"submission {submission.id} ended: {exc}")
        except Exception as exc:  # noqa: BLE001 - one study's failure must not end the others
            _echo(f"submission {submission.id} failed: {_raised(exc)}")

    def close(self, seconds: float = 15.0) -> None:
        """End every study's thread (each records its study as failed), waiting up to
        ``seconds`` in all."""
        self.closing.set()
        deadline = time.monotonic() + seconds
        for thread in self.running.values():
            thread.join(max(0.0, deadline - time.monotonic()))


def _serve_studies(config: RunConfig, store, client, proc, link_options, keys,
                   revoked: dict[str, str], deployment_file: Path) -> NoReturn:  # fmt: skip
    """Serve the operators' queue until the SuperLink stops (``UserError``) or Ctrl-C: up to
    ``--max-studies`` at once, each followed in its own thread; the site keys synced here,
    in this thread only."""
    studies = _Studies(
        lambda submission, closing: _run_submission(
            submission, config, store, client, proc, link_options, revoked, deployment_file,
            closing,
        ),
        config.deployment.max_studies,
    )
    try:
        while proc.poll() is None:
            keys()
            studies.start_due(store)
            time.sleep(POLL_S)
    finally:
        studies.close()
    raise UserError(f"the SuperLink stopped (exit {proc.returncode}); see {link_options.log_path}")


def serve(config: RunConfig, resolved: Resolved) -> int:
    """Run the coordinator, or ``fedweave evaluate``'s evaluation-only run
    (``evaluation_setup.py``); returns the exit code (0: run completed)."""
    from fedweave.coordinator.command import evaluation_setup, run_checks, training_setup
    from fedweave.flower_patches import (
        correctness_problem,
        internal_use_problem,
        security_patch_problem,
    )
    from fedweave.history import open_store
    from fedweave.history.tracking import check_tracker

    evaluating = resolved.command == "evaluate"
    own_run = evaluating or not config.deployment.studies_only
    check_tracker(config.history.track)  # the ServerApp builds the tracker; too late to say
    connection, deployment = config.connection, config.deployment
    host, port = parse_address(deployment.address)
    tls = _tls(connection, host)
    problem = (
        security_patch_problem()
        or correctness_problem("node_restarts")
        or internal_use_problem()  # the Control API client, the rounds' Flower records
    )
    if problem is not None:
        raise UserError(problem)
    if not evaluating and own_run:
        run_checks.check_run(config)
    check_port_free(host, port)
    bulk_address = _bulk_address(deployment.bulk_address, (host, port))
    metrics = _metrics_exposure(config)
    door = None if evaluating else _operator_exposure(config)
    db_url = _absolute_db_url(config.history.db)
    store = open_store(db_url)  # unreachable or wrong DB: one line, before anything starts
    plan = None  # --studies-only: no run of its own
    if evaluating:
        authenticated = sites_must_register(connection)
        plan = evaluation_setup.prepare_evaluation(
            store, config, resolved, tls=tls is not None, site_authentication=authenticated
        )
    elif own_run:
        checked = training_setup.check_run_input(store, config, resolved)
    link_options = SuperLinkOptions(
        host, port, deployment.state_dir.resolve(), tls,
        node_auth=sites_must_register(connection),
    )  # fmt: skip
    refused_notes = link_options.state_dir / "refused-keys.jsonl"
    refused_notes.unlink(missing_ok=True)
    link_env = {REFUSED_KEYS_FILE_ENV: str(refused_notes)}
    keys_synced = link_options.state_dir / "site-keys-registered"
    keys_synced.unlink(missing_ok=True)
    if link_options.node_auth:  # until it exists, a key not registered yet gets "try again"
        link_env[KEYS_SYNCED_FILE_ENV] = str(keys_synced)
    proc = launch_superlink(link_options, child_env(link_env))
    if not evaluating and own_run:
        # the SuperLink boots (~3.5 s) while a default deadline is sized (torch, ~4 s)
        try:
            plan = training_setup.prepare_run(
                store, checked, site_authentication=sites_must_register(connection)
            )
        except BaseException:
            stop_process_group(proc)
            raise
    again = (
        f"run it again with fedweave evaluate --run {plan.config.evaluation.run}"
        if evaluating
        else f"continue it with --resume {plan.run_id}" if plan is not None else ""
    )
    previous = signal.signal(signal.SIGTERM, raise_interrupt)
    client = metrics_server = bulk_server = door_server = None
    finished = not own_run
    deployment_file: Path | None = None
    revoked: dict[str, str] = {}
    try:
        secrets = link_options.state_dir / "secrets"
        shared = Deployment(db_url, os.getpid())
        if bulk_address is not None:
            bulk_server = _serve_bulk(bulk_address, secrets / "bulk", tls, revoked)
            shared = replace(
                shared, bulk_spool=str(bulk_server.spool.root), bulk_port=bulk_server.port
            )
        deployment_file = write_deployment_file(secrets, shared)
        if plan is not None:
            plan = replace(plan, deployment_file=deployment_file)
        client = await_superlink(link_options, proc)
        scheme = "https" if tls else "http (insecure)"
        _echo(
            f"coordinator listening on {host}:{port} ({scheme}); "
            f"Flower log in {link_options.log_path}"
        )
        if bulk_server is not None:
            _echo(
                f"tensors move over {scheme.split()[0]} at {bulk_address[0]}:{bulk_server.port}, "
                "beside Flower's messages"
            )
        if metrics is not None:
            metrics_server = _serve_metrics(
                metrics, store, plan.config if plan is not None else config,
                None if door is not None else plan.run_id, client,
            )  # fmt: skip
        if door is not None:
            from fedweave.history.submissions import Submissions

            left = Submissions(store).requeue_running(
                "the coordinator stopped during it; it resumes its run when its turn comes"
            )
            if left:
                which = ", ".join(map(str, left))
                _echo(f"submission{'s' * (len(left) > 1)} {which}: the coordinator stopped "
                      "during it; queued again to resume its run")  # fmt: skip
            door_server = _serve_door(door, store, config)
        known: dict[Path, bytes] = {}
        refused = RefusedKeys(refused_notes, connection.tls_dir, _echo)

        next_certificate_check = [time.monotonic() + CERTIFICATE_CHECK_S]

        def keys(first: bool = False) -> None:
            if _sync_site_keys(client, connection.tls_dir, known, revoked) or first:
                _write_site_names(client, known, deployment_file.parent)
            refused.poll()
            if tls is not None and time.monotonic() > next_certificate_check[0]:
                next_certificate_check[0] = time.monotonic() + CERTIFICATE_CHECK_S
                _say_certificate(tls)

        keys(first=True)
        keys_synced.touch()
        if plan is None:
            _echo("serving the operators' studies only (--studies-only); Ctrl-C to stop")
            _serve_studies(config, store, client, proc, link_options, keys, revoked,
                           deployment_file)  # fmt: skip
        min_clients = plan.config.federation.min_clients
        _wait_for_sites(client, proc, min_clients, deployment.site_timeout or None, keys,
                        online_count=_online_count(client, plan))  # fmt: skip
        flower_run = client.start_run(build_fab(plan.to_run_config()))
        secure_agg = plan.config.secure_aggregation.secure_agg
        started = (
            f"run {plan.run_id} started (Flower run {flower_run}): "
            f"{plan.config.training.rounds} rounds, {min_clients} sites, "
            f"strategy {plan.config.federation.strategy}, SecAgg+ {'on' if secure_agg else 'off'}"
            f", DP {plan.config.privacy.dp}, round deadline "
            + (
                f"{plan.config.federation.round_timeout:g} s"
                if plan.config.federation.round_timeout is not None
                else "measured from the sites' training times"
            )
        )
        if evaluating:
            started = evaluation_setup.started_line(plan, flower_run, store)
        _echo(started)
        watcher = _Watcher(store, plan, revoked)
        sub_status, details, _ = _follow(client, proc, link_options, flower_run, watcher, keys)
        finished = True
        client.save_logs(
            flower_run, link_options.state_dir / f"serverapp-{plan.run_id}-{flower_run}.log"
        )
        run = store.get_run(plan.run_id)
        if sub_status != "completed" or run.status != "completed":
            reason = (details or run.reason or sub_status or "unknown").splitlines()[0]
            if run.status == "running":
                store.finish_run(plan.run_id, "failed", reason)
            ended = "interrupted" if run.status == "interrupted" else sub_status or "ended"
            _echo(f"run {plan.run_id} {ended}: {reason}; {again}")
            return 1
        if bulk_server is not None:
            _echo(f"transfers beside the messages: {bulk_server.counts.line()}")
        rows = store.rounds(plan.run_id)
        headline = watcher.headline
        final = headline_value(rows[-1], headline) if rows else None
        _echo(
            f"run {plan.run_id} completed: {len(rows)} rounds, final {headline} {shown(final)}"
            + privacy_spent((rows[-1].get("extra") or {}).get("privacy") if rows else None)
            .replace("  ", ", ", 1)
            + (f"; ended before its last round: {run.reason}" if run.reason else "")
        )
        if evaluating:
            for line in evaluation_setup.matrix_lines(store, plan.run_id):
                _echo(line)
            return 0
        if deployment.once:
            return 0
        _echo("serving: sites stay connected for the next run; Ctrl-C to stop")
        if door_server is None:
            while proc.poll() is None:
                keys()
                time.sleep(POLL_S * 4)
            raise UserError(
                f"the SuperLink stopped (exit {proc.returncode}); see {link_options.log_path}"
            )
        _serve_studies(config, store, client, proc, link_options, keys, revoked,
                       deployment_file)  # fmt: skip
    except KeyboardInterrupt:
        if not finished:
            store.finish_run(plan.run_id, "interrupted", "coordinator stopped (Ctrl-C/SIGTERM)")
            _echo(f"run {plan.run_id} interrupted; {again}")
        raise
    except UserError:
        if not finished and store.get_run(plan.run_id).status == "running":
            store.finish_run(plan.run_id, "failed", "coordinator stopped on an error")
        raise
    finally:
        if bulk_server is not None:
            bulk_server.close()
        if metrics_server is not None:
            metrics_server.close()
        elif metrics is not None:
            metrics[1].close()
        if door_server is not None:
            door_server.close()
        elif door is not None:
            door[1].close()
        if client is not None:
            client.close()
        stop_process_group(proc)
        if deployment_file is not None:
            deployment_file.unlink(missing_ok=True)
            (deployment_file.parent / SITE_NAMES_FILE).unlink(missing_ok=True)
        signal.signal(signal.SIGTERM, previous)
        store.close()
