"""Site-local layers (a personal head, FedPer-style; issue 35): a task's ``local_layers`` are
never sent, never averaged, never in the coordinator's checkpoints or the history's bytes;
each site keeps its own in a file of the run, across rounds and restarts, scores with them,
and ``fedweave predict --site NAME`` uses them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from fedweave.errors import UserError

TESTS = Path(__file__).resolve().parent
FEDWEAVE = [sys.executable, "-m", "fedweave.cli"]
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join(
    p for p in (str(TESTS), os.environ.get("PYTHONPATH")) if p)}  # fmt: skip


def _client(layers_dir: Path, data, task=None):
    from declaring_tasks import PERSONAL

    from fedweave.client.site_app import TaskClient
    from fedweave.learning.training import TrainConfig

    task = task or PERSONAL
    return TaskClient(task, data, TrainConfig.for_task(task), site_index=0, evaluation=data,
                      layers_dir=str(layers_dir))  # fmt: skip


def _config(**extra) -> dict:
    from fedweave.contract import LOCAL_LAYERS_KEY, PERSONAL_RUN_KEY

    return {LOCAL_LAYERS_KEY: "4", PERSONAL_RUN_KEY: "r1", "seed": 0, "round": 1, **extra}


def test_a_site_sends_only_shared_tensors_and_keeps_its_head_across_restarts(tmp_path):
    """Two fits by two clients (a deployed site builds one per message: a restart reads the
    same file): the reply holds layers 0 and 2 only; the head trains, is kept in the site's
    file (private), and the second fit starts from it, not from the model's start."""
    from declaring_tasks import PERSONAL
    from safetensors.torch import load_file

    train, _ = PERSONAL.load_data()
    data = train.subset(np.arange(200))
    start = _client(tmp_path, data)
    start._personalize(_config())
    shared = [a for a in (t.numpy() for t in start.model.state_dict().values())]
    assert [a.shape for a in shared] == [(64, 64), (64,), (64, 64), (64,)]
    head_at_start = start.model.personal_state()["4.weight"].clone()

    weights, count, _ = _client(tmp_path, data).fit(shared, _config())
    assert [w.shape for w in weights] == [(64, 64), (64,), (64, 64), (64,)] and count == 200
    kept = tmp_path / "r1.safetensors"
    assert kept.stat().st_mode & 0o077 == 0
    head_after_one = load_file(str(kept))["4.weight"]
    assert not np.allclose(head_after_one.numpy(), head_at_start.numpy())

    restarted = _client(tmp_path, data)
    restarted._personalize(_config(round=2))
    np.testing.assert_array_equal(
        restarted.model.personal_state()["4.weight"].numpy(), head_after_one.numpy()
    )
    weights, _, _ = restarted.fit(weights, _config(round=2))
    assert not np.allclose(load_file(str(kept))["4.weight"].numpy(), head_after_one.numpy())
    loss, examples, metrics = _client(tmp_path, data).evaluate(weights, _config(round=2))
    assert examples == 200 and metrics["accuracy"] > 0.3  # its own head: well above chance

    from fedweave.contract import SiteRefusal

    kept_bytes = kept.read_bytes()
    with pytest.raises(SiteRefusal, match="local layers to NaN or infinity; its previous ones"):
        _client(tmp_path, data).fit(weights, _config(round=3, lr=1e30))
    assert kept.read_bytes() == kept_bytes  # a diverged head is not kept


def test_a_site_refuses_what_does_not_match_with_the_reason(tmp_path):
    from declaring_tasks import PERSONAL

    from fedweave.contract import SiteRefusal
    from fedweave.learning.tasks import load_task

    train, _ = PERSONAL.load_data()
    data = train.subset(np.arange(50))
    with pytest.raises(SiteRefusal, match="keeps layers 4 at the site, but the run shares every"):
        _client(tmp_path, data)._personalize({"seed": 0})
    with pytest.raises(SiteRefusal, match="the run keeps layers 4 at the sites, this site's "
                                          "task 'digits' declares none"):  # fmt: skip
        _client(tmp_path, data, load_task("digits"))._personalize(_config())
    with pytest.raises(SiteRefusal, match="no folder for them; start it with --personal-state"):
        unfiled = _client(tmp_path, data)
        unfiled.layers_dir = None
        unfiled._personalize(_config())
    with pytest.raises(SiteRefusal, match="not a run id"):
        _client(tmp_path, data)._personalize(_config(**{"fw-personal-run": "../../etc"}))
    with pytest.raises(SiteRefusal, match="no local layers of the run yet"):
        _client(tmp_path, data).evaluate([], _config(**{"fw-personal-run": "never"}))
    import torch
    from safetensors.torch import save_file

    save_file({"4.weight": torch.zeros(3, 3)}, str(tmp_path / "odd.safetensors"))
    with pytest.raises(SiteRefusal, match="odd.safetensors do not fit the run's model"):
        _client(tmp_path, data)._personalize(_config(**{"fw-personal-run": "odd"}))


def test_a_declaration_that_does_not_fit_the_model_is_one_line():
    from declaring_tasks import NO_SUCH, WHOLE

    from fedweave.learning.personal import check_local_layers

    with pytest.raises(UserError, match=r"declares local_layers head, which its model does not "
                                        r"have; its modules are 0, 1, 2, 3, 4$"):  # fmt: skip
        check_local_layers(NO_SUCH, NO_SUCH.build_model())
    with pytest.raises(UserError, match="are the whole model; nothing would be shared"):
        check_local_layers(WHOLE, WHOLE.build_model())
    done = subprocess.run([*FEDWEAVE, "simulate", "--task", "declaring_tasks:NO_SUCH", "--rounds",
                           "1", "--clients", "3"], capture_output=True, text=True, timeout=120,
                          env=ENV)  # fmt: skip
    assert done.returncode == 2 and "does not have" in done.stderr, done.stderr[-2000:]
    assert "recorded in the history" not in done.stderr  # refused before the run is recorded
    done = subprocess.run([*FEDWEAVE, "simulate", "--mode", "gossip", "--task",
                           "declaring_tasks:PERSONAL", "--rounds", "1", "--clients", "3"],
                          capture_output=True, text=True, timeout=120, env=ENV)  # fmt: skip
    assert done.returncode == 2 and "gossip peers do not keep site-local" in done.stderr, (
        done.stderr[-2000:]
    )


