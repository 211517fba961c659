"""Run a federated simulation as a recorded run: progress, SQL history, resume, report."""

from __future__ import annotations

import time
import uuid

from rich.console import Console

from fedweave.config import Resolved, RunConfig
from fedweave.coordinator.command.run_header import header_line, protections
from fedweave.coordinator.rounds.history_listener import evaluation_extra
from fedweave.coordinator.rounds.privacy_ledger import check_resumable
from fedweave.errors import UserError
from fedweave.history.metrics import (
    final_metrics,
    final_privacy,
    headline_value,
    nothing_learned,
    recorded_clock,
    recorded_privacy,
    recorded_statistics,
)
from fedweave.history.round_summary import RoundSummary, evaluated, privacy_spent, shown
from fedweave.learning.adapters import run_adapter
from fedweave.learning.initial_model import pin_initial_model
from fedweave.learning.personal import task_local_layers
from fedweave.learning.statistics import pinned_schema
from fedweave.learning.task_metrics import headline_metric
from fedweave.learning.task_packages import pinned_for_run
from fedweave.learning.tasks import load_task
from fedweave.privacy_accounting import with_planned_noise
from fedweave.simulations.federated import run_federated_simulation, server_settings
from fedweave.simulations.report import RoundProgress, build_report, rounds_table, write_report
from fedweave.simulations.run_checks import checked_test_data


class _ProgressListener:
    def __init__(self, progress: RoundProgress) -> None:
        self.progress = progress

    def on_round(self, summary: RoundSummary) -> None:
        self.progress.update(
            {
                "round": summary.round,
                self.progress.headline: evaluated(summary, self.progress.headline),
                "loss": summary.loss,
                "seconds": summary.seconds,
                "warnings": summary.warnings,
                "evaluation": evaluation_extra(summary).get("evaluation"),
                "privacy": summary.privacy,
            }
        )


def _with_protections(config: RunConfig, offset: int, test_data) -> tuple[RunConfig, dict]:
    """The config with its round deadline resolved, and what protects the run (no TLS or
    site keys in a simulation: nothing crosses a network)."""
    settings = server_settings(config, offset)
    deadline = settings.deadline(test_data)
    facts = protections(config, settings.cohort, deadline, central_data=test_data is not None)
    return settings.resolved(deadline), facts


def check_site_ledgers(config: RunConfig, run_id: str, privacy: dict | None) -> None:
    """Refuse, in one line, to resume a ``--dp sample`` run whose simulated sites' own ledgers
    are not where the run kept them: its sites would account from zero."""
    if config.privacy.dp != "sample" or not privacy or not privacy.get("sites"):
        return
    folder = config.history.checkpoint_dir / run_id / "site-ledgers"
    if not any(folder.glob("*.privacy-ledger.json")):
        raise UserError(
            f"cannot resume run {run_id}: its sites' privacy ledgers are not in {folder} (the "
            "run's --checkpoint-dir); without them every site would account its epsilon from "
            "zero. Restore that folder, or give the --checkpoint-dir the run used"
        )


