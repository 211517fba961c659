"""One config: every command's options come from one declaration, config files are read and
checked the same way as flags, stored configs print back as TOML that reruns the run, and a
resume merges stored and given config by one policy."""

import dataclasses
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import click
import pytest
import typer
import typer.testing

from fedweave.cli import app
from fedweave.config import COMMAND_SETTINGS, SETTINGS, RunConfig
from fedweave.config.commands import Resolved, config_command
from fedweave.config.files import read_config_file
from fedweave.config.resume import config_as_toml, merge_for_resume, stored_run_config
from fedweave.config.sections import EvaluationSection, PrivacySection, TrainingSection
from fedweave.errors import UserError

RUN_COMMANDS = ("simulate", "coordinator", "evaluate", "client", "peer")


def _commands() -> dict[str, click.Command]:
    root = typer.main.get_command(app)
    found: dict[str, click.Command] = {}

    def walk(group: click.Group, prefix: str) -> None:
        for name, command in group.commands.items():
            if isinstance(command, click.Group):
                walk(command, f"{prefix}{name} ")
            else:
                found[f"{prefix}{name}"] = command

    walk(root, "")
    return found


def _options(command: click.Command) -> dict[str, click.Option]:
    return {p.name: p for p in command.params if isinstance(p, click.Option) and p.name != "help"}


def test_shared_options_have_one_name_and_one_default_everywhere():
    commands = _commands()
    seen: dict[str, tuple[str, tuple, object]] = {}
    shared = set()
    for command_name in (*RUN_COMMANDS, "data split"):
        for name, option in _options(commands[command_name]).items():
            if command_name == "data split" and name == "out":
                continue  # data split's --out is its output directory, not simulate's report
            key = (tuple(sorted(option.opts + option.secondary_opts)), option.default)
            if name in seen:
                shared.add(name)
                assert key == seen[name][1:], (name, command_name, seen[name][0])
            else:
                seen[name] = (command_name, *key)
    # the options every mode shares really are shared
    for name in ("task", "lr", "batch_size", "local_epochs", "rounds", "seed", "device", "db"):
        assert name in shared, name


def test_every_run_command_takes_exactly_its_declared_settings():
    commands = _commands()
    for name in RUN_COMMANDS:
        options = set(_options(commands[name])) - {"config"}
        assert options == set(COMMAND_SETTINGS[name]), name
        assert "config" in _options(commands[name])
        for option in _options(commands[name]).values():
            assert option.help and len(option.help) > 10, (name, option.name)


def test_the_coordinator_has_every_federation_option_of_simulate():
    coordinator = set(_options(_commands()["coordinator"]))
    for name in ("strategy", "dp", "noise_multiplier", "clipping_norm", "dp_epsilon",
                 "dp_delta", "max_update_norm", "secagg_timeout", "device", "clients_per_round",
                 "local_epochs", "lr", "batch_size", "proximal_mu", "secure_agg"):
        assert name in coordinator, name


def test_the_peer_trains_like_every_other_mode():
    peer = _options(_commands()["peer"])
    assert peer["lr"].default == 0.1 and peer["batch_size"].default == 16
    assert peer["local_epochs"].default == 1 and "--local-epochs" in peer["local_epochs"].opts


@dataclass
class _Captured:
    config: RunConfig | None = None
    resolved: Resolved | None = None


def _invoke(args: list[str], command: str = "simulate") -> _Captured:
    captured = _Captured()

    def body(config: RunConfig, resolved: Resolved) -> None:
        captured.config, captured.resolved = config, resolved

    test_app = typer.Typer()
    test_app.command(command)(config_command(command, body, "test"))
    test_app.command("other")(lambda: None)
    result = typer.testing.CliRunner().invoke(test_app, [command, *args])
    if result.exception and not isinstance(result.exception, SystemExit):
        raise result.exception
    assert result.exit_code == 0, result.output
    return captured


