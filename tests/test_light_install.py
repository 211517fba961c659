"""The light install (issue 22): `pip install fedweave` is what a site, a coordinator and a
gossip peer run with; Ray, flwr-datasets, Hugging Face datasets and pyarrow come only with
`fedweave[simulation]` (pyarrow alone with `fedweave[parquet]`).

Each check runs `fedweave` in a subprocess where those modules cannot be imported (a meta-path
finder refuses them, as if they were not installed): the site's, coordinator's and peer's
commands and modules work; `fedweave simulate` and the skewed `data split` say which extra to
install in one line and exit 2.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import tomllib

SIMULATION_ONLY = ("ray", "flwr_datasets", "datasets", "pyarrow")

# Runs `fedweave ARGS...` (or `-c CODE`) with SIMULATION_ONLY unimportable; on exit, fails if
# any of them was imported after all.
BOOT = f"""
import sys
BLOCKED = {SIMULATION_ONLY!r}

class NotInstalled:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ModuleNotFoundError(f"No module named {{name!r}} (blocked)", name=name)
        return None

for name in list(sys.modules):
    if name.split(".")[0] in BLOCKED:
        del sys.modules[name]
sys.meta_path.insert(0, NotInstalled())
if sys.argv[1] == "-c":
    exec(sys.argv[2])
    raise SystemExit(0)
from fedweave.cli import main
main(sys.argv[1:])
"""

ENV = {**os.environ, "FLWR_TELEMETRY_ENABLED": "0", "FLWR_DISABLE_UPDATE_CHECK": "1"}


def light(*args: str, cwd=None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", BOOT, *args], capture_output=True, text=True, timeout=120,
        cwd=cwd, env=ENV,
    )  # fmt: skip


def one_line_refusal(done: subprocess.CompletedProcess) -> str:
    assert done.returncode == 2, (done.stdout, done.stderr)
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    assert "pip install 'fedweave[simulation]'" in lines[0], lines[0]
    return lines[0]


def test_simulate_without_the_extra_names_it_in_one_line(tmp_path):
    line = one_line_refusal(
        light("simulate", "--task", "digits", "--clients", "3", "--rounds", "1",
              "--out", str(tmp_path / "report.json"))  # fmt: skip
    )
    assert line.startswith("error: fedweave simulate needs the simulation extra"), line
    assert not (tmp_path / "report.json").exists()


def test_data_split_iid_works_without_the_extra_and_dirichlet_names_it(tmp_path):
    done = light("data", "split", "--task", "digits", "--clients", "3", "--partition", "iid",
                 "--seed", "0", "--out", str(tmp_path / "iid"))  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert sorted(p.name for p in (tmp_path / "iid").iterdir()) == [
        "site-0.npz", "site-1.npz", "site-2.npz", "test.npz"]  # fmt: skip
    line = one_line_refusal(
        light("data", "split", "--task", "digits", "--clients", "3", "--partition",
              "dirichlet", "--out", str(tmp_path / "skewed"))  # fmt: skip
    )
    assert "--partition dirichlet needs the simulation extra" in line


@pytest.mark.parametrize("command", [
    ("client", "--help"), ("coordinator", "--help"), ("evaluate", "--help"),
    ("peer", "--help"), ("history", "--help"), ("predict", "--help"), ("certs", "--help"),
    ("sites", "--help"),
])  # fmt: skip
def test_site_coordinator_and_peer_commands_need_no_extra(command):
    done = light(*command)
    assert done.returncode == 0, done.stderr
    assert "Usage: " in done.stdout


def test_certs_sites_and_history_run_without_the_extra(tmp_path):
    db = f"sqlite:///{tmp_path / 'history.db'}"
    for args in (
        ("certs", "init", "--out", "pki", "--host", "127.0.0.1"),
        ("sites", "new-key", "--out", "site.key"),
        ("history", "migrate", "--db", db),
        ("history", "runs", "--db", db, "--format", "json"),
    ):
        done = light(*args, cwd=tmp_path)
        assert done.returncode == 0, (args, done.stderr)
    assert done.stdout.strip() == "[]"


def test_the_site_and_coordinator_stacks_import_without_the_extra(tmp_path):
    """Module level: the ClientApp, the ServerApp, the SuperLink plumbing and the peer import
    Flower (without its simulation extra) and torch, never Ray or flwr-datasets; a Parquet
    file without pyarrow is one line naming the parquet extra."""
    code = (
        "import fedweave.client.site_app, fedweave.client.deployed_app\n"
        "import fedweave.coordinator.rounds.round_app, fedweave.coordinator.command.supervisor\n"
        "import fedweave.coordinator.serverapp.deployed_server_app, fedweave.gossip.peer\n"
        "from pathlib import Path\n"
        "from fedweave.errors import UserError\n"
        "from fedweave.learning.tables import read_frame\n"
        "try:\n"
        f"    read_frame(Path({str(tmp_path / 'site.parquet')!r}))\n"
        "except UserError as exc:\n"
        "    print(exc)\n"
        "assert not [m for m in sys.modules if m.split('.')[0] in BLOCKED]\n"
    )
    done = light("-c", code)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().endswith(
        "reading Parquet needs the parquet extra (pyarrow not installed): "
        "pip install 'fedweave[parquet]'"
    ), done.stdout


def test_iid_split_is_what_flwr_datasets_iid_partitioner_cuts():
    """The iid split needs no extra, and cuts exactly what IidPartitioner cut before."""
    datasets = pytest.importorskip("datasets")
    partitioner = pytest.importorskip("flwr_datasets.partitioner")
    from fedweave.simulations.partition import partition_indices

    datasets.disable_progress_bars()
    for size, sites in ((1797, 10), (103, 7), (10, 10), (5, 1)):
        labels = np.arange(size) % 3
        iid = partitioner.IidPartitioner(num_partitions=sites)
        iid.dataset = datasets.Dataset.from_dict(
            {"label": labels.tolist(), "index": list(range(size))})  # fmt: skip
        order = np.random.default_rng(4).permutation(size)
        before = [order[np.asarray(iid.load_partition(i)["index"])] for i in range(sites)]
        now = partition_indices(labels, sites, "iid", seed=4)
        assert [p.tolist() for p in now] == [p.tolist() for p in before]


def test_the_base_requirements_carry_no_simulation_stack():
    """pyproject's base dependencies: Flower without [simulation], no flwr-datasets, datasets,
    pyarrow or ray; the simulation extra has them and dev includes it."""
    project = tomllib.loads(
        (Path(__file__).resolve().parents[1] / "pyproject.toml").read_text())["project"]
    base = [r.replace(" ", "").lower() for r in project["dependencies"]]
    assert "flwr==1.42.0" in base
    for heavy in ("ray", "flwr-datasets", "datasets", "pyarrow", "flwr[simulation]"):
        assert not [r for r in base if r.startswith(heavy)], (heavy, base)
    extras = project["optional-dependencies"]
    assert extras["simulation"] == ["flwr[simulation]==1.42.0", "flwr-datasets>=0.6.1,<0.7"]
    assert "simulation" in next(r for r in extras["dev"] if r.startswith("fedweave["))
