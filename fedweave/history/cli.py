"""``fedweave history``: list, show, plot and export recorded runs; migrate the schema.

Only typer and rich are imported here at module level; SQLAlchemy, Alembic and matplotlib
load inside the commands, so ``fedweave --help`` stays fast. Every user-caused failure ends
as ``error: <one line>`` on stderr with exit code 2.
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from fedweave.config.run_config import SETTINGS
from fedweave.config.sections import DB_URL_ENVVAR, DEFAULT_DB_URL
from fedweave.errors import UserError, user_errors_as_one_line
from fedweave.history.metrics import metric_names, round_metrics, site_evaluations

if TYPE_CHECKING:
    from datetime import datetime

    from fedweave.history.records import RunInfo
    from fedweave.history.store import HistoryStore

history_app = typer.Typer(
    name="history",
    help="Inspect the SQL round history that federated and gossip runs write: list runs, "
    "show their rounds, plot or export them, and migrate the database schema.",
    no_args_is_help=True,
    add_completion=False,
)

DbOption = Annotated[
    str,
    typer.Option(
        "--db",
        envvar=DB_URL_ENVVAR,
        help=SETTINGS["db"].meta.help,  # the one declaration every command shares
        show_default=True,
    ),
]
RunArg = Annotated[
    str,
    typer.Argument(
        help="Run id (or a unique prefix of 4+ characters), or 'latest' for the "
        "most recently started run.",
        show_default=False,
    ),
]


class ListFormat(str, Enum):
    table = "table"
    json = "json"


class ShowFormat(str, Enum):
    table = "table"
    json = "json"
    csv = "csv"


def _open(db: str) -> HistoryStore:
    """Open the store for reading; refuses to create a new SQLite file by accident."""
    from fedweave.errors import mask_url_password
    from fedweave.history.engine import sqlite_file
    from fedweave.history.store import open_store

    path = sqlite_file(db)
    if path is not None and not path.exists():
        raise UserError(
            f"no history database at {path} ('{mask_url_password(db)}'); pass the "
            f"--db the run wrote to (or set ${DB_URL_ENVVAR})"
        )
    return open_store(db)


def _when(value: datetime | None) -> str:
    return value.astimezone().strftime("%Y-%m-%d %H:%M:%S") if value else "-"


def _when_short(value: datetime | None) -> str:
    """``_when`` without the year and the seconds (``11-26 10:13``), for narrow consoles."""
    return value.astimezone().strftime("%m-%d %H:%M") if value else "-"


def _num(value: float | None) -> str:
    """``value`` to 4 significant digits in fixed point (0.1235, 0.04115, 12.35, 1235), with
    an exponent outside 1e-4 .. 1e6; ``-`` when unknown. CSV and JSON keep every digit."""
    if value is None:
        return "-"
    value = float(value)
    if value == 0 or not math.isfinite(value):
        return f"{value:g}"
    magnitude = math.floor(math.log10(abs(value)))
    if not -4 <= magnitude < 6:
        return f"{value:.3e}"
    return f"{value:.{max(0, 3 - magnitude)}f}"


def _bytes(count: int | None) -> str:
    """A byte count to 4 significant digits with a decimal unit (``123.5 MB``)."""
    if not count:
        return "-"
    for power, unit in ((4, "TB"), (3, "GB"), (2, "MB"), (1, "kB")):
        if count >= 1000**power:
            return f"{_num(count / 1000**power)} {unit}"
    return f"{count} B"


def _metrics_text(metrics: dict[str, Any]) -> str:
    """A site's metrics as ``auc 0.9912, loss 0.2123``, numbers to 4 significant digits."""
    text = ", ".join(
        f"{name} {_num(value) if isinstance(value, float) else value}"
        for name, value in sorted(metrics.items())
    )
    return text or "-"


FLEX_MIN = 10
"""A free-text column (a reason, a site's metrics) is shown only where it gets this many
characters at least; it wraps into whatever room the table leaves."""


@dataclass
class _Column:
    """One column of a console table, and how it gives way when the console is narrow.

    A table that fits the console is printed whole. Otherwise its headers of two words
    (``eval loss``, ``central.auc``) go on two lines where that makes the column narrower,
    the columns of rank 0 (what names a row, and its key facts) are always shown, and the
    others are added by rank (1 first) while they fit: whole, else abbreviated (``short``),
    else left out, which a dim line under the table then names. Cells never wrap, except
    those of a ``flexible`` column, which wraps into the room left.
    """

    header: str
    cells: list[str]
    rank: int = 0
    numeric: bool = False
    flexible: bool = False
    short: list[str] | None = None


