"""``fedweave history``: list, show, plot and export recorded runs; migrate the schema.

Only typer and rich are imported here at module level; SQLAlchemy, Alembic and matplotlib
load inside the commands, so ``fedweave --help`` stays fast. Every user-caused failure ends
as ``error: <one line>`` on stderr with exit code 2.
"""

from __future__ import annotations

import sys
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from fedweave.config.run_config import SETTINGS
from fedweave.errors import UserError, user_errors_as_one_line
from fedweave.history import DB_URL_ENVVAR, DEFAULT_DB_URL
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


def _num(value: float | None, digits: int = 4) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


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
    from rich.table import Table

    with user_errors_as_one_line():
        with _open(db) as store:
            runs = store.list_runs()
        if fmt is ListFormat.json:
            from fedweave.history.csv_export import run_dict

            typer.echo(json.dumps([run_dict(run) for run in runs], indent=2))
            return
        table = Table(title=f"runs in {store.masked_url}")
        for column in (
            "run id",
            "mode",
            "task",
            "status",
            "rounds",
            "started",
            "ended",
            "seed",
            "version",
            "reason",
        ):
            table.add_column(
                column, overflow="fold", no_wrap=column in ("run id", "started", "ended")
            )
        for run in runs:
            table.add_row(
                run.run_id,
                run.mode,
                run.task,
                run.status,
                str(run.rounds_completed),
                _when(run.started_at),
                _when(run.ended_at),
                "-" if run.seed is None else str(run.seed),
                run.code_version,
                run.reason or "",
            )
        Console().print(table if runs else f"no runs in {store.masked_url}")


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
                "rounds": [{**plain(row), "metrics": round_metrics(row)} for row in rounds],
            }
            if sites:
                payload["sites"] = plain(site_rows)
            typer.echo(json.dumps(payload, indent=2))
        elif fmt is ShowFormat.csv:
            write_csv(sys.stdout, *(sites_table(site_rows) if sites else rounds_table(rounds)))
        else:
            _print_run(info, rounds, site_rows if sites else None)


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
    from rich.table import Table

    console = Console()
    console.print(
        f"[bold]run {info.run_id}[/bold]  {info.mode} / {info.task}  "
        f"status [bold]{info.status}[/bold]" + (f" ({info.reason})" if info.reason else "")
    )
    console.print(
        f"started {_when(info.started_at)}  ended {_when(info.ended_at)}  "
        f"seed {info.seed}  fedweave {info.code_version}  "
        f"host {info.hostname} pid {info.pid}"
    )
    console.print(f"config {json.dumps(info.config, sort_keys=True)}", soft_wrap=True)
    several = len({row["actor"] for row in rounds}) > 1
    with_drops = any("drops" in (row.get("extra") or {}) for row in rounds)
    with_bytes = any(row["bytes_in"] or row["bytes_out"] for row in rounds)
    evaluated = [
        name for name in metric_names(rounds) if name.split(".", 1)[0] in ("central", "federated")
    ]
    table = Table()
    for column in (
        (["actor"] if several else [])
        + [
            "round",
            "seconds",
            "sampled",
            "replied",
            "failed",
            "eval loss",
            "eval acc",
            "train loss",
        ]
        + (["bytes in", "bytes out"] if with_bytes else [])
        + ["checkpoint"]
        + evaluated
        + (["drops so far"] if with_drops else [])
    ):
        table.add_column(column, overflow="fold")
    for row in rounds:
        train_loss = row["train_metrics"].get("train_loss", row["train_metrics"].get("loss"))
        cells = [
            str(row["round"]),
            _num(row["seconds"], 2),
            str(row["sampled"]),
            str(row["replied"]),
            str(row["failed"]),
            _num(row["eval_loss"]),
            _num(row["eval_accuracy"]),
            _num(train_loss) if isinstance(train_loss, (int, float)) else "-",
            *([str(row["bytes_in"] or "-"), str(row["bytes_out"] or "-")] if with_bytes else []),
            "yes" if row["checkpoint_path"] else "",
        ]
        found = round_metrics(row)
        cells += [_num(found.get(name)) for name in evaluated]
        if with_drops:
            cells.append(_drops((row.get("extra") or {}).get("drops")))
        table.add_row(*([row["actor"]] if several else []), *cells)
    console.print(table if rounds else "no rounds recorded yet")
    _print_best(console, info, rounds)
    _print_cross_site(console, info, rounds)
    if site_rows is not None:
        sites_table = Table(title="site results")
        for column in (
            "actor",
            "round",
            "site",
            "status",
            "examples",
            "seconds",
            "metrics",
            "reason",
        ):
            sites_table.add_column(column, overflow="fold")
        for site in site_rows:
            sites_table.add_row(
                site["actor"],
                str(site["round"]),
                site["site_id"],
                site["status"],
                str(site["num_examples"]),
                _num(site["seconds"], 2),
                json.dumps(site["metrics"], sort_keys=True),
                site["reason"] or "",
            )
        console.print(sites_table)
        _print_site_evaluations(console, rounds)


