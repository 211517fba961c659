"""A seeded run gives the same numbers as the recorded baseline, to the last bit.

``fixtures/seeded_digits_dirichlet.json`` holds the per-round accuracy and loss of the
command below as main computed it before the one-package/one-config redesign (commit
655984a). A refactor that changes any of them changed what fedweave computes.
"""

import json
import subprocess
import sys
from pathlib import Path

import pytest

FIXTURE = Path(__file__).parent / "fixtures" / "seeded_digits_dirichlet.json"


@pytest.mark.slow
def test_seeded_run_repeats_the_recorded_baseline_exactly(tmp_path):
    baseline = json.loads(FIXTURE.read_text())
    args = baseline["command"].split()[1:]  # drop the leading "fedweave"
    out = tmp_path / "report.json"
    result = subprocess.run(
        [sys.executable, "-m", "fedweave.cli", *args, "--out", str(out),
         "--db", f"sqlite:///{tmp_path / 'h.db'}", "--checkpoint-dir", str(tmp_path / "ck")],
        capture_output=True, text=True, timeout=600, cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    rounds = json.loads(out.read_text())["rounds"]
    got = [(r["round"], r["accuracy"], r["loss"]) for r in rounds]
    want = [(r["round"], r["accuracy"], r["loss"]) for r in baseline["rounds"]]
    assert got == want
