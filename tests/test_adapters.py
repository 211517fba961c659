"""Adapters only (``--peft lora``, issue 35): LoRA adapters from ``peft`` on a frozen pretrained
base. Only the adapters and the output layer train, travel (Flower's messages, SecAgg+'s
vectors, gossip frames), are checkpointed and counted in the history's bytes; the export is
the merged model and the adapter in peft's own format, which peft loads on the base."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest
from test_initial_model import FEDWEAVE, _pretrained

from fedweave.errors import UserError
from fedweave.learning.adapters import AdapterSpec, adapted_task, adapter_spec
from fedweave.learning.tasks import load_task


def test_default_targets_are_every_layer_but_the_output_and_each_misfit_is_one_line():
    model = load_task("digits").build_model()  # Linear 0, 2 and the output 4, 64 wide
    spec = adapter_spec(model, 4, None, None, "digits")
    assert spec == AdapterSpec(4, 4.0, ("0", "2"), ("4",))
    assert AdapterSpec.decode(spec.encode()) == spec
    assert adapter_spec(model, 4, 2.0, "0,4", "digits").full == ()  # the output adapted too
    with pytest.raises(UserError, match=r"^--lora-targets 1,9: 1, 9 is not a linear .* its "
                                        r"layers are 0, 2, 4$"):  # fmt: skip
        adapter_spec(model, 4, None, "1,9", "digits")
    with pytest.raises(UserError, match=r"--lora-rank 10 is not below the smaller dimension "
                                        r"of 4 \(10\)"):  # fmt: skip
        adapter_spec(model, 10, None, "4", "digits")
    for bad in ("lora r=4", "full r=4 alpha=8 targets=0 full=", "lora r=0 alpha=8 targets=0 full=",
                "lora r=4 alpha=8 targets=;rm full="):  # fmt: skip
        with pytest.raises(ValueError):
            AdapterSpec.decode(bad)


def test_a_task_declares_its_own_lora_and_the_flags_override_it():
    """A task's ``peft_config`` (peft's ``LoraConfig``) gives the run's rank, alpha, targets and
    fully trained modules; a flag given wins over it; one asking for what fedweave does not
    train (dropout) is one line."""
    from declaring_tasks import DECLARED
    from peft import LoraConfig

    from fedweave.learning.adapters import declared_lora

    declared = declared_lora(DECLARED, "declared")
    model = DECLARED.build_model()
    assert adapter_spec(model, None, None, None, "declared", declared) == AdapterSpec(
        2, 4.0, ("2",), ("4",)
    )
    assert adapter_spec(model, 3, 1.0, "0", "declared", declared) == AdapterSpec(
        3, 1.0, ("0",), ("4",)
    )
    assert adapter_spec(model, None, None, None, "digits").rank == 8  # nothing declared
    DECLARED.peft_config = lambda: LoraConfig(r=2, target_modules=["2"], lora_dropout=0.1)
    try:
        with pytest.raises(UserError, match=r"lora_dropout 0.1, bias 'none', use_dora False: "
                                            r"fedweave trains LoRA without dropout"):  # fmt: skip
            declared_lora(DECLARED, "declared")
    finally:
        del DECLARED.peft_config


def test_the_adapted_model_state_is_its_trainable_tensors_on_the_pinned_base(tmp_path):
    """``state_dict`` is the adapters and the output layer (what every path moves); the base
    is the file's, frozen; another file than the run's is refused naming both hashes."""
    import torch

    base = _pretrained(tmp_path / "base.safetensors", epochs=2)
    task = load_task("digits")
    line = adapter_spec(task.build_model(), 4, None, None, "digits").encode()
    adapted = adapted_task(task, line, base, "digits")
    model = adapted.build_model()
    state = model.state_dict()
    assert list(state) == [
        "base_model.model.0.lora_A.weight", "base_model.model.0.lora_B.weight",
        "base_model.model.2.lora_A.weight", "base_model.model.2.lora_B.weight",
        "base_model.model.4.weight", "base_model.model.4.bias",
    ]  # fmt: skip
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert len(trainable) == len(state)
    x = torch.rand(5, 64)
    plain = task.build_model()
    from safetensors.torch import load_file

    plain.load_state_dict(load_file(str(base)))
    torch.testing.assert_close(model(x), plain(x))  # lora_B starts at zero: the base's outputs
    with pytest.raises(RuntimeError, match="adapter tensors differ"):
        model.load_state_dict({k: v for k, v in state.items() if k != "base_model.model.4.bias"})
    other = _pretrained(tmp_path / "other.safetensors", epochs=1)
    with pytest.raises(UserError, match=r"^--base-model .* has sha256 .*, the run started from"):
        adapted_task(task, line, other, "digits", adapted.base_sha256)


def _rows(db: str) -> tuple[list[dict], object]:
    from fedweave.history import open_store

    with open_store(db) as store:
        run = store.list_runs()[0]
        return store.rounds(run.run_id), store.get_run(run.run_id)


@pytest.mark.slow
def test_a_lora_simulation_sends_only_adapters_and_peft_loads_the_export(tmp_path):
    """Simulated under SecAgg+: the history's bytes a round are a fraction of full
    fine-tuning's; the exported adapter, loaded by ``peft.PeftModel.from_pretrained`` on the
    base in plain Python, scores the test accuracy the history recorded, and so does the
    merged ``model.safetensors`` in the task's own model."""
    import torch
    from peft import PeftModel
    from safetensors.torch import load_file

    from fedweave.learning.data import load_site_data
    from fedweave.learning.training import TrainConfig

    base = _pretrained(tmp_path / "base.safetensors", epochs=8)
    common = ["simulate", "--task", "digits", "--clients", "3", "--rounds", "2", "--seed", "0",
              "--initial-model", str(base), "--split-dir", str(tmp_path / "split")]  # fmt: skip
    db = f"sqlite:///{tmp_path / 'lora'}.db"
    done = subprocess.run([*FEDWEAVE, *common, "--peft", "lora", "--lora-rank", "4", "--lr",
                           "0.05", "--db", db], capture_output=True, text=True,
                          timeout=400)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    rows, run = _rows(db)
    assert run.config["adapter"] == "lora r=4 alpha=4 targets=0,2 full=4"
    assert run.config["settings"]["training"]["peft"] == "lora"
    # 1,674 trainable values of 8,970: SecAgg+'s vectors and the replies carry only those (a
    # full fine-tuning's replies are 3 x 8,970 float32s and their framing, at least 107 kB)
    full_model = load_task("digits").build_model()
    full_bytes = 3 * 4 * sum(t.numel() for t in full_model.state_dict().values())
    assert rows[-1]["bytes_in"] < 0.3 * full_bytes, (rows[-1]["bytes_in"], full_bytes)
    assert rows[-1]["eval_accuracy"] > 0.7
    out = tmp_path / "out"
    done = subprocess.run([*FEDWEAVE, "history", "export", run.run_id, "--db", db, "--to",
                           str(out)], capture_output=True, text=True, timeout=200)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert json.loads((out / "adapter_config.json").read_text())["r"] == 4
    task = load_task("digits")
    test = load_site_data(tmp_path / "split" / "test.npz", task)
    on_base = task.build_model()
    on_base.load_state_dict(load_file(str(base)))
    peft_model = PeftModel.from_pretrained(on_base, str(out))
    merged = task.build_model()
    merged.load_state_dict(load_file(str(out / "model.safetensors")))
    for model in (peft_model, merged):
        accuracy = task.evaluate(model, test, TrainConfig(device="cpu"))["accuracy"]
        assert accuracy == pytest.approx(rows[-1]["eval_accuracy"], abs=1e-6)
    with torch.no_grad():
        x = torch.from_numpy(test.x[:20])
        torch.testing.assert_close(peft_model(x), merged(x), atol=1e-5, rtol=1e-5)
    # predict: the adapter on the run's base, from the history, as the export has it
    np.savez(tmp_path / "new.npz", x=test.x, y=np.zeros_like(test.y))
    done = subprocess.run([*FEDWEAVE, "predict", "--run", run.run_id, "--db", db, "--data",
                           str(tmp_path / "new.npz"), "--out", str(tmp_path / "p.csv")],
                          capture_output=True, text=True, timeout=200)  # fmt: skip
    assert done.returncode == 0, done.stderr
    import pandas as pd

    predicted = pd.read_csv(tmp_path / "p.csv")["prediction"].to_numpy()
    assert (predicted.astype(int) == test.y).mean() == pytest.approx(
        rows[-1]["eval_accuracy"], abs=1e-9
    )