def test_the_task_declares_training_defaults_and_flags_and_files_override_them(tmp_path):
    assert _invoke(["--task", "mnist5k"]).config.training.optimizer == "adamw"
    given = _invoke(["--task", "mnist5k", "--optimizer", "sgd", "--lr", "0.05"]).config.training
    assert (given.optimizer, given.lr, given.batch_size) == ("sgd", 0.05, 32)
    (tmp_path / "run.toml").write_text('[training]\nbatch_size = 8\n')
    from_file = _invoke(["--task", "mnist5k", "--config", str(tmp_path / "run.toml")])
    assert from_file.config.training.batch_size == 8 and from_file.config.training.lr == 0.001
    # a task that declares none keeps the generic defaults
    assert _invoke(["--task", "digits"]).config.training.optimizer == "sgd"


def test_the_deployed_server_app_gets_every_training_setting():
    from fedweave.coordinator.plan import PLAN_SETTINGS

    local_only = {"num_workers", "nproc_per_node"}  # each site's own choice
    training = set(SETTINGS) & {f.name for f in dataclasses.fields(TrainingSection)}
    assert training - local_only <= set(PLAN_SETTINGS) | {"device"}
    assert training <= set(COMMAND_SETTINGS["coordinator"]) | local_only
    # and every evaluation setting the coordinator takes (the sites' own stay with them)
    evaluation = {f.name for f in dataclasses.fields(EvaluationSection)}
    coordinator = evaluation & set(COMMAND_SETTINGS["coordinator"])
    assert coordinator == {
        "fraction_evaluate", "evaluate_every", "cross_site", "private_evaluation",
        "select_metric", "select_mode",
    }  # fmt: skip
    assert coordinator <= set(PLAN_SETTINGS)
    # and every privacy setting (a --max-epsilon left with the CLI was never enforced)
    assert {f.name for f in dataclasses.fields(PrivacySection)} <= set(PLAN_SETTINGS)
    # and the deployment settings a round itself applies (two were left with the CLI)
    assert {"wait_for_sites", "max_clock_skew", "db_outage"} <= set(PLAN_SETTINGS)


def test_flags_override_the_file_and_the_file_overrides_defaults(tmp_path):
    import typer.testing  # noqa: F401 - CliRunner

    run_toml = tmp_path / "run.toml"
    run_toml.write_text('[training]\nlr = 0.05\nrounds = 7\n\n[data]\ntask = "digits"\n'
                        'partition = "dirichlet"\n')
    got = _invoke(["--config", str(run_toml), "--lr", "0.2"])
    assert got.config.training.lr == 0.2  # flag beats file
    assert got.config.training.rounds == 7  # file beats default
    assert got.config.data.partition == "dirichlet"
    assert got.config.training.batch_size == 16  # default
    assert got.resolved.explicit == {"lr", "rounds", "task", "partition"}


@pytest.mark.parametrize(
    "content, message",
    [
        (None, "not found"),
        ("lr = = 1", "is not TOML"),
        ("[training]\nlrate = 0.1\n", "[training] lrate is unknown"),
        ("[trainin]\nlr = 0.1\n", "unknown section [trainin]"),
        ('[training]\nlr = "fast"\n', "[training] lr = 'fast': expected a number"),
        ("[training]\nbatch_size = 0\n", "[training] batch_size must be at least 1, got 0"),
        ('[federation]\nstrategy = "nope"\n', "[federation] strategy 'nope' is unknown"),
        ("[deployment]\naddress = \"0.0.0.0:1\"\n", "is not a setting of `fedweave simulate`"),
    ],
)
def test_a_bad_config_file_is_one_line_naming_file_and_key(tmp_path, content, message):
    path = tmp_path / "run.toml"
    if content is not None:
        path.write_text(content)
    result = subprocess.run(
        [sys.executable, "-m", "fedweave.cli", "simulate", "--config", str(path),
         "--db", f"sqlite:///{tmp_path / 'h.db'}", "--out", str(tmp_path / "r.json")],
        capture_output=True, text=True, timeout=120, cwd=tmp_path,
    )
    assert result.returncode == 2, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and str(path) in lines[0]
    assert message in lines[0], lines[0]
    assert not (tmp_path / "h.db").exists()  # nothing started, nothing recorded


