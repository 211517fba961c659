"""The ClientApp: a NumPyClient that trains on the SuperNode's ``data`` file (node config)."""

from __future__ import annotations

from flwr.client import ClientApp, NumPyClient
from flwr.client.mod import secaggplus_mod
from flwr.common import Context

from stock_app.model import build_model, get_weights, load, set_weights, train


class DigitsClient(NumPyClient):
    def __init__(self, data_path: str, hidden: int) -> None:
        self.model = build_model(hidden)
        self.x, self.y = load(data_path)

    def fit(self, parameters, config):
        set_weights(self.model, parameters)
        train(self.model, self.x, self.y)
        return get_weights(self.model), len(self.x), {}


def client_fn(context: Context):
    hidden = int(context.run_config["hidden"])
    return DigitsClient(str(context.node_config["data"]), hidden).to_client()


def secaggplus_when_on(message, context, call_next):
    """Flower's ``secaggplus_mod`` for runs with ``secure-agg``; it rejects plain messages."""
    if context.run_config["secure-agg"]:
        return secaggplus_mod(message, context, call_next)
    return call_next(message, context)


app = ClientApp(client_fn=client_fn, mods=[secaggplus_when_on])
