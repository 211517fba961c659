"""``fedweave history`` commands through Typer's runner and as a real subprocess."""

from __future__ import annotations

import csv
import hashlib
import io
import json
import subprocess
import sys
from datetime import datetime, timedelta, timezone
from pathlib import Path

import click
import numpy as np
import pytest
import typer.main
from typer.testing import CliRunner

from fedweave.history import CheckpointRef, RoundRecord, SiteResult, open_store
from fedweave.history.cli import history_app
from fedweave.history.models import SCHEMA_REVISION
from fedweave.history.plotting import mean_per_round

REPO = Path(__file__).resolve().parents[1]
T0 = datetime(2026, 11, 1, 9, 0, tzinfo=timezone.utc)
runner = CliRunner()


def invoke(*args: str):
    return runner.invoke(history_app, list(args), env={"COLUMNS": "250"})


def _fill(url: str, ckpt_dir: Path) -> tuple[str, str]:
    """A finished federated run with real checkpoint files and a 2-peer gossip run."""
    with open_store(url) as store:
        fed = store.start_run("federated", "digits", {"lr": 0.1}, 42, run_id="fed0000001")
        for n in (1, 2, 3):
            arrays = [np.full((3, 2), n, dtype=np.float32), np.arange(4.0)]
            path = ckpt_dir / f"round-{n}.npz"
            np.savez(path, *arrays)
            data = path.read_bytes()
            record = RoundRecord(
                n,
                "coordinator",
                T0 + timedelta(minutes=n),
                T0 + timedelta(minutes=n, seconds=20),
                2,
                2,
                0,
                {"train_loss": 1.0 / n},
                1.0 / n,
                0.5 + n / 10,
            )
            store.record_round(
                fed,
                record,
                [
                    SiteResult("s1", num_examples=10, metrics={"train_loss": 0.9 / n}),
                    SiteResult("s2", num_examples=20),
                ],
                CheckpointRef(n, str(path), hashlib.sha256(data).hexdigest(), len(data)),
            )
        store.finish_run(fed, "completed")
        gossip = store.start_run("gossip", "digits", {"peers": 2}, 42, run_id="gos0000001")
        for peer, acc in (("p1", 0.6), ("p2", 0.8)):
            for n in (1, 2, 3):
                record = RoundRecord(
                    n,
                    peer,
                    T0,
                    T0,
                    1,
                    1,
                    0,
                    {},
                    0.5,
                    acc + n / 100,
                    extra={"drops": {"busy": n, "schema": 0}},
                )
                store.record_round(gossip, record, [SiteResult("p2" if peer == "p1" else "p1")])
    return fed, gossip


@pytest.fixture
def filled(tmp_path: Path) -> tuple[str, str, str]:
    url = f"sqlite:///{tmp_path / 'h.db'}"
    (tmp_path / "ckpt").mkdir()
    return (url, *_fill(url, tmp_path / "ckpt"))


def test_show_prints_gossip_drop_counters_per_round(filled) -> None:
    url, fed, gossip = filled
    shown = invoke("show", gossip, "--db", url)
    assert shown.exit_code == 0, shown.output
    assert "drops so far" in shown.output and "busy 3" in shown.output
    assert "schema" not in shown.output  # reasons with no drop stay out of the way
    assert "drops so far" not in invoke("show", fed, "--db", url).output


def test_runs_lists_every_run_as_table_and_json(filled) -> None:
    url, fed, gossip = filled
    table = invoke("runs", "--db", url)
    assert table.exit_code == 0, table.output
    assert fed in table.output and gossip in table.output and "completed" in table.output
    listed = json.loads(invoke("runs", "--db", url, "--format", "json").output)
    assert [(r["run_id"], r["status"], r["rounds_completed"]) for r in listed] == [
        (gossip, "running", 3),
        (fed, "completed", 3),
    ]


def test_runs_works_on_both_backends(db_url: str, tmp_path: Path) -> None:
    fed, _ = _fill(db_url, tmp_path)
    result = invoke("runs", "--db", db_url, "--format", "json")
    assert result.exit_code == 0, result.output
    assert fed in {r["run_id"] for r in json.loads(result.output)}


def test_show_as_table_json_and_csv(filled) -> None:
    url, fed, gossip = filled
    table = invoke("show", fed, "--db", url, "--sites")
    assert table.exit_code == 0, table.output
    assert "status completed" in table.output and "site results" in table.output
    payload = json.loads(
        invoke("show", "latest", "--db", url, "--format", "json", "--sites").output
    )
    assert payload["run"]["run_id"] == gossip and len(payload["rounds"]) == 6
    assert {s["site_id"] for s in payload["sites"]} == {"p1", "p2"}
    rows = list(
        csv.DictReader(io.StringIO(invoke("show", fed, "--db", url, "--format", "csv").output))
    )
    assert [row["round"] for row in rows] == ["1", "2", "3"]
    assert float(rows[1]["train.loss"]) == pytest.approx(0.5)
    assert rows[2]["checkpoint_path"].endswith("round-3.npz")
    sites = list(
        csv.DictReader(
            io.StringIO(invoke("show", fed[:6], "--db", url, "--format", "csv", "--sites").output)
        )
    )
    assert len(sites) == 6 and sites[0]["metrics.train_loss"] == "0.9"


