"""A site that restarts gets its node back at once (applied in the coordinator's SuperLink
process by ``fedweave.flower_patches.launch``).

With site authentication, a site's node id belongs to its registered key, and the SuperNode
activates that node when it starts. Flower 1.41 activates only a node that is registered or
offline (``InMemoryLinkState.activate_node``); a node counts as online until its heartbeat
lapses, up to 60 s after the last one (``HEARTBEAT_PATIENCE`` × the 30 s interval). So a
site whose process was killed and started again at once was refused for up to a minute, and
the rounds started meanwhile sampled its dead node and recorded it late.

Every Fleet request carries a signature by the node's key, which the SuperLink checks before
any handler runs (``flwr.superlink.routers.fleet.node_auth``); an activation of an online node
therefore comes from the holder of that node's key, which is the site itself. fedweave
activates it again: the new process takes the node over, and the messages waiting for it.
"""

from __future__ import annotations

import logging

log = logging.getLogger("fedweave.flower_patches")


def install() -> None:
    from flwr.common.constant import HEARTBEAT_PATIENCE
    from flwr.server.superlink.linkstate.in_memory_linkstate import InMemoryLinkState
    from flwr.supercore.constant import NodeStatus
    from flwr.supercore.date import now

    stock = InMemoryLinkState.activate_node
    if getattr(stock, "fedweave_patch", False):
        return

    def activate_node(self: InMemoryLinkState, node_id: int, heartbeat_interval: float) -> bool:
        with self.lock:
            self._check_and_tag_offline_nodes(node_ids=[node_id])
            node = self.nodes.get(node_id)
            if node is not None and node.status == NodeStatus.ONLINE:
                current = now()
                node.last_activated_at = current.isoformat()
                node.online_until = current.timestamp() + HEARTBEAT_PATIENCE * heartbeat_interval
                node.heartbeat_interval = heartbeat_interval
                log.info("node %s activated again: its site restarted", node_id)
                return True
        return stock(self, node_id, heartbeat_interval)

    activate_node.fedweave_patch = True  # type: ignore[attr-defined]
    InMemoryLinkState.activate_node = activate_node  # type: ignore[method-assign]
