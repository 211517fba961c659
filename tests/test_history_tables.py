"""``fedweave history runs`` and ``history show`` stay readable in an 80-column terminal
(issue 23): the columns that name a row (run id, round, actor) and its key facts (mode, task,
status, rounds, eval loss and accuracy) are shown whole, numbers never wrap over two lines,
and the columns that do not fit are left out with one line saying so; at 200 columns they
are all there."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from typer.testing import CliRunner

from fedweave.history import CheckpointRef, RoundRecord, SiteResult, open_store
from fedweave.history.cli import history_app

REPO = Path(__file__).resolve().parents[1]
T0 = datetime(2026, 11, 1, 9, 0, tzinfo=timezone.utc)
SITES = ("hospital-north", "hospital-south", "hospital-east")
ROUNDS = 5
PEERS = ("peer-1", "peer-2", "peer-3")
runner = CliRunner()

FED, FAILED, GOSSIP = "a1b2c3d4e5f6", "7c6b5a4f3e2d", "0f9e8d7c6b5a"
RUNS = {  # run id: mode, task, status, rounds
    FED: ("federated", "breast-cancer", "completed", ROUNDS),
    FAILED: ("federated", "digits", "failed", 1),
    GOSSIP: ("gossip", "digit-folders", "completed-alone", 3),
}
FAILED_REASON = "site hospital-south refused the run: 31 columns, expected 30"


def _fed_loss(n: int) -> float:
    return 0.123456789 / n


def _fed_accuracy(n: int) -> float:
    return 0.912345 + n / 997


def _evaluation(n: int) -> dict:
    """A federated round's recorded evaluation, as ``coordinator/rounds/history_listener.py`` writes
    it: central and federated metrics, each site's, and (last round) the cross-site matrix."""
    evaluation = {
        "central": {"loss": _fed_loss(n), "accuracy": _fed_accuracy(n), "auc": 0.98765 - n / 999},
        "federated": {
            "loss": 0.2345678 / n,
            "accuracy": 0.8765432,
            "auc": 0.9912345 - n / 1001,
            "f1": 0.87654,
        },
        "sites": [
            {"site": SITES[0], "status": "ok", "examples": 120,
             "metrics": {"loss": 0.21234, "auc": 0.991234, "node_id": 5}},
            {"site": SITES[1], "status": "failed", "examples": 0, "metrics": {},
             "reason": "out of memory while evaluating the global model"},
            {"site": SITES[2], "status": "ok", "examples": 80,
             "metrics": {"loss": 0.3123, "auc": 0.97654}},
        ],
    }  # fmt: skip
    if n == ROUNDS:
        evaluation["cross_site"] = [
            {"model": model, "site": site, "status": "ok", "metrics": {"auc": 0.9 + i / 100}}
            for i, model in enumerate(("global", *SITES))
            for site in SITES
        ]
    return evaluation


def _gossip_loss(peer: int, n: int) -> float:
    return 0.51234 / n + peer / 1000


def _gossip_accuracy(peer: int, n: int) -> float:
    return 0.70123 + n / 100 + peer / 1000


def _fill(url: str) -> None:
    config = {"settings": {"evaluation": {"select_metric": "auc"}}, "lr": 0.05}
    with open_store(url) as store:
        store.start_run("federated", "breast-cancer", config, 42, run_id=FED)
        for n in range(1, ROUNDS + 1):
            record = RoundRecord(
                n, "coordinator", T0 + timedelta(minutes=n),
                T0 + timedelta(minutes=n, seconds=12.345678), 3, 2, 1,
                {"train_loss": 0.456789 / n, "train_accuracy": 0.812345},
                _fed_loss(n), _fed_accuracy(n), bytes_in=123456789 * n, bytes_out=98765432,
                extra={"evaluation": _evaluation(n)},
            )  # fmt: skip
            sites = [
                SiteResult(
                    SITES[0], num_examples=1200, metrics={"train_loss": 0.4123}, seconds=3.2
                ),
                SiteResult(SITES[1], status="failed", reason="connection reset by peer"),
                SiteResult(SITES[2], num_examples=800, metrics={"train_loss": 0.3876}, seconds=2.9),
            ]
            checkpoint = CheckpointRef(n, f"/nowhere/round-{n}.npz", "0" * 64, 10)
            store.record_round(FED, record, sites, checkpoint)
        store.finish_run(FED, "completed")

        store.start_run("federated", "digits", {"lr": 0.1}, 7, run_id=FAILED)
        store.record_round(
            FAILED, RoundRecord(1, "coordinator", T0, T0, 2, 1, 1, {}, 2.3456, 0.1234), []
        )
        store.finish_run(FAILED, "failed", FAILED_REASON)

        store.start_run("gossip", "digit-folders", {"peers": 3}, None, run_id=GOSSIP)
        for p, peer in enumerate(PEERS, 1):
            for n in range(1, 4):
                record = RoundRecord(
                    n, peer, T0, T0 + timedelta(seconds=1.5), 2, 2, 0, {"loss": 0.3},
                    _gossip_loss(p, n), _gossip_accuracy(p, n), bytes_in=4096, bytes_out=8192,
                    extra={"drops": {"busy": n, "spoofed-id": 1}},
                )  # fmt: skip
                store.record_round(GOSSIP, record, [SiteResult(PEERS[p % 3])])
        store.finish_run(GOSSIP, "completed-alone", "every neighbour left after round 3")