def _text_width(text: str) -> int:
    from rich.cells import cell_len

    return max((cell_len(line) for line in text.split("\n")), default=0)


def _stacked(header: str, cells: list[str]) -> str:
    """``eval loss`` as ``eval/loss``, ``central.auc`` as ``central./auc`` (two lines) where
    the header is wider than the column's cells."""
    widest = max(map(_text_width, cells), default=0)
    for separator, kept in ((" ", ""), (".", ".")):
        head, found, tail = header.partition(separator)
        if found and tail and _text_width(header) > widest:
            return f"{head}{kept}\n{tail}"
    return header


def _table_width(shown: list[tuple[_Column, str, list[str]]]) -> int:
    """The width of a rich table (default box, padding 1) of these columns, each as wide as
    its widest cell; a flexible column counts at FLEX_MIN."""
    total = 1
    for column, header, cells in shown:
        width = max(_text_width(header), *map(_text_width, cells))
        total += (min(width, FLEX_MIN) if column.flexible else width) + 3
    return total


def _fit(
    columns: list[_Column], width: int
) -> tuple[list[tuple[_Column, str, list[str]]], list[str]]:
    """(the columns to show, as (column, header, cells), in table order; the headers of the
    columns left out) for a console ``width`` wide."""
    whole = [(column, column.header, column.cells) for column in columns]
    if _table_width(whole) <= width:
        return whole, []
    chosen: dict[int, tuple[_Column, str, list[str]]] = {}
    for index, column in sorted(enumerate(columns), key=lambda item: item[1].rank):
        for cells in [column.cells] + ([column.short] if column.short else []):
            trial = {**chosen, index: (column, _stacked(column.header, cells), cells)}
            if column.rank == 0 or _table_width(list(trial.values())) <= width:
                chosen = trial
                break
    left_out = [column.header for index, column in enumerate(columns) if index not in chosen]
    return [chosen[index] for index in sorted(chosen)], left_out


def _fitted_table(
    console: Any, columns: list[_Column], title: str | None = None
) -> tuple[Any, list[str]]:
    """(a rich Table of ``columns`` fitted to the console's width, the columns left out)."""
    from rich.table import Table
    from rich.text import Text

    shown, left_out = _fit(columns, console.width)
    # where even the rank-0 columns do not fit (a very narrow console) every cell may wrap:
    # wrapped beats squeezed to nothing
    fits = _table_width(shown) <= console.width
    table = Table(title=title)
    for column, header, cells in shown:
        fixed = fits and not column.flexible
        table.add_column(
            header,
            justify="right" if column.numeric else "left",
            no_wrap=fixed,
            min_width=max(_text_width(header), *map(_text_width, cells)) if fixed else None,
            overflow="fold",
        )
    for row in zip(*(cells for _, _, cells in shown)):
        table.add_row(*(Text(cell) for cell in row))
    return table, left_out


def _print_left_out(console: Any, left_out: list[str], formats: str) -> None:
    """One dim line under a table that left columns out, naming them."""
    from rich.text import Text

    if left_out:
        console.print(
            Text(
                f"left out at {console.width} columns: {', '.join(left_out)}; "
                f"a wider terminal or {formats} shows them",
                style="dim",
            )
        )


def _print_parts(console: Any, parts: list[Any]) -> None:
    """``parts`` (str or rich Text) joined by two spaces, wrapped between parts, never inside
    one that fits the console (``seed 42`` stays on one line)."""
    from rich.text import Text

    line = Text()
    for part in parts:
        text = Text(part) if isinstance(part, str) else part
        if line and line.cell_len + 2 + text.cell_len > console.width:
            console.print(line)
            line = Text()
        if line:
            line.append("  ")
        line.append_text(text)
    if line:
        console.print(line)