def run_and_report(config: RunConfig, resolved: Resolved) -> dict:
    """Run a federated simulation (or resume a recorded one) with progress; record each
    round; write the report to ``--out``."""
    from fedweave.config.commands import check_settings
    from fedweave.config.resume import merge_for_resume, stored_run_config
    from fedweave.coordinator.rounds.history_listener import (
        BackgroundRecorder,
        HistoryRecorder,
        resume_point,
    )
    from fedweave.history import open_store
    from fedweave.history.tracking import make_tracker

    console = Console(stderr=True)
    resume = config.history.resume
    store = open_store(config.history.db)  # an unreachable DB fails here, before any training
    start_weights, offset, privacy = None, 0, None
    if resume:
        run = store.get_run(resume)
        config = merge_for_resume(run, config, resolved)
        check_settings(config, resolved.command)  # the stored settings with the given ones
        run_id = run.run_id
        start_weights, offset = resume_point(store, run_id)
        privacy = recorded_privacy(store.rounds(run_id) if offset else [], config.privacy.dp)
        check_resumable(config.privacy, privacy, offset)
        check_site_ledgers(config, run_id, privacy)
        store.mark_running(run_id)
        console.print(f"resuming run {run_id} after round {offset} of {config.training.rounds}")
    task_name, clients = config.data.task, config.data.clients
    task = load_task(task_name)
    headline = headline_metric(task, config.evaluation.select_metric)
    test = checked_test_data(config, task)  # before the run is recorded
    config = with_planned_noise(config)  # --target-epsilon: the noise it stands for
    stored = stored_run_config(config, "simulate")
    schema = pinned_schema(task)
    if schema is not None:
        stored["schema"] = schema
    recorded = (run.config or {}).get("task_package") if resume else None
    package = pinned_for_run(task_name, recorded)
    if package is not None:
        stored["task_package"] = package
    config = pin_initial_model(config, stored, run if resume else None)
    adapter = run_adapter(config)  # --lora-targets and --lora-rank checked on the model
    if adapter is not None:
        stored["adapter"] = adapter
    local = task_local_layers(config.data.task)  # a task's local_layers checked on its model
    if local:
        stored["local_layers"] = list(local)
    config, stored["protections"] = _with_protections(config, offset, test)
    console.print(header_line(stored["protections"]), soft_wrap=True, highlight=False)
    if not resume:
        run_id = uuid.uuid4().hex[:12]
    tracker = make_tracker(config.history.track, run_id, stored)  # a missing package fails here
    if not resume:
        store.start_run("federated", task_name, stored, config.training.seed, run_id=run_id)
        console.print(f"run {run_id} recorded in the history")
    recorder = BackgroundRecorder(
        HistoryRecorder(store, run_id, config.history.checkpoint_dir, tracker=tracker)
    )
    started = time.perf_counter()
    ended: list[str] = []  # why --max-epsilon ended the run early
    try:
        with RoundProgress(
            config.training.rounds, f"federated {task_name}", console, headline
        ) as progress:
            progress.set_completed(offset)
            rows = run_federated_simulation(
                config,
                listeners=[recorder, _ProgressListener(progress)],
                start_weights=start_weights,
                round_offset=offset,
                statistics=recorded_statistics(store.rounds(run_id)) if offset else None,
                test_data=test if config.data.data_dir is not None else None,
                round_starts=[recorder],
                clock_start=recorded_clock(store.rounds(run_id)) if offset else 0.0,
                privacy=privacy,
                ended_early=ended.append,
                site_ledgers=config.history.checkpoint_dir / run_id / "site-ledgers",
                run_id=run_id,
                site_layers=config.history.checkpoint_dir / run_id / "site-layers",
            )
        recorder.flush()
    except KeyboardInterrupt:
        recorder.close()
        store.finish_run(run_id, "interrupted", "stopped by the user (Ctrl-C)")
        console.print(f"run {run_id} interrupted; continue it with --resume {run_id}")
        raise
    except Exception as exc:
        recorder.close()
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        store.finish_run(run_id, "failed", reason)
        raise
    recorder.close()
    if tracker is not None:
        tracker.close()
    history_rows = [
        {
            "round": r["round"],
            headline: headline_value(r, headline),
            "loss": r["eval_loss"],
            "seconds": (r.get("extra") or {}).get("seconds"),
            **(
                {"epsilon": r["extra"]["privacy"]["epsilon"]}
                if (r.get("extra") or {}).get("privacy")
                else {}
            ),
        }
        for r in store.rounds(run_id)
    ]
    recorded_rounds = store.rounds(run_id)
    first_sites = (
        store.site_results(run_id, recorded_rounds[0]["round"]) if recorded_rounds else None
    )
    problem = nothing_learned(recorded_rounds, run_id, first_sites)
    if problem is not None:
        store.finish_run(run_id, "failed", problem)
        raise UserError(f"run {run_id} failed: {problem}")
    store.finish_run(run_id, "completed", ended[0] if ended else None)
    report = build_report(
        "federated",
        task_name,
        clients,
        history_rows if resume else rows,
        headline=headline,
        final_metrics=final_metrics(store.rounds(run_id)),
        run_id=run_id,
        config=stored["settings"],
        wall_seconds=time.perf_counter() - started,
    )
    report["protections"] = stored["protections"]
    report["privacy"] = final_privacy(store.rounds(run_id), config.privacy.dp)
    if ended:
        report["ended_early"] = ended[0]
        console.print(f"run {run_id} ended before its last round: {ended[0]}", highlight=False)
    out = config.simulation.out
    write_report(out, report)
    console.print(rounds_table(
        report["rounds"], title=f"federated {task_name}: {clients} sites", headline=headline
    ))  # fmt: skip
    console.print(
        f"final {headline} {shown(report['final_metrics'].get(headline))}"
        f"{privacy_spent(report['privacy']).replace('  ', '; ', 1)}; run {run_id}; report "
        f"written to {out}"
    )
    store.close()
    return report
