"""Shorter polling in Flower's simulation engine (applied by ``fedweave.flower_patches``).

Every message round trip in the simulation engine waits on two fixed 100 ms polls: the
grid pulls replies every ``pull_interval`` (0.1 s) and the engine's dispatcher looks for new
instructions every 0.1 s. A FedAvg round makes one round trip, a SecAgg+ round four, so on
small models these sleeps, not computation, dominated round time. Polling every 5 ms costs
a few thousand in-memory look-ups a second and removes that floor. The patch touches only
the in-process simulation engine, and only the exact Flower version it was written for.
"""

from __future__ import annotations

import functools
import threading

POLL_SECONDS = 0.005


def _add_messages_to_queue(state, queue, nodes_mapping, f_stop: threading.Event) -> None:
    """Flower's ``vce_api.add_messages_to_queue`` with ``POLL_SECONDS`` instead of 0.1 s."""
    while not f_stop.is_set():
        for node_id in nodes_mapping.keys():
            for msg in state.get_message_ins(node_id=node_id, limit=1):
                queue.put(msg)
        f_stop.wait(POLL_SECONDS)


def install() -> None:
    """Apply the shorter polls (the version guard is the caller's: ``fedweave.flower_patches``)."""
    import importlib

    from flwr.server.superlink.fleet.vce import vce_api

    # flwr.simulation re-exports the function under the module's name: take the module
    run_simulation_module = importlib.import_module("flwr.simulation.run_simulation")

    if not isinstance(run_simulation_module.InMemoryGrid, functools.partial):
        run_simulation_module.InMemoryGrid = functools.partial(
            run_simulation_module.InMemoryGrid, pull_interval=POLL_SECONDS
        )
    vce_api.add_messages_to_queue = _add_messages_to_queue