@history_app.command("runs")
def runs_command(
    db: DbOption = DEFAULT_DB_URL,
    fmt: Annotated[
        ListFormat,
        typer.Option(
            "--format",
            help="table: a readable table; json: a list of run objects for scripts.",
        ),
    ] = ListFormat.table,
) -> None:
    """List recorded runs, most recent first: id, mode, task, status, rounds, times."""
    import json

    from rich.console import Console

    with user_errors_as_one_line():
        with _open(db) as store:
            runs = store.list_runs()
        if fmt is ListFormat.json:
            from fedweave.history.csv_export import run_dict

            typer.echo(json.dumps([run_dict(run) for run in runs], indent=2))
            return
        console = Console()
        if not runs:
            console.print(f"no runs in {store.masked_url}")
            return
        # at 80 columns: id, mode, task, status and rounds always; then, while they fit, the
        # start (else without year and seconds), the reason, the end, the seed, the version
        table, left_out = _fitted_table(
            console,
            [
                _Column("run id", [run.run_id for run in runs]),
                _Column("mode", [run.mode for run in runs]),
                _Column("task", [run.task for run in runs]),
                _Column("status", [run.status for run in runs]),
                _Column("rounds", [str(run.rounds_completed) for run in runs], numeric=True),
                _Column(
                    "started",
                    [_when(run.started_at) for run in runs],
                    rank=1,
                    short=[_when_short(run.started_at) for run in runs],
                ),
                _Column(
                    "ended",
                    [_when(run.ended_at) for run in runs],
                    rank=3,
                    short=[_when_short(run.ended_at) for run in runs],
                ),
                _Column(
                    "seed",
                    ["-" if run.seed is None else str(run.seed) for run in runs],
                    rank=4,
                    numeric=True,
                ),
                _Column("version", [run.code_version for run in runs], rank=5),
                _Column("reason", [run.reason or "" for run in runs], rank=2, flexible=True),
            ],
            title=f"runs in {store.masked_url}",
        )
        console.print(table)
        _print_left_out(console, left_out, "--format json")


@history_app.command("show")
def show_command(
    run_id: RunArg,
    db: DbOption = DEFAULT_DB_URL,
    fmt: Annotated[
        ShowFormat,
        typer.Option(
            "--format",
            help="table: readable; json: run, rounds (and sites) as one object; "
            "csv: the rounds (or, with --sites, the site results) as CSV on stdout.",
        ),
    ] = ShowFormat.table,
    sites: Annotated[
        bool,
        typer.Option(
            "--sites",
            help="Also show each site's (gossip: each neighbour's) result per round.",
        ),
    ] = False,
    config: Annotated[
        bool,
        typer.Option(
            "--config",
            help="Print only the run's config, as TOML that `fedweave <command> "
            "--config FILE` runs again.",
        ),
    ] = False,
) -> None:
    """Show one run: its config and status, then one line per round (and per site).

    RUN_ID is a run id, a unique prefix of it (4+ characters), or 'latest'.
    """
    import json

    from fedweave.history.csv_export import plain, rounds_table, run_dict, sites_table, write_csv

    with user_errors_as_one_line():
        with _open(db) as store:
            info = store.get_run(run_id)
            if config:
                from fedweave.config.resume import config_as_toml

                typer.echo(config_as_toml(info), nl=False)
                return
            rounds = store.rounds(info.run_id)
            site_rows = store.site_results(info.run_id) if sites else []
        if fmt is ShowFormat.json:
            from fedweave.history.metrics import round_metrics

            payload = {
                "run": run_dict(info),
                "rounds": [
                    {**plain(row), "metrics": round_metrics(row), **_privacy_of(row)}
                    for row in rounds
                ],
            }
            if sites:
                payload["sites"] = plain(site_rows)
            typer.echo(json.dumps(payload, indent=2))
        elif fmt is ShowFormat.csv:
            write_csv(sys.stdout, *(sites_table(site_rows) if sites else rounds_table(rounds)))
        else:
            _print_run(info, rounds, site_rows if sites else None)


def _privacy_of(row: dict[str, Any]) -> dict[str, Any]:
    """``epsilon`` and ``delta`` spent by a DP run up to ``row``'s round (the ledger in its
    ``extra``); ``{}`` for a run without DP."""
    privacy = (row.get("extra") or {}).get("privacy")
    if not isinstance(privacy, dict):
        return {}
    return {"epsilon": privacy.get("epsilon"), "delta": privacy.get("delta")}