@pytest.mark.slow
def test_a_simulation_keeps_each_head_at_its_site_and_predict_uses_it(tmp_path):
    """3 sites, SecAgg+ (the default), LoRA on layers 0 and 2 with the head local: the
    checkpoints and the history's bytes hold the adapters alone; each site's head is its own
    file; ``predict --site`` scores with the global adapters and that site's head, as the
    model built by hand from the checkpoint and the file does."""
    import torch
    from declaring_tasks import PERSONAL
    from safetensors.torch import load_file
    from test_initial_model import _pretrained

    from fedweave.history import open_store
    from fedweave.learning.weights import load_weights_npz

    base = _pretrained(tmp_path / "base.safetensors", epochs=8)
    db = f"sqlite:///{tmp_path / 'h.db'}"
    done = subprocess.run(
        [*FEDWEAVE, "simulate", "--task", "declaring_tasks:PERSONAL", "--clients", "3", "--rounds",
         "2", "--seed", "0", "--lr", "0.05", "--initial-model", str(base), "--peft", "lora",
         "--lora-rank", "4", "--partition", "dirichlet", "--alpha", "0.5", "--db", db,
         "--checkpoint-dir", str(tmp_path / "ck"), "--split-dir", str(tmp_path / "split")],
        capture_output=True, text=True, timeout=400, env=ENV, cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert "layers 4 stay at each site" in done.stderr
    with open_store(db) as store:
        run = store.list_runs()[0]
        rows = store.rounds(run.run_id)
    assert run.config["local_layers"] == ["4"]
    assert rows[-1]["replied"] == 3 and rows[-1]["eval_accuracy"] > 0.7  # the sites' own scores
    adapters = load_weights_npz(rows[-1]["checkpoint_path"])
    assert [a.shape for a in adapters] == [(4, 64), (64, 4), (4, 64), (64, 4)]  # no head
    values = sum(a.size for a in adapters)  # 1,024 of the model's 8,970
    assert rows[-1]["bytes_in"] < 3 * 4 * values * 1.5 + 20_000, rows[-1]["bytes_in"]
    folder = Path(rows[-1]["checkpoint_path"]).parent / "site-layers"
    heads = {p.parent.name: load_file(str(p)) for p in folder.glob(f"*/{run.run_id}.safetensors")}
    assert sorted(heads) == ["site-0", "site-1", "site-2"]
    assert not torch.equal(heads["site-0"]["base_model.model.4.weight"],
                           heads["site-1"]["base_model.model.4.weight"])  # fmt: skip

    test = tmp_path / "split" / "test.npz"
    out = tmp_path / "p.csv"
    done = subprocess.run([*FEDWEAVE, "predict", "--run", run.run_id, "--data", str(test),
                           "--db", db, "--out", str(out), "--site", "site-1"],
                          capture_output=True, text=True, timeout=200, env=ENV)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    predicted = np.loadtxt(out, delimiter=",", skiprows=1)[:, 1].astype(int)

    from peft import LoraConfig, get_peft_model, set_peft_model_state_dict

    model = PERSONAL.build_model()
    model.load_state_dict(load_file(str(base)))
    model = get_peft_model(model, LoraConfig(r=4, lora_alpha=4, target_modules=["0", "2"],
                                             modules_to_save=["4"]))  # fmt: skip
    names = ["base_model.model.0.lora_A.weight", "base_model.model.0.lora_B.weight",
             "base_model.model.2.lora_A.weight", "base_model.model.2.lora_B.weight"]  # fmt: skip
    state = {n: torch.from_numpy(a) for n, a in zip(names, adapters)} | heads["site-1"]
    set_peft_model_state_dict(model, state)
    x = np.load(test)["x"]
    with torch.no_grad():
        by_hand = model(torch.from_numpy(x)).argmax(1).numpy()
    np.testing.assert_array_equal(predicted, by_hand)

    done = subprocess.run([*FEDWEAVE, "history", "export", run.run_id, "--db", db, "--to",
                           str(tmp_path / "out")], capture_output=True, text=True, timeout=200,
                          env=ENV)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    meta = json.loads((tmp_path / "out" / "model.json").read_text())
    assert meta["local_layers"]["layers"] == ["4"] and "their start" in meta["local_layers"]["note"]
    exported = PERSONAL.build_model()  # the task's own model: the adapters merged, the head's start
    exported.load_state_dict(load_file(str(tmp_path / "out" / "model.safetensors")))
    np.testing.assert_array_equal(exported.state_dict()["4.weight"].numpy(),
                                  load_file(str(base))["4.weight"].numpy())  # fmt: skip

    for args, says in ((["--site", "site-7"], "its sites' are site-0, site-1, site-2"),
                       ([], "name whose to score with, --site NAME")):  # fmt: skip
        done = subprocess.run([*FEDWEAVE, "predict", "--run", run.run_id, "--data", str(test),
                               "--db", db, "--out", str(out), *args],
                              capture_output=True, text=True, timeout=200, env=ENV)  # fmt: skip
        assert done.returncode == 2 and says in done.stderr, done.stderr[-2000:]
