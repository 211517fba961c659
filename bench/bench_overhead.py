"""fedweave's framework overhead over a minimal hand-written Flower app.

Both run the same MLP on the same per-site digits files for the same rounds through
Flower's simulation engine with the same Ray resources, engine polling and central
evaluation each round, plain FedAvg (no SecAgg+: the hand-written app has none);
each trial runs in a fresh process, alternating, and the time of the simulation call is
compared (median of the trials). Prints fedweave time / raw Flower time (goal <= 1.05).

    python bench/bench_overhead.py --clients 10 --rounds 20 --trials 3
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from fedweave.offline import make_flower_offline

make_flower_offline()

MIN_TRAINED_ACCURACY = 0.5
"""Digits has 10 classes; a run below this did not train and its time means nothing."""


def raw_flower_apps(split_dir: Path, clients: int, rounds: int, accuracies: list[float]):
    """The minimal Flower 1.41 app a user would write by hand (legacy API, FedAvg).

    ``accuracies`` receives the central test accuracy after every round.
    """
    import numpy as np
    import torch
    from flwr.client import ClientApp, NumPyClient
    from flwr.common import Context, ndarrays_to_parameters
    from flwr.server import ServerApp, ServerAppComponents, ServerConfig
    from flwr.server.strategy import FedAvg
    from torch import nn

    def model() -> nn.Module:
        return nn.Sequential(
            nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10)
        )

    def get(m):
        return [v.detach().cpu().numpy() for v in m.state_dict().values()]

    def put(m, ws):
        m.load_state_dict({k: torch.from_numpy(w) for k, w in zip(m.state_dict(), ws)})

    # Not functools.cache: Ray pickles the ClientApp with every message and cannot pickle
    # a cache around a local function (every client call would fail).
    def load(path: str):
        with np.load(path) as f:
            return torch.from_numpy(f["x"]).float(), torch.from_numpy(f["y"]).long()

    class Client(NumPyClient):
        def __init__(self, pid: int):
            self.x, self.y = load(str(split_dir / f"site-{pid}.npz"))
            self.net = model()

        def fit(self, parameters, config):
            put(self.net, parameters)
            opt = torch.optim.SGD(self.net.parameters(), lr=0.1, momentum=0.9)
            order = torch.randperm(len(self.y))
            for i in range(0, len(order), 16):
                idx = order[i : i + 16]
                opt.zero_grad()
                nn.functional.cross_entropy(self.net(self.x[idx]), self.y[idx]).backward()
                opt.step()
            return get(self.net), len(self.y), {}

    def client_fn(context: Context):
        torch.set_num_threads(1)
        return Client(int(context.node_config["partition-id"])).to_client()

    test_x, test_y = load(str(split_dir / "test.npz"))
    eval_net = model()

    def evaluate(server_round, parameters, config):
        put(eval_net, parameters)
        with torch.no_grad():
            logits = eval_net(test_x)
        accuracy = float((logits.argmax(1) == test_y).float().mean())
        if server_round > 0:
            accuracies.append(accuracy)
        return float(nn.functional.cross_entropy(logits, test_y)), {"accuracy": accuracy}

    torch.manual_seed(0)
    start = ndarrays_to_parameters(get(model()))

    def server_fn(context: Context):
        strategy = FedAvg(
            fraction_fit=1.0,
            fraction_evaluate=0.0,
            min_fit_clients=clients,
            min_available_clients=clients,
            evaluate_fn=evaluate,
            initial_parameters=start,
        )
        return ServerAppComponents(strategy=strategy, config=ServerConfig(num_rounds=rounds))

    return ServerApp(server_fn=server_fn), ClientApp(client_fn=client_fn)


def one_trial(kind: str, clients: int, rounds: int) -> tuple[float, float]:
    """Seconds of one simulation and the global model's final test accuracy."""
    import logging

    from flwr.simulation import run_simulation

    from fedweave.config import RunConfig
    from fedweave.simulations.federated import (
        backend_config,
        quiet_flower,
        run_federated_simulation,
    )
    from fedweave.simulations.split import write_split

    # Plain FedAvg on both sides (the hand-written app has no SecAgg+), and the same engine
    # polling (fedweave's run tunes it; the raw run gets the same tuning below).
    config = RunConfig.of(
        task="digits", clients=clients, rounds=rounds, partition="dirichlet", secure_agg=False
    )
    quiet_flower(False)
    logging.getLogger("flwr").setLevel(logging.ERROR)
    with tempfile.TemporaryDirectory() as tmp:
        split = Path(tmp)
        if kind == "fedweave":
            started = time.perf_counter()
            rows = run_federated_simulation(config, split_dir=split)
            return time.perf_counter() - started, rows[-1]["accuracy"]
        from fedweave.flower_patches import tune_simulation_engine
        from fedweave.learning.tasks import load_task

        tune_simulation_engine()
        started = time.perf_counter()
        write_split(load_task("digits"), split, clients, "dirichlet", 0.5, 2, 0)
        accuracies: list[float] = []
        server_app, client_app = raw_flower_apps(split, clients, rounds, accuracies)
        run_simulation(
            server_app, client_app, num_supernodes=clients, backend_config=backend_config(config)
        )
        return time.perf_counter() - started, accuracies[-1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--one", choices=["raw", "fedweave"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        seconds, accuracy = one_trial(args.one, args.clients, args.rounds)
        print(json.dumps({"seconds": seconds, "accuracy": accuracy}))
        return
    times: dict[str, list[float]] = {"raw": [], "fedweave": []}
    accuracy: dict[str, list[float]] = {"raw": [], "fedweave": []}
    for trial in range(args.trials):
        for kind in ("raw", "fedweave") if trial % 2 == 0 else ("fedweave", "raw"):
            out = (
                subprocess.run(
                    [
                        sys.executable,
                        __file__,
                        "--one",
                        kind,
                        "--clients",
                        str(args.clients),
                        "--rounds",
                        str(args.rounds),
                    ],
                    capture_output=True,
                    text=True,
                    check=True,
                )
                .stdout.strip()
                .splitlines()[-1]
            )
            result = json.loads(out)
            times[kind].append(result["seconds"])
            accuracy[kind].append(result["accuracy"])
            print(
                f"trial {trial + 1} {kind:9s} {result['seconds']:.2f}s "
                f"final accuracy {result['accuracy']:.3f}",
                flush=True,
            )
            # A run whose clients fail still finishes (fast): refuse to time it.
            if result["accuracy"] < MIN_TRAINED_ACCURACY:
                sys.exit(f"the {kind} run did not train (accuracy {result['accuracy']:.3f})")
    raw, ours = statistics.median(times["raw"]), statistics.median(times["fedweave"])
    print(f"clients={args.clients} rounds={args.rounds} trials={args.trials}")
    print(f"raw Flower median  {raw:.2f}s  final accuracy {statistics.median(accuracy['raw']):.3f}")
    print(
        f"fedweave median    {ours:.2f}s  final accuracy "
        f"{statistics.median(accuracy['fedweave']):.3f}"
    )
    print(f"fedweave / raw Flower = {ours / raw:.3f} (goal <= 1.05)")


if __name__ == "__main__":
    main()
