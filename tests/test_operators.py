"""Operators of a standing federation and the audit trail (``fedweave/history/operators.py``,
``fedweave operators``; issue 38), on SQLite and PostgreSQL."""

from __future__ import annotations

import stat

import pytest
from typer.testing import CliRunner

from fedweave.history import HistoryError, open_store
from fedweave.history.operators import TOKEN_PREFIX, OperatorRegistry, token_sha256
from fedweave.operators_cli import operators_app

runner = CliRunner()


def _cli(*args: str):
    return runner.invoke(operators_app, list(args), env={"COLUMNS": "250"})


def test_a_token_names_its_operator_until_it_is_removed(db_url):
    with open_store(db_url) as store:
        operators = OperatorRegistry(store)
        alice = operators.add("alice", added_by="root@host")
        bob = operators.add("bob.smith@lab-2", added_by="root@host")
        assert alice.startswith(TOKEN_PREFIX) and alice != bob
        assert operators.who(alice) == "alice"
        assert operators.who(bob) == "bob.smith@lab-2"
        for stranger in (
            "",
            alice[:-1],
            alice + "x",
            alice[len(TOKEN_PREFIX) :],
            token_sha256(alice),
        ):
            assert operators.who(stranger) is None, stranger

        operators.remove("alice", removed_by="root@host")
        assert operators.who(alice) is None
        assert operators.who(bob) == "bob.smith@lab-2"
        listed = {row.name: row.active for row in operators.operators()}
        assert listed == {"alice": False, "bob.smith@lab-2": True}

        with pytest.raises(HistoryError, match="'alice' was removed"):
            operators.add("alice", added_by="root@host")  # the audit trail still names her
        with pytest.raises(HistoryError, match="'bob.smith@lab-2' exists"):
            operators.add("bob.smith@lab-2", added_by="root@host")
        with pytest.raises(HistoryError, match="no operator 'alice' to remove"):
            operators.remove("alice", removed_by="root@host")
        for bad in ("", "-x", "a b", "x" * 65, "a/b", "a;drop"):
            with pytest.raises(HistoryError, match="cannot name an operator"):
                operators.add(bad, added_by="root@host")
        with pytest.raises(HistoryError, match="names the coordinator's own run"):
            operators.add("coordinator", added_by="root@host")  # a site policy's own name


def test_the_audit_trail_keeps_what_was_done_and_refused_in_order(db_url):
    with open_store(db_url) as store:
        operators = OperatorRegistry(store)
        operators.add("alice", added_by="root@host")
        operators.record("unknown token", "run-submit", "refused", address="10.0.0.9:5111",
                         detail="no operator holds this token")  # fmt: skip
        operators.record("alice", "run-stop", "done", target="run 1234", address="10.0.0.2:1")
        operators.record("x" * 300, "y" * 100, "done", detail="z" * 2000)  # cut, not refused
        with pytest.raises(ValueError, match="outcome"):
            operators.record("alice", "run-stop", "maybe")
        rows = operators.audit()
        assert [(r.actor, r.action, r.outcome) for r in rows[:3]] == [
            ("root@host", "operator-add", "done"),
            ("unknown token", "run-submit", "refused"),
            ("alice", "run-stop", "done"),
        ]
        assert rows[1].address == "10.0.0.9:5111" and rows[2].target == "run 1234"
        assert len(rows[3].actor) == 255 and len(rows[3].detail) == 500
        assert [r.action for r in operators.audit(limit=2)] == ["run-stop", "y" * 64]


def test_the_operators_commands_write_a_private_token_and_say_each_mistake_in_one_line(
    tmp_path, monkeypatch
):
    monkeypatch.chdir(tmp_path)
    db = f"sqlite:///{tmp_path / 'history.db'}"
    added = _cli("add", "alice", "--db", db)
    assert added.exit_code == 0, added.output
    token_file = tmp_path / "alice.token"
    assert stat.S_IMODE(token_file.stat().st_mode) == 0o600
    token = token_file.read_text().strip()
    with open_store(db) as store:
        assert OperatorRegistry(store).who(token) == "alice"
    assert token not in added.output

    again = _cli("add", "alice", "--db", db, "--token-file", str(tmp_path / "other.token"))
    assert again.exit_code == 2 and again.output.startswith("error: operator 'alice' exists")
    taken = _cli("add", "bob", "--db", db, "--token-file", str(token_file))
    assert taken.exit_code == 2 and "alice.token exists" in taken.output
    nowhere = _cli("add", "bob", "--db", db, "--token-file", str(tmp_path / "no" / "b.token"))
    assert nowhere.exit_code == 2 and "no folder" in nowhere.output
    assert "bob" not in _cli("list", "--db", db).output  # nothing recorded for either

    listed = _cli("list", "--db", db)
    assert listed.exit_code == 0 and "alice" in listed.output and "active" in listed.output
    removed = _cli("remove", "alice", "--db", db)
    assert removed.exit_code == 0, removed.output
    assert "removed" in _cli("list", "--db", db).output
    twice = _cli("remove", "alice", "--db", db)
    assert twice.exit_code == 2 and twice.output.count("\n") == 1
    with open_store(db) as store:
        assert OperatorRegistry(store).who(token) is None

    audit = _cli("audit", "--db", db)
    assert audit.exit_code == 0
    lines = audit.output.splitlines()
    assert len(lines) == 2 and "operator-add alice" in lines[0] and "operator-remove" in lines[1]
    missing = _cli("list", "--db", f"sqlite:///{tmp_path / 'none.db'}")
    assert missing.exit_code == 2 and "no history database" in missing.output