def _privacy_line(info: RunInfo, rounds: list[dict[str, Any]]) -> str:
    """What the run spent of privacy, in words: ``no differential privacy``, or its ledger
    after the last recorded round."""
    mode = ((info.config.get("settings") or {}).get("privacy") or {}).get("dp", "none")
    if mode == "none":
        return "no differential privacy"
    spent = _privacy_of(rounds[-1]) if rounds else {}
    if not spent:
        return f"differential privacy {mode}: no round spent any yet"
    from fedweave.privacy.statement import statement

    said = statement(mode)
    return (
        f"differential privacy {mode}: epsilon {spent['epsilon']:.3f} at delta "
        f"{spent['delta']:g} after round {rounds[-1]['round']} (relation {said['relation']}, "
        f"sensitivity {said['sensitivity']}, accountant {said['accountant']})"
    )


def _drops(counts: dict[str, int] | None) -> str:
    """A gossip peer's running drop counters by reason, e.g. ``busy 2, spoofed-id 1``."""
    if not counts:
        return "-"
    return ", ".join(f"{reason} {n}" for reason, n in sorted(counts.items()) if n) or "-"


def _print_run(
    info: RunInfo, rounds: list[dict[str, Any]], site_rows: list[dict[str, Any]] | None
) -> None:
    import json

    from rich.console import Console
    from rich.text import Text

    console = Console()
    _print_parts(
        console,
        [
            Text(f"run {info.run_id}", style="bold"),
            f"{info.mode} / {info.task}",
            Text.assemble("status ", (info.status, "bold")),
        ]
        + ([f"({info.reason})"] if info.reason else []),
    )
    _print_parts(
        console,
        [
            f"started {_when(info.started_at)}",
            f"ended {_when(info.ended_at)}",
            f"seed {info.seed}",
            f"fedweave {info.code_version}",
            f"host {info.hostname} pid {info.pid}",
        ],
    )
    console.print(f"config {json.dumps(info.config, sort_keys=True)}", soft_wrap=True)
    if info.status == "running" and info.sites_wait is not None:
        console.print(info.sites_wait.line(), soft_wrap=True, highlight=False)
    if rounds:
        table, left_out = _fitted_table(console, _round_columns(info, rounds))
        console.print(table)
        _print_left_out(console, left_out, "--format json/csv")
    else:
        console.print("no rounds recorded yet")
    if info.mode == "federated":
        console.print(_privacy_line(info, rounds), soft_wrap=True, highlight=False)
    _print_best(console, info, rounds)
    _print_cross_site(console, info, rounds)
    if site_rows is not None:
        _print_site_results(console, site_rows)
        _print_site_evaluations(console, rounds)


def _epsilon(row: dict[str, Any]) -> float | None:
    """A DP run's cumulative epsilon after ``row``'s round (``None``: not a DP run)."""
    privacy = (row.get("extra") or {}).get("privacy")
    return privacy.get("epsilon") if isinstance(privacy, dict) else None