def test_stored_config_prints_back_as_toml_that_reruns_the_same_run(tmp_path):
    given = RunConfig.of(lr=0.05, clients=4, partition="shards", strategy="fedprox",
                         proximal_mu=0.5, secure_agg=False, max_update_norm=3.0,
                         db=f"sqlite:///{tmp_path}/secret.db")
    stored = stored_run_config(given, "simulate")
    assert "db" not in str(stored)  # the database URL may hold a password: never stored

    @dataclass
    class Run:
        run_id: str = "abc123"
        config: dict | None = None

    text = config_as_toml(Run(config=stored))
    assert text.startswith("# run abc123: `fedweave simulate --config THIS_FILE`")
    path = tmp_path / "again.toml"
    path.write_text(text)
    values = read_config_file(path, "simulate")
    rerun = RunConfig.of(**values)
    for name in COMMAND_SETTINGS["simulate"]:
        if SETTINGS[name].meta.stored:
            assert rerun.value(name) == given.value(name), name


@dataclass
class _Run:
    run_id: str = "r1"
    mode: str = "federated"
    status: str = "interrupted"
    rounds_completed: int = 3
    config: dict | None = None


def _resolved(command: str = "simulate", explicit: set[str] = frozenset()) -> Resolved:
    return Resolved(command, frozenset(explicit))


def test_resume_keeps_what_the_run_computes_and_takes_where_it_runs():
    started = RunConfig.of(lr=0.05, rounds=10, device="cpu")
    run = _Run(config=stored_run_config(started, "simulate"))
    resumed = merge_for_resume(run, RunConfig.of(device="cuda:1", lr=0.1), _resolved())
    assert resumed.training.lr == 0.05 and resumed.training.rounds == 10  # stored identity
    assert resumed.training.device == "cuda:1"  # where it runs: this command's
    with pytest.raises(UserError, match=r"--lr 0.1 \(run has 0.05\)"):
        merge_for_resume(run, RunConfig.of(lr=0.1), _resolved(explicit={"lr"}))
    with pytest.raises(UserError, match="started by `fedweave simulate`"):
        merge_for_resume(run, RunConfig(), _resolved("coordinator"))
    with pytest.raises(UserError, match="already completed"):
        merge_for_resume(_Run(status="completed", config=run.config), RunConfig(), _resolved())


def test_resume_reads_configs_recorded_before_the_redesign():
    legacy_deployment = {"task": "digits", "rounds": 5, "min_clients": 3, "lr": 0.05,
                         "secure_agg": False, "mode": "deployment"}
    resumed = merge_for_resume(_Run(config=legacy_deployment), RunConfig(),
                               _resolved("coordinator"))
    assert resumed.training.rounds == 5 and resumed.training.lr == 0.05
    assert not resumed.secure_aggregation.secure_agg
    legacy_simulation = {"task": "digits", "clients": 3, "rounds": 4, "cpus_per_client": 1.0}
    resumed = merge_for_resume(_Run(config=legacy_simulation), RunConfig(), _resolved())
    assert resumed.data.clients == 3 and resumed.training.rounds == 4


def test_declared_choices_are_the_ones_the_modes_implement():
    """The core declares the choices (it imports no mode); this keeps them from drifting."""
    from fedweave.coordinator.rounds.strategies import STRATEGIES
    from fedweave.gossip.averaging import MIX_RULES
    from fedweave.history.tracking import TRACKERS
    from fedweave.simulations.partition import PARTITION_SCHEMES

    assert SETTINGS["strategy"].meta.choices == tuple(STRATEGIES)
    assert SETTINGS["mix"].meta.choices == MIX_RULES
    assert SETTINGS["partition"].meta.choices == PARTITION_SCHEMES
    assert SETTINGS["track"].meta.choices == TRACKERS


def test_setting_names_are_unique_and_documented():
    for name, setting in SETTINGS.items():
        assert setting.meta.help.endswith((".", ")")), name
    assert Path(__file__).parent.joinpath("..", "fedweave", "config", "sections.py").exists()