@pytest.mark.slow
def test_gossip_peers_exchange_adapters_only(tmp_path):
    """Three peers average adapters (their frames hold the adapter's tensors): the run
    completes, records the adapter, and the peers' mean model scores above chance."""
    base = _pretrained(tmp_path / "base.safetensors", epochs=8)
    done = subprocess.run(
        [*FEDWEAVE, "simulate", "--mode", "gossip", "--task", "digits", "--clients", "3",
         "--rounds", "2", "--initial-model", str(base), "--peft", "lora", "--lora-rank", "4",
         "--lr", "0.05", "--db", f"sqlite:///{tmp_path / 'g.db'}",
         "--out", str(tmp_path / "report.json")],
        capture_output=True, text=True, timeout=400,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["final_accuracy"] > 0.7, report
    _, run = _rows(f"sqlite:///{tmp_path / 'g.db'}")
    assert run.config["adapter"] == "lora r=4 alpha=4 targets=0,2 full=4"


@pytest.mark.parametrize(
    ("extra", "says"),
    [
        (["--peft", "lora"], "error: --peft lora trains adapters on a frozen pretrained base"),
        (["--peft", "lora", "--initial-model", "BASE", "--lora-targets", "3"],
         "error: --lora-targets 3: 3 is not a linear or convolutional layer"),
        (["--peft", "lora", "--initial-model", "BASE", "--lora-rank", "64"],
         "error: --lora-rank 64 is not below the smaller dimension of 0 (64), 2 (64)"),
        (["--peft", "lora", "--initial-model", "BASE", "--dp", "sample"],
         "error: --dp sample with --peft lora is not supported yet"),
        (["--task", "declaring_tasks:PATTERN", "--peft", "lora", "--initial-model", "BASE"],
         "error: task 'declaring_tasks:PATTERN' declares a peft_config whose target_modules is "
         "a pattern ('.*'); name the modules"),
    ],
)  # fmt: skip
def test_bad_adapter_input_is_one_line_before_anything_runs(tmp_path, extra, says):
    base = _pretrained(tmp_path / "base.safetensors", epochs=1)
    db = tmp_path / "h.db"
    args = [str(base) if a == "BASE" else a for a in extra]
    tests = str(Path(__file__).resolve().parent)
    done = subprocess.run(
        [*FEDWEAVE, "simulate", "--task", "digits", "--clients", "3", "--rounds", "1",
         "--db", f"sqlite:///{db}", *args],
        capture_output=True, text=True, timeout=200, env={**os.environ, "PYTHONPATH": tests},
    )  # fmt: skip
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1, done.stderr[-2000:]
    assert lines[0].startswith(says), lines[0]
    assert not db.exists() or _no_runs(db)


def _no_runs(db: Path) -> bool:
    from fedweave.history import open_store

    with open_store(f"sqlite:///{db}") as store:
        return not store.list_runs()


def test_an_adapter_checkpoint_loads_only_into_the_same_adapter(tmp_path):
    """The recorded tensors are the adapter's: another rank's model refuses them."""
    import torch

    base = _pretrained(tmp_path / "base.safetensors", epochs=1)
    task = load_task("digits")
    four = adapted_task(task, AdapterSpec(4, 8.0, ("0", "2"), ("4",)).encode(), base, "digits")
    eight = adapted_task(task, AdapterSpec(8, 16.0, ("0", "2"), ("4",)).encode(), base, "digits")
    state = four.build_model().state_dict()
    with pytest.raises(RuntimeError, match=r"lora_A.weight is \[4, 64\], this model's is \[8"):
        eight.build_model().load_state_dict({k: torch.as_tensor(np.asarray(v)) for k, v in
                                             state.items()})  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize(
    "extra",
    [
        ["--strategy", "fedprox", "--compress", "int8", "--max-update-norm", "100",
         "--no-secure-agg"],
        ["--dp", "central", "--noise-multiplier", "0.05", "--clipping-norm", "5"],
        ["--schedule", "async"],
    ],
    ids=["fedprox-int8-norm-check", "central-dp-secagg", "fedbuff"],
)  # fmt: skip
def test_lora_runs_with_the_strategies_compression_and_dp_that_exist(tmp_path, extra):
    """Every update path works on the adapter's tensors alone: FedProx's proximal term,
    int8 compression and the update-norm check; central DP's clipping and noise under
    SecAgg+; FedBuff's buffered steps."""
    base = _pretrained(tmp_path / "base.safetensors", epochs=8)
    db = f"sqlite:///{tmp_path / 'h.db'}"
    done = subprocess.run(
        [*FEDWEAVE, "simulate", "--task", "digits", "--clients", "4", "--rounds", "2",
         "--initial-model", str(base), "--peft", "lora", "--lora-rank", "4", "--lr", "0.02",
         "--db", db, *extra],
        capture_output=True, text=True, timeout=400,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    rows, run = _rows(db)
    assert run.status == "completed" and run.config["adapter"].startswith("lora r=4 "), run
    assert rows and rows[-1]["eval_accuracy"] > 0.5, rows[-1]
    full_bytes = 8_970 * 4 * 4  # four sites' full float32 models
    assert rows[-1]["bytes_in"] < 0.5 * full_bytes, rows[-1]