def _round_columns(info: RunInfo, rounds: list[dict[str, Any]]) -> list[_Column]:
    """The rounds table. Always shown: the actor (gossip), the round, eval loss and
    accuracy (when the task has one); then, while they fit: the run's --select-metric,
    train loss, the drops so far (gossip), seconds, failed, replied, sampled, the other
    evaluation metrics, the checkpoint, bytes in and out, and last the metrics that repeat
    eval loss or accuracy."""
    from fedweave.history.metrics import qualified

    several = len({row["actor"] for row in rounds}) > 1
    with_drops = any("drops" in (row.get("extra") or {}) for row in rounds)
    with_bytes = any(row["bytes_in"] or row["bytes_out"] for row in rounds)
    evaluated = [
        name for name in metric_names(rounds) if name.split(".", 1)[0] in ("central", "federated")
    ]
    found = [round_metrics(row) for row in rounds]
    evaluation = (info.config.get("settings") or {}).get("evaluation") or {}
    selected = qualified(rounds, str(evaluation.get("select_metric") or "loss"))

    def train_loss(row: dict[str, Any]) -> str:
        value = row["train_metrics"].get("train_loss", row["train_metrics"].get("loss"))
        return _num(value) if isinstance(value, (int, float)) else "-"

    def repeats_headline(name: str) -> bool:
        """Whether metric ``name`` is eval loss or eval accuracy again in every round."""
        return any(
            all(metrics.get(name) == row[field] for metrics, row in zip(found, rounds))
            for field in ("eval_loss", "eval_accuracy")
        )

    def rank(name: str) -> int:
        if repeats_headline(name):
            return 12
        return 1 if name == selected else 8

    def numbers(header: str, values: list[Any], rank: int) -> _Column:
        return _Column(header, [str(value) for value in values], rank, numeric=True)

    return (
        ([_Column("actor", [row["actor"] for row in rounds])] if several else [])
        + [
            numbers("round", [row["round"] for row in rounds], 0),
            numbers("seconds", [_num(row["seconds"]) for row in rounds], 4),
            numbers("sampled", [row["sampled"] for row in rounds], 7),
            numbers("replied", [row["replied"] for row in rounds], 6),
            numbers("failed", [row["failed"] for row in rounds], 5),
            numbers("eval loss", [_num(row["eval_loss"]) for row in rounds], 0),
        ]
        + (  # a task without accuracy (a regression) shows its own metrics instead
            [numbers("eval acc", [_num(row["eval_accuracy"]) for row in rounds], 0)]
            if any(row["eval_accuracy"] is not None for row in rounds)
            else []
        )
        + [
            numbers("train loss", [train_loss(row) for row in rounds], 2),
        ]
        + (
            [numbers("epsilon", [_num(_epsilon(row)) for row in rounds], 1)]
            if any(_epsilon(row) is not None for row in rounds)
            else []
        )
        + (
            [
                numbers("bytes in", [_bytes(row["bytes_in"]) for row in rounds], 10),
                numbers("bytes out", [_bytes(row["bytes_out"]) for row in rounds], 11),
            ]
            if with_bytes
            else []
        )
        + [_Column("checkpoint", ["yes" if row["checkpoint_path"] else "" for row in rounds], 9)]
        + [
            numbers(name, [_num(metrics.get(name)) for metrics in found], rank(name))
            for name in evaluated
        ]
        + (
            [
                _Column(
                    "drops so far",
                    [_drops((row.get("extra") or {}).get("drops")) for row in rounds],
                    rank=3,
                    flexible=True,
                )
            ]
            if with_drops
            else []
        )
    )


def _print_site_results(console: Any, site_rows: list[dict[str, Any]]) -> None:
    """Each site's (gossip: each neighbour's) result per round. The actor is left out first
    when it is the coordinator in every row; round, site and status are always shown."""
    several = len({site["actor"] for site in site_rows}) > 1
    table, left_out = _fitted_table(
        console,
        [
            _Column("actor", [site["actor"] for site in site_rows], 0 if several else 5),
            _Column("round", [str(site["round"]) for site in site_rows], numeric=True),
            _Column("site", [site["site_id"] for site in site_rows]),
            _Column("status", [site["status"] for site in site_rows]),
            _Column("examples", [str(site["num_examples"]) for site in site_rows], 3, numeric=True),
            _Column("seconds", [_num(site["seconds"]) for site in site_rows], 4, numeric=True),
            _Column(
                "metrics",
                [_metrics_text(site["metrics"] or {}) for site in site_rows],
                2,
                flexible=True,
            ),
            _Column("reason", [site["reason"] or "" for site in site_rows], 1, flexible=True),
        ],
        title="site results",
    )
    console.print(table)
    _print_left_out(console, left_out, "--format json/csv --sites")


def _print_best(console: Any, info: RunInfo, rounds: list[dict[str, Any]]) -> None:
    """The round whose model scored best on the run's --select-metric (the one exported as
    best.safetensors)."""
    from fedweave.history.model_export import chosen_rounds

    if info.mode != "federated":
        return
    _, best, chosen = chosen_rounds(info, rounds)
    if best is not None:
        examples = chosen.get("examples")
        console.print(
            f"best round {chosen['round']} by {chosen['qualified']} ({chosen['mode']}): "
            f"{_num(chosen['value'])}, {chosen['statistic']}"
            + (f", on {examples} evaluation examples" if examples is not None else ""),
            highlight=False,
        )
        if chosen.get("warning"):
            console.print(f"warning: {chosen['warning']}", highlight=False)


