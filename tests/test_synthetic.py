"""The FedProx paper's Synthetic(alpha, beta) task: generated per site, seeded, heterogeneous."""

import numpy as np
import pytest
from test_simulation_federated import run_cli

from fedweave.errors import UserError
from fedweave.learning.tasks import load_task
from fedweave.learning.tasks.synthetic import NAMED_VARIANTS, SyntheticTask


def test_named_variants_and_parameters_load():
    for name in NAMED_VARIANTS:
        task = load_task(name)
        assert task.name == name and task.input_shape == (60,) and task.num_classes == 10
    custom = load_task("synthetic-2-0.25")
    assert (custom.alpha, custom.beta, custom.iid) == (2.0, 0.25, False)


@pytest.mark.parametrize("name", ["synthetic-1", "synthetic-a-1", "synthetic--1-1", "synthetic-"])
def test_unknown_parameters_are_refused(name):
    with pytest.raises(UserError, match="unknown synthetic task"):
        load_task(name)


def test_a_site_is_the_same_for_a_seed_whatever_the_number_of_sites():
    task = SyntheticTask(1, 1)
    train, test = task.site_data(7, seed=3)
    again, _ = task.site_data(7, seed=3)
    np.testing.assert_array_equal(train.x, again.x)
    other, _ = task.site_data(7, seed=4)
    assert len(other) != len(train) or not np.array_equal(other.x, train.x)
    total = len(train) + len(test)
    assert total >= 50 and abs(len(test) - 0.1 * total) <= 1


def test_sizes_follow_a_power_law_and_labels_the_local_models():
    task = SyntheticTask(1, 1)
    sizes = np.array([len(task.site_data(k)[0]) for k in range(300)])
    assert sizes.min() >= 45  # 50 + lognormal, 90% kept for training
    assert sizes.max() > 20 * np.median(sizes)  # a few sites hold most of the data
    x, y = task.site_data(0)[0].x, task.site_data(0)[0].y
    assert x.shape[1] == 60 and set(np.unique(y)) <= set(range(10))


def _label_spread(task: SyntheticTask) -> float:
    """Mean total-variation distance between each site's labels and the pooled labels."""
    labels = [task.site_data(k)[0].y for k in range(40)]
    pooled = np.bincount(np.concatenate(labels), minlength=10) / sum(len(y) for y in labels)
    return float(np.mean([0.5 * np.abs(np.bincount(y, minlength=10) / len(y) - pooled).sum()
                          for y in labels]))  # fmt: skip


def test_alpha_and_beta_make_sites_differ_and_iid_does_not():
    spread_iid = _label_spread(load_task("synthetic-iid"))
    spread_11 = _label_spread(load_task("synthetic-1-1"))
    assert spread_iid < 0.2 < 0.5 < spread_11, (spread_iid, spread_11)  # iid: sampling noise


def test_data_split_writes_the_generated_sites(tmp_path):
    done = run_cli(
        "data", "split", "--task", "synthetic-1-1", "--clients", "12", "--seed", "5",
        "--out", str(tmp_path / "split"), timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    task = SyntheticTask(1, 1)
    for k in (0, 11):
        saved = np.load(tmp_path / "split" / f"site-{k}.npz")
        np.testing.assert_array_equal(saved["x"], task.site_data(k, seed=5)[0].x)
    test = np.load(tmp_path / "split" / "test.npz")
    assert len(test["y"]) == sum(len(task.site_data(k, seed=5)[1]) for k in range(12))


@pytest.mark.parametrize(
    "args, message",
    [
        (["--task", "synthetic-x-1"], "unknown synthetic task 'synthetic-x-1'"),
        (["--task", "synthetic-1-1", "--partition", "dirichlet"], "generates each site's own"),
        (["--task", "synthetic-1-1", "--stragglers", "1"], "--stragglers must be < 1"),
        (["--task", "synthetic-1-1", "--stragglers", "-0.1"], "--stragglers must be at least 0"),
    ],
)
def test_bad_input_is_one_line_exit_2_and_no_run(tmp_path, args, message):
    db = f"sqlite:///{tmp_path / 'h.db'}"
    result = run_cli("simulate", *args, "--db", db, "--out", str(tmp_path / "r.json"),
                     cwd=tmp_path, timeout=120)  # fmt: skip
    assert result.returncode == 2, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and message in lines[0], result.stderr
    if (tmp_path / "h.db").exists():
        from fedweave.history import open_store

        store = open_store(db)
        assert store.list_runs() == []
        store.close()
