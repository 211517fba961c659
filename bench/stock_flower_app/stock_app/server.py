"""The ServerApp: FedAvg over every connected SuperNode, SecAgg+ when ``secure-agg`` is set,
the global model scored on ``test-data`` after each round (the time written to ``timings``)."""

from __future__ import annotations

import time

from flwr.common import Context, ndarrays_to_parameters
from flwr.server import Grid, LegacyContext, ServerApp, ServerConfig
from flwr.server.strategy import FedAvg
from flwr.server.workflow import DefaultWorkflow, SecAggPlusWorkflow

from stock_app.model import build_model, evaluate, get_weights, load, set_weights

app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    config = context.run_config
    x_test, y_test = load(str(config["test-data"]))
    timings = str(config["timings"])
    model = build_model(int(config["hidden"]))

    def central_evaluate(server_round, weights, _config):
        with open(timings, "a") as out:
            out.write(f"{time.time()}\n")
        set_weights(model, weights)
        loss, accuracy = evaluate(model, x_test, y_test)
        return loss, {"accuracy": accuracy}

    sites = int(config["sites"])
    strategy = FedAvg(
        fraction_fit=1.0, fraction_evaluate=0.0, min_fit_clients=sites, min_available_clients=sites,
        initial_parameters=ndarrays_to_parameters(get_weights(model)),
        evaluate_fn=central_evaluate,
    )  # fmt: skip
    rounds = int(config["num-server-rounds"])
    server_config = ServerConfig(num_rounds=rounds)
    legacy = LegacyContext(context=context, config=server_config, strategy=strategy)
    fit_workflow = (
        SecAggPlusWorkflow(num_shares=sites, reconstruction_threshold=sites // 2 + 1)
        if config["secure-agg"]
        else None
    )
    DefaultWorkflow(fit_workflow=fit_workflow)(grid, legacy)
