"""The simulation report (JSON contract shared by both modes) and its live progress view."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from fedweave.errors import UserError
from fedweave.history.metrics import evaluation_lines
from fedweave.history.round_summary import privacy_spent, shown
from fedweave.private_files import write_private_text


def check_writable(path: Path) -> None:
    """Fail before any training if the report could not be written."""
    parent = path.parent if str(path.parent) else Path(".")
    if path.is_dir():
        raise UserError(f"--out {path} is a directory; give a file name such as report.json")
    if not parent.is_dir():
        raise UserError(f"--out {path}: directory {parent} does not exist; create it first")
    if not os.access(parent, os.W_OK) or (path.exists() and not os.access(path, os.W_OK)):
        raise UserError(f"--out {path} is not writable; choose another path")


def build_report(
    mode: str, task: str, clients: int, rounds: list[dict[str, Any]], **extra: Any
) -> dict[str, Any]:
    """``{"mode", "task", "clients", "rounds": [...], "final_accuracy", ...extra}``; a
    federated report's ``extra`` adds ``headline`` (the metric its rows and closing line
    lead with) and ``final_metrics`` (every metric of the final model)."""
    report: dict[str, Any] = {"mode": mode, "task": task, "clients": clients, "rounds": rounds}
    report["final_accuracy"] = rounds[-1].get("accuracy") if rounds else None
    report.update(extra)
    if "final_metrics" in extra:
        report["final_accuracy"] = extra["final_metrics"].get("accuracy")
    return report


def write_report(path: Path, report: dict[str, Any]) -> None:
    """Write the report as indented JSON (atomically: a crash never leaves half a file)."""
    tmp = path.with_name(path.name + ".tmp")
    try:
        write_private_text(tmp, json.dumps(report, indent=2) + "\n")
        os.replace(tmp, path)
    except OSError as exc:
        raise UserError(
            f"cannot write report {path} ({exc.strerror}); choose another --out"
        ) from exc


def rounds_table(
    rows: list[dict[str, Any]], title: str = "Rounds", headline: str = "accuracy"
) -> Table:
    """A rich table of per-round results, ``headline`` in accuracy's place; extra numeric
    columns are shown too."""
    first = ("round", headline, "loss", "seconds")
    extra = [k for k in (rows[0] if rows else {}) if k not in first]
    table = Table(title=title)
    for name in (*first, *extra):
        table.add_column(name.replace("_", " "), justify="right")
    for row in rows:
        table.add_row(*(_fmt(row.get(name)) for name in (*first, *extra)))
    return table


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4f}" if abs(value) < 100 else f"{value:.1f}"
    return "" if value is None else str(value)


class RoundProgress:
    """A progress bar over rounds with one printed line per finished round.

    Use as a context manager; call ``update(row)`` with a report row after each round.
    """

    def __init__(
        self,
        total_rounds: int,
        description: str,
        console: Console | None = None,
        headline: str = "accuracy",
    ) -> None:
        self.headline = headline  # the rows' metric in accuracy's place
        self.console = console or Console(stderr=True)
        self.progress = Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[status]}"),
            TimeElapsedColumn(),
            console=self.console,
            transient=True,
        )
        self.task_id = self.progress.add_task(description, total=total_rounds, status="starting")

    def __enter__(self) -> RoundProgress:
        self.progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.progress.stop()

    def set_completed(self, rounds_done: int) -> None:
        self.progress.update(self.task_id, completed=rounds_done)

    def update(self, row: dict[str, Any]) -> None:
        name, value = self.headline, row.get(self.headline)
        short = "acc" if name == "accuracy" else name
        status = f"{short} {shown(value, 3)}  loss {shown(row['loss'], 3)}"
        self.progress.console.print(
            f"round {row['round']:>4}  {name} {shown(value)}  loss {shown(row['loss'])}"
            f"  {row['seconds']:.2f}s" + privacy_spent(row.get("privacy"))
        )
        for line in evaluation_lines(row.get("evaluation") or {}):
            self.progress.console.print(f"  {line}", highlight=False, soft_wrap=True)
        for warning in row.get("warnings") or ():
            self.progress.console.print(f"  warning: {warning}", highlight=False, soft_wrap=True)
        self.progress.update(self.task_id, advance=1, status=status)