def _print_cross_site(console: Any, info: RunInfo, rounds: list[dict[str, Any]]) -> None:
    """The cross-site matrix (models × sites) for the run's --select-metric; split into
    several tables of fewer sites each where all sites do not fit the console."""
    from rich.table import Table
    from rich.text import Text

    from fedweave.history.metrics import cross_site_matrix

    evaluation = (info.config.get("settings") or {}).get("evaluation") or {}
    metric = str(evaluation.get("select_metric") or "loss").rsplit(".", 1)[-1]
    found = cross_site_matrix(rounds, metric)
    if found is None:
        return
    models, sites, cells = found
    title = f"cross-site evaluation: {metric} of each model (rows) at each site"

    def column(site: str) -> tuple[_Column, str, list[str]]:
        values = [cells.get((model, site), "-") for model in models]
        return _Column(site, values), site, values

    parts: list[list[str]] = [[]]  # the sites of each table
    for site in sites:
        trial = [(_Column("model", models), "model", models), *map(column, [*parts[-1], site])]
        if parts[-1] and _table_width(trial) > console.width:
            parts.append([])
        parts[-1].append(site)
    for number, part in enumerate(parts):
        more = f"cross-site evaluation: {metric}, more sites"
        table = Table(title=title if number == 0 else more)
        table.add_column("model", no_wrap=True)
        for site in part:
            table.add_column(site, justify="right", no_wrap=True, overflow="fold")
        for model in models:
            table.add_row(Text(model), *(Text(cells.get((model, site), "-")) for site in part))
        console.print(table)


def _print_site_evaluations(console: Any, rounds: list[dict[str, Any]]) -> None:
    """Each site's federated evaluation per round, when the run has any."""
    rows = [(row, site) for row in rounds for site in site_evaluations(row)]
    if not rows:
        return

    def metrics(site: dict[str, Any]) -> str:
        return _metrics_text(
            {k: v for k, v in (site.get("metrics") or {}).items() if k != "node_id"}
        )

    table, left_out = _fitted_table(
        console,
        [
            _Column("round", [str(row["round"]) for row, _ in rows], numeric=True),
            _Column("site", [str(site.get("site")) for _, site in rows]),
            _Column("status", [str(site.get("status")) for _, site in rows]),
            _Column(
                "examples", [str(site.get("examples") or 0) for _, site in rows], 3, numeric=True
            ),
            _Column("metrics", [metrics(site) for _, site in rows], 1, flexible=True),
            _Column("reason", [site.get("reason") or "" for _, site in rows], 2, flexible=True),
        ],
        title="site evaluations (federated)",
    )
    console.print(table)
    _print_left_out(console, left_out, "--format json")


@history_app.command("plot")
def plot_command(
    run_ids: Annotated[
        list[str],
        typer.Argument(
            help="One or more run ids (or 'latest'); each becomes one curve. Gossip runs are "
            "drawn as the mean over peers per round, with the min-max band shaded.",
            show_default=False,
        ),
    ],
    out: Annotated[
        Path, typer.Option("--out", help="PNG file to write (folders are created).")
    ] = Path("curve.png"),
    db: DbOption = DEFAULT_DB_URL,
    metric: Annotated[
        list[str] | None,
        typer.Option(
            "--metric",
            help="A metric to draw, one panel each (repeatable): a name the task computes "
            "(auc: the federated one when the run has it, else the central one), or "
            "qualified (central.auc, federated.loss, train.loss). Default: the round's "
            "evaluation accuracy and loss.",
            show_default=False,
        ),
    ] = None,
) -> None:
    """Plot evaluation metrics per round of several runs into one PNG.

    RUN_IDS are run ids (or unique prefixes, or 'latest'); each run is one curve. Gossip runs
    are drawn as the mean over peers per round, with the min-max band shaded.
    """
    from fedweave.history.plotting import plot_runs

    with user_errors_as_one_line():
        with _open(db) as store:
            series = []
            for ref in run_ids:
                info = store.get_run(ref)
                label = f"{info.run_id} {info.mode}/{info.task}"
                if info.actors > 1:
                    label += f" (mean of {info.actors} peers)"
                series.append((label, store.rounds(info.run_id)))
        plot_runs(series, out, metric or None)
        typer.echo(f"wrote {out}")