@pytest.fixture(scope="module")
def url(tmp_path_factory: pytest.TempPathFactory) -> str:
    url = f"sqlite:///{tmp_path_factory.mktemp('tables') / 'h.db'}"
    _fill(url)
    return url


def invoke(columns: int, *args: str) -> list[str]:
    """The command's output lines in a ``columns``-wide console."""
    result = runner.invoke(history_app, list(args), env={"COLUMNS": str(columns)})
    assert result.exit_code == 0, result.output
    return result.output.splitlines()


def cells(line: str) -> list[str]:
    """The cells of a table's body line (``│ 1 │ 0.1235 │``), stripped; [] for other lines."""
    if not line.startswith("│"):
        return []
    return [cell.strip() for cell in line.strip().strip("│").split("│")]


def numbers(row: list[str]) -> list[float]:
    found = []
    for cell in row:
        try:
            found.append(float(cell))
        except ValueError:
            pass
    return found


def narrow_lines_fit(lines: list[str], columns: int) -> None:
    # the run's config is printed soft-wrapped on purpose (one line to copy), as before
    too_long = [line for line in lines if len(line) > columns and not line.startswith("config ")]
    assert not too_long, "\n".join(too_long)


def left_out(lines: list[str]) -> str:
    """The note naming the columns left out, wrapped lines joined ('' when none)."""
    text = " ".join(" ".join(lines).split())
    found = re.search(r"left out at \d+ columns: (.*?); a wider terminal", text)
    return found.group(1) if found else ""


def headers(lines: list[str]) -> list[str]:
    """The column headers of the first table, a header on two lines (``eval`` over ``loss``,
    ``central.`` over ``auc``) read as one (``eval loss``, ``central.auc``)."""
    start = next(i for i, line in enumerate(lines) if line.startswith("┏")) + 1
    rows = []
    for line in lines[start:]:
        if not line.startswith("┃"):
            break
        rows.append([cell.strip() for cell in line.strip().strip("┃").split("┃")])
    return [" ".join(filter(None, parts)).replace(". ", ".") for parts in zip(*rows)]


def run_lines(lines: list[str], run_id: str) -> list[str]:
    found = [line for line in lines if run_id in line]
    assert len(found) == 1, "\n".join(lines)
    return cells(found[0])


def test_runs_at_80_columns_shows_mode_task_status_and_rounds_whole(url: str) -> None:
    lines = invoke(80, "runs", "--db", url)
    narrow_lines_fit(lines, 80)
    for run_id, (mode, task, status, rounds) in RUNS.items():
        row = run_lines(lines, run_id)
        assert [mode, task, status, str(rounds)] == row[1:5], row
    dropped = left_out(lines)
    assert "version" in dropped and "started" in dropped, "\n".join(lines)
    assert "--format json shows them" in " ".join(" ".join(lines).split())
    assert "csv" not in " ".join(lines)  # runs has no CSV format to offer


def test_runs_at_200_columns_shows_every_column(url: str) -> None:
    lines = invoke(200, "runs", "--db", url)
    assert max(map(len, lines)) > 80  # the console really is wider
    header = next(line for line in lines if "run id" in line)
    for column in ("mode", "task", "status", "rounds", "started", "ended", "seed", "version",
                   "reason"):  # fmt: skip
        assert column in header
    assert FAILED_REASON in "\n".join(lines) and not left_out(lines)
    assert run_lines(lines, FED)[7] == "42"  # the seed


def test_runs_as_a_real_process_in_an_80_column_terminal(url: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "fedweave.history.cli", "runs", "--db", url],
        cwd=REPO, capture_output=True, text=True, timeout=60, env={**os.environ, "COLUMNS": "80"},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    narrow_lines_fit(lines, 80)
    assert run_lines(lines, GOSSIP)[1:4] == ["gossip", "digit-folders", "completed-alone"]


def _round_rows(lines: list[str], actor: str | None) -> dict[int, list[str]]:
    """Round number → its row in the rounds table (of ``actor`` when the table has one)."""
    found: dict[int, list[str]] = {}
    for line in lines:
        row = cells(line)
        if actor is not None:
            if not row or row[0] != actor:
                continue
            row = row[1:]
        if row and row[0].isdigit():
            assert int(row[0]) not in found, "\n".join(lines)
            found[int(row[0])] = row
    return found