def test_user_errors_are_one_line_with_exit_code_2(filled, tmp_path: Path) -> None:
    url, _, _ = filled
    for args, expected in (
        (("show", "nosuchrun", "--db", url), "error: run 'nosuchrun' is not in"),
        (("runs", "--db", f"sqlite:///{tmp_path / 'absent.db'}"), "error: no history database"),
        (("runs", "--db", "postgresql://u:topsecret@127.0.0.1:1/x"), "error: cannot open"),
    ):
        result = invoke(*args)
        assert result.exit_code == 2, result.output
        assert result.output.startswith(expected) and result.output.count("\n") == 1
        assert "Traceback" not in result.output and "topsecret" not in result.output
    assert not (tmp_path / "absent.db").exists()  # reading never creates a database


def test_plot_writes_a_png_with_several_runs(filled, tmp_path: Path) -> None:
    url, fed, gossip = filled
    out = tmp_path / "plots" / "curve.png"
    result = invoke("plot", fed, gossip, "--db", url, "--out", str(out))
    assert result.exit_code == 0, result.output
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out.stat().st_size > 10_000


def test_gossip_curves_are_the_mean_over_peers() -> None:
    rows = [
        {"round": 1, "eval_accuracy": 0.6},
        {"round": 1, "eval_accuracy": 0.8},
        {"round": 2, "eval_accuracy": 0.7},
        {"round": 2, "eval_accuracy": None},
    ]
    curve = mean_per_round(rows, "eval_accuracy")
    assert curve.rounds == [1, 2]
    assert curve.mean == pytest.approx([0.7, 0.7])
    assert (curve.low, curve.high) == ([0.6, 0.7], [0.8, 0.7])


def test_export_writes_tables_and_the_verified_final_model(filled, tmp_path: Path) -> None:
    url, fed, _ = filled
    out = tmp_path / "export"
    result = invoke("export", fed, "--db", url, "--to", str(out))
    assert result.exit_code == 0, result.output
    assert sorted(p.name for p in out.iterdir()) == [
        "model.npz",
        "rounds.csv",
        "run.json",
        "sites.csv",
    ]
    with np.load(out / "model.npz") as model:
        assert model["arr_0"].tolist() == [[3.0, 3.0]] * 3
    meta = json.loads((out / "run.json").read_text())
    assert meta["run_id"] == fed and meta["final_checkpoint"]["round"] == 3
    assert len((out / "rounds.csv").read_text().splitlines()) == 4
    assert len((out / "sites.csv").read_text().splitlines()) == 7
    # weights and history are their owner's only, whatever the umask; a file that exists
    # keeps the mode its owner gave it
    assert {p.name: p.stat().st_mode & 0o777 for p in out.iterdir()} == dict.fromkeys(
        ["model.npz", "rounds.csv", "run.json", "sites.csv"], 0o600
    )
    assert (tmp_path / "h.db").stat().st_mode & 0o777 == 0o600
    (out / "model.npz").chmod(0o640)
    assert invoke("export", fed, "--db", url, "--to", str(out)).exit_code == 0
    assert (out / "model.npz").stat().st_mode & 0o777 == 0o640


def test_export_refuses_an_altered_checkpoint_but_keeps_the_tables(filled, tmp_path) -> None:
    url, fed, _ = filled
    (tmp_path / "ckpt" / "round-3.npz").write_bytes(b"not the model")
    out = tmp_path / "export"
    result = invoke("export", fed, "--db", url, "--to", str(out))
    assert result.exit_code == 2 and "does not match the sha256" in result.output
    assert sorted(p.name for p in out.iterdir()) == ["rounds.csv", "run.json", "sites.csv"]


def test_migrate_creates_then_reports_current(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'new.db'}"
    first = invoke("migrate", "--db", url)
    head = SCHEMA_REVISION
    assert first.exit_code == 0 and f"migrated from empty to {head}" in first.output
    assert f"already at {head}" in invoke("migrate", "--db", url).output


def test_every_command_and_option_explains_itself() -> None:
    group = typer.main.get_command(history_app)
    assert isinstance(group, click.Group)
    assert set(group.commands) == {"runs", "show", "plot", "export", "migrate"}
    for name, command in group.commands.items():
        assert command.help and len(command.help) > 30, name
        for param in command.params:
            if isinstance(param, click.Option) and param.name != "help":
                assert param.help and len(param.help) > 20, (name, param.name)
        shown = invoke(name, "--help")
        assert shown.exit_code == 0 and "default: sqlite:///fedweave.db" in shown.output


def _python(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, *args], cwd=REPO, capture_output=True, text=True, timeout=60
    )


def test_cli_module_imports_no_database_or_plotting_stack() -> None:
    probe = (
        "import sys, fedweave.history.cli; "
        "print(sorted(m for m in ('sqlalchemy', 'alembic', 'matplotlib', 'numpy') "
        "if m in sys.modules))"
    )
    assert _python("-c", probe).stdout.strip() == "[]"


def test_as_a_real_process_errors_are_one_line_on_stderr(tmp_path: Path) -> None:
    done = _python(
        "-m", "fedweave.history.cli", "show", "latest", "--db", f"sqlite:///{tmp_path / 'nope.db'}"
    )
    assert done.returncode == 2
    assert done.stderr.startswith("error: no history database") and done.stderr.count("\n") == 1