@history_app.command("export")
def export_command(
    run_id: RunArg,
    to: Annotated[
        Path,
        typer.Option(
            "--to",
            help="Folder to write rounds.csv, sites.csv, run.json and model.npz (a copy "
            "of the final checkpoint, verified against its sha256) into; created if missing.",
            show_default=False,
        ),
    ],
    db: DbOption = DEFAULT_DB_URL,
    actor: Annotated[
        str | None,
        typer.Option(
            "--actor",
            help="Gossip: whose model (a peer id from the actor column); default: the "
            "peer with the highest checkpointed round.",
            show_default=False,
        ),
    ] = None,
) -> None:
    """Export one run's history and final model to a folder.

    Writes rounds.csv, sites.csv, run.json and model.npz (the final checkpoint, verified
    against its recorded sha256; load it with ``set_weights(task.build_model(),
    load_weights_npz(PATH))``). RUN_ID is a run id, a unique prefix, or 'latest'.
    """
    from fedweave.history.csv_export import export_run

    with user_errors_as_one_line():
        with _open(db) as store:
            notes: list[str] = []
            written = export_run(store, run_id, to, actor, notes)
        for path in written:
            typer.echo(f"wrote {path}")
        for note in notes:
            typer.echo(f"note: {note}", err=True)
        if not any(path.name == "model.npz" for path in written):
            typer.echo("note: the run has no recorded checkpoint; no model.npz written", err=True)


def predict_command(
    run_id: Annotated[
        str,
        typer.Option(
            "--run",
            help="The run whose model scores the data: a run id, a unique prefix, or 'latest'.",
            show_default=False,
        ),
    ],
    data: Annotated[
        Path,
        typer.Option(
            "--data",
            help="The examples to score, read like a site's --data (a tabular task's label "
            "column may be absent).",
            show_default=False,
        ),
    ],
    out: Annotated[
        Path, typer.Option("--out", help="CSV to write: row, prediction (and probabilities).")
    ] = Path("predictions.csv"),
    best: Annotated[
        bool,
        typer.Option(
            "--best",
            help="Use the round that scored best on the run's --select-metric, not the last.",
        ),
    ] = False,
    label_column: Annotated[
        str | None,
        typer.Option(
            "--label-column",
            help="Label column of a CSV file read by position.",
            show_default=False,
        ),
    ] = None,
    columns: Annotated[
        Path | None,
        typer.Option(
            "--columns",
            help="Column map (TOML, a 'columns' table: this file's "
            'header = "task column"), as fedweave client --columns.',
            show_default=False,
        ),
    ] = None,
    site: Annotated[
        str | None,
        typer.Option(
            "--site",
            help="A run whose task keeps local layers at the sites (a personal head): score "
            "with this simulated site's own layers (kept beside the run's checkpoints).",
            show_default=False,
        ),
    ] = None,
    site_layers: Annotated[
        Path | None,
        typer.Option(
            "--site-layers",
            help="The same for a deployed site: its file of the run's local layers "
            "(RUN.safetensors in its fedweave client --personal-state folder).",
            show_default=False,
        ),
    ] = None,
    db: DbOption = DEFAULT_DB_URL,
) -> None:
    """Score a data file with a recorded run's final (or best) model: one CSV row per
    example, read and prepared as the run's sites read and prepared theirs."""
    from fedweave.history.predict import predict_run

    with user_errors_as_one_line():
        with _open(db) as store:
            count, round_number = predict_run(
                store, run_id, data, out, best, label_column, columns, site, site_layers
            )
        typer.echo(f"wrote {out}: {count} predictions by the model of round {round_number}")


@history_app.command("migrate")
def migrate_command(db: DbOption = DEFAULT_DB_URL) -> None:
    """Create the history schema or migrate it to this fedweave's version.

    Runs also do this on first use; use it to upgrade a shared PostgreSQL database once,
    ahead of the runs. Refuses a schema newer than this fedweave.
    """
    from sqlalchemy.exc import DBAPIError

    from fedweave.history.engine import describe_connect_error, make_engine
    from fedweave.history.migrate import upgrade
    from fedweave.history.store_errors import HistoryUnavailableError

    with user_errors_as_one_line():
        engine = make_engine(db)
        try:
            before, after = upgrade(engine, db)
        except DBAPIError as exc:
            raise HistoryUnavailableError(describe_connect_error(db, exc)) from None
        finally:
            engine.dispose()
        if before == after:
            typer.echo(f"schema already at {after}")
        else:
            typer.echo(f"schema migrated from {before or 'empty'} to {after}")


def main() -> None:
    """Entry point for ``python -m fedweave.history.cli``."""
    history_app()


if __name__ == "__main__":
    main()