@pytest.mark.parametrize("columns", [80, 200])
def test_show_keeps_each_round_and_its_headline_metrics_on_one_line(url, columns) -> None:
    lines = invoke(columns, "show", FED, "--db", url)
    if columns == 80:
        narrow_lines_fit(lines, 80)
    rows = _round_rows(lines, None)
    assert sorted(rows) == list(range(1, ROUNDS + 1)), "\n".join(lines)
    for n, row in rows.items():
        figures = numbers(row[1:])
        assert _fed_loss(n) in [pytest.approx(v, rel=1e-3) for v in figures], row
        assert _fed_accuracy(n) in [pytest.approx(v, rel=1e-3) for v in figures], row
        auc = 0.9912345 - n / 1001  # the run's --select-metric keeps its column
        assert auc in [pytest.approx(v, rel=1e-3) for v in figures], row
    # chosen on the coordinator's own auc (the run has one), which no site can steer (issue 73)
    assert "best round 1 by central.auc (auto): 0.9866, the recorded figure" in "\n".join(lines)


def test_show_at_80_columns_leaves_out_what_200_columns_shows(url: str) -> None:
    narrow = invoke(80, "show", FED, "--db", url)
    dropped = [name.strip() for name in left_out(narrow).split(",") if name.strip()]
    assert {"bytes in", "bytes out"} <= set(dropped), "\n".join(narrow)
    assert "--format json/csv shows them" in " ".join(" ".join(narrow).split())
    wide = invoke(200, "show", FED, "--db", url)
    assert not left_out(wide)
    shown = headers(wide)
    for name in dropped:
        assert name in shown, (name, shown)
    for name in ("bytes in", "central.accuracy", "federated.f1", "train loss", "checkpoint"):
        assert name in shown
    assert not set(dropped) & set(headers(narrow))


@pytest.mark.parametrize("columns", [80, 200])
def test_show_gossip_keeps_each_peer_round_on_one_line(url, columns) -> None:
    lines = invoke(columns, "show", GOSSIP, "--db", url)
    if columns == 80:
        narrow_lines_fit(lines, 80)
    for p, peer in enumerate(PEERS, 1):
        rows = _round_rows(lines, peer)
        assert sorted(rows) == [1, 2, 3], "\n".join(lines)
        for n, row in rows.items():
            figures = numbers(row[1:])
            assert _gossip_loss(p, n) in [pytest.approx(v, rel=1e-3) for v in figures], row
            assert _gossip_accuracy(p, n) in [pytest.approx(v, rel=1e-3) for v in figures], row
    assert "status completed-alone" in "\n".join(lines)


def test_show_sites_at_80_columns_keeps_sites_statuses_and_the_cross_site_matrix(url) -> None:
    lines = invoke(80, "show", FED, "--db", url, "--sites")
    narrow_lines_fit(lines, 80)
    text = "\n".join(lines)
    assert "site results" in text and "site evaluations" in text
    assert "cross-site evaluation: auc" in text
    # site results (round, site, status, ...; the actor too when it is not always the
    # coordinator) and site evaluations (round, site, status, ...): one line per site a round
    per_site = [row for row in map(cells, lines) if set(row) & set(SITES)]
    per_site = [row for row in per_site if row[0] not in ("global", *SITES)]
    assert len(per_site) == 2 * ROUNDS * len(SITES), text
    for row in per_site:
        site = next(cell for cell in row if cell in SITES)
        assert row[row.index(site) - 1].isdigit() and row[row.index(site) + 1] in ("ok", "failed")
    matrix = [row for row in map(cells, lines) if row and row[0] in ("global", *SITES)]
    assert [row[0] for row in matrix] == ["global", *SITES]
    for i, row in enumerate(matrix):
        assert numbers(row[1:]) == pytest.approx([0.9 + i / 100] * len(SITES)), row


def test_the_best_round_says_how_many_examples_it_rests_on_and_warns_when_too_few() -> None:
    """Issue 34: a best round picked on a handful of evaluation rows (4-15 a clinic) was
    worse on held-out data than the final model, with no word. The count is said, and a
    best round other than the final one chosen on fewer than 100 examples is warned of."""
    from types import SimpleNamespace

    from fedweave.history.model_export import chosen_rounds

    def row(number: int, loss: float, examples: tuple[int, ...]) -> dict:
        sites = [{"site": f"s{i}", "status": "ok", "examples": n, "metrics": {"loss": loss}}
                 for i, n in enumerate(examples)]  # fmt: skip
        sites.append({"site": "late", "status": "late", "examples": 500})  # not counted
        return {"round": number, "checkpoint_path": f"r{number}.npz",
                "extra": {"evaluation": {"federated": {"loss": loss}, "sites": sites}}}  # fmt: skip

    info = SimpleNamespace(config={"settings": {"evaluation": {"select_metric": "loss"}}})
    small = [row(1, 0.9, (4, 8, 12, 15)), row(2, 0.5, (4, 8, 12, 15)), row(3, 0.7, (4, 8, 12, 15))]
    _, best, chosen = chosen_rounds(info, small)
    assert best["round"] == 2 and chosen["examples"] == 39
    assert chosen["warning"].startswith("the best round was chosen on 39 evaluation examples")
    enough = [row(1, 0.9, (60, 60)), row(2, 0.5, (60, 60)), row(3, 0.7, (60, 60))]
    assert chosen_rounds(info, enough)[2]["warning"] is None
    final_is_best = small[:2]  # the same model either way
    assert chosen_rounds(info, final_is_best)[2]["warning"] is None