def _print_best(console: Any, info: RunInfo, rounds: list[dict[str, Any]]) -> None:
    """The round whose model scored best on the run's --select-metric (the one exported as
    best.safetensors)."""
    from fedweave.history.model_export import chosen_rounds

    if info.mode != "federated":
        return
    _, best, chosen = chosen_rounds(info, rounds)
    if best is not None:
        console.print(
            f"best round {chosen['round']} by {chosen['qualified']} ({chosen['mode']}): "
            f"{chosen['value']:.4f}",
            highlight=False,
        )


def _print_cross_site(console: Any, info: RunInfo, rounds: list[dict[str, Any]]) -> None:
    """The cross-site matrix (models × sites) for the run's --select-metric."""
    from rich.table import Table

    from fedweave.history.metrics import cross_site_matrix

    evaluation = (info.config.get("settings") or {}).get("evaluation") or {}
    metric = str(evaluation.get("select_metric") or "loss").rsplit(".", 1)[-1]
    found = cross_site_matrix(rounds, metric)
    if found is None:
        return
    models, sites, cells = found
    table = Table(title=f"cross-site evaluation: {metric} of each model (rows) at each site")
    table.add_column("model")
    for site in sites:
        table.add_column(site)
    for model in models:
        table.add_row(model, *(cells.get((model, site), "-") for site in sites))
    console.print(table)


def _print_site_evaluations(console: Any, rounds: list[dict[str, Any]]) -> None:
    """Each site's federated evaluation per round, when the run has any."""
    import json

    from rich.table import Table

    rows = [(row, site) for row in rounds for site in site_evaluations(row)]
    if not rows:
        return
    table = Table(title="site evaluations (federated)")
    for column in ("round", "site", "status", "examples", "metrics", "reason"):
        table.add_column(column, overflow="fold")
    for row, site in rows:
        metrics = {k: v for k, v in (site.get("metrics") or {}).items() if k != "node_id"}
        table.add_row(
            str(row["round"]), str(site.get("site")), str(site.get("status")),
            str(site.get("examples") or 0),
            json.dumps({k: round(v, 4) if isinstance(v, float) else v
                        for k, v in sorted(metrics.items())}),
            site.get("reason") or "",
        )  # fmt: skip
    console.print(table)


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
        typer.Option("--label-column", help="Label column of a CSV file read by position.",
                     show_default=False),
    ] = None,
    db: DbOption = DEFAULT_DB_URL,
) -> None:
    """Score a data file with a recorded run's final (or best) model: one CSV row per
    example, read and prepared as the run's sites read and prepared theirs."""
    from fedweave.history.predict import predict_run

    with user_errors_as_one_line():
        with _open(db) as store:
            count, round_number = predict_run(store, run_id, data, out, best, label_column)
        typer.echo(f"wrote {out}: {count} predictions by the model of round {round_number}")


@history_app.command("migrate")
def migrate_command(db: DbOption = DEFAULT_DB_URL) -> None:
    """Create the history schema or migrate it to this fedweave's version.

    Runs also do this on first use; use it to upgrade a shared PostgreSQL database once,
    ahead of the runs. Refuses a schema newer than this fedweave.
    """
    from sqlalchemy.exc import DBAPIError

    from fedweave.history.engine import describe_connect_error, make_engine
    from fedweave.history.errors import HistoryUnavailableError
    from fedweave.history.migrate import upgrade

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
