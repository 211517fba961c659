"""Less overhead per message in Flower's simulation engine (applied by
``fedweave.flower_patches``).

Every message round trip in the simulation engine waits on two fixed 100 ms polls: the
grid pulls replies every ``pull_interval`` (0.1 s) and the engine's dispatcher looks for new
instructions every 0.1 s. A FedAvg round makes one round trip, a SecAgg+ round four, so on
small models these sleeps, not computation, dominated round time. Polling every 5 ms removes
that floor.

The dispatcher's poll itself also had to change. Flower's asks the link state for each
simulated site in turn, and each ask scans every stored instruction: sites x instructions
look-ups a poll, which at 1,000 sites and 100 instructions in flight kept the driver's CPU busy
and made round time grow with the total number of sites rather than the sampled ones. This
dispatcher scans the stored instructions once and asks only for the sites they are addressed
to, through Flower's own ``get_message_ins`` (which checks and marks them delivered).

Third, the Ray backend passed the ClientApp loader, a closure, with every message, so Ray
pickled it by value (cloudpickle walks its module's imports) once per message per site; it is
now put into Ray's object store once and passed by reference.

The patch touches only the in-process simulation engine, and only the exact Flower version it
was written for (it reads ``InMemoryLinkState.message_ins_store`` and ``RayBackend.app_fn``).
"""

from __future__ import annotations

import functools
import threading

POLL_SECONDS = 0.005


def sites_with_new_instructions(state, nodes_mapping) -> list[int]:
    """The simulated sites that ``state`` holds undelivered instructions for, in the order
    those instructions were stored."""
    with state.lock:
        waiting = [
            message.metadata.dst_node_id
            for message in state.message_ins_store.values()
            if message.metadata.delivered_at == ""
        ]
    return [node_id for node_id in dict.fromkeys(waiting) if node_id in nodes_mapping]


def _add_messages_to_queue(state, queue, nodes_mapping, f_stop: threading.Event) -> None:
    """Flower's ``vce_api.add_messages_to_queue``, polling every ``POLL_SECONDS`` instead of
    0.1 s and asking only for the sites that have instructions waiting."""
    while not f_stop.is_set():
        for node_id in sites_with_new_instructions(state, nodes_mapping):
            for msg in state.get_message_ins(node_id=node_id, limit=1):
                queue.put(msg)
        f_stop.wait(POLL_SECONDS)


def _build_with_shared_app(original_build):
    @functools.wraps(original_build)
    def build(self, app_fn) -> None:
        import ray

        original_build(self, app_fn)
        self.app_fn = ray.put(app_fn)  # actors receive the loader itself: Ray resolves refs

    return build


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
    from flwr.server.superlink.fleet.vce.backend.raybackend import RayBackend

    RayBackend.build = _build_with_shared_app(RayBackend.build)
