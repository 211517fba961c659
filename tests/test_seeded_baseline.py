"""A seeded run gives the same numbers as the recorded baseline, to the last bit.

``fixtures/seeded_digits_dirichlet.json`` holds the per-round accuracy and loss of the
command below as main computed it before the one-package/one-config redesign (commit
655984a), once per CPU it was recorded on: float32 kernels differ between CPUs (AVX2 and
AVX-512, one vendor and another), so the last bits are a property of the machine as well as
of the code. A refactor that changes any of them changed what fedweave computes.
"""

import json
import subprocess
import sys
from pathlib import Path

import pytest

FIXTURE = Path(__file__).parent / "fixtures" / "seeded_digits_dirichlet.json"


def this_cpu() -> str:
    """The fixture's name for this machine's CPU: torch's kernel level and the model name."""
    import torch

    model = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{torch.backends.cpu.get_cpu_capability()} {model}"


@pytest.mark.slow
def test_seeded_run_repeats_the_recorded_baseline_exactly(tmp_path):
    fixture = json.loads(FIXTURE.read_text())
    args = fixture["command"].split()[1:]  # drop the leading "fedweave"
    out = tmp_path / "report.json"
    result = subprocess.run(
        [sys.executable, "-m", "fedweave.cli", *args, "--out", str(out),
         "--db", f"sqlite:///{tmp_path / 'h.db'}", "--checkpoint-dir", str(tmp_path / "ck")],
        capture_output=True, text=True, timeout=600, cwd=tmp_path,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    rounds = json.loads(out.read_text())["rounds"]
    got = [(r["round"], r["accuracy"], r["loss"]) for r in rounds]
    baselines = {
        b["cpu"]: [(r["round"], r["accuracy"], r["loss"]) for r in b["rounds"]]
        for b in fixture["baselines"]
    }
    if got in baselines.values():
        return
    cpu = this_cpu()
    if cpu not in baselines:
        pytest.skip(
            f"no baseline recorded on this CPU ({cpu}) and none of the others' matches; record "
            "one by running the command at commit 655984a here (see the fixture)"
        )
    assert got == baselines[cpu]
