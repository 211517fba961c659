"""A shorter first wait when a message's objects are not there yet (applied by the deployment
patches of ``fedweave.flower_patches``).

Flower 1.41 sends a message's header before its objects (the weights), and whoever pulls it
backs off 1 s, then 2 s, 4 s ... when an object is not uploaded yet
(``flwr.supercore.inflatable.inflatable_utils.pull_objects``). With a ClientApp that answers
in a fraction of a second, nearly every pull of a round arrives that early: a site's SuperNode
pulling the coordinator's instructions, the coordinator pulling replies, and fedweave's
ClientApp worker pulling from its SuperNode each lost a second or three per message. fedweave
starts the backoff at ``FIRST_BACKOFF_SECONDS`` and keeps Flower's doubling, cap and limits.
"""

from __future__ import annotations

import functools
import types

FIRST_BACKOFF_SECONDS = 0.05


def quick(pull: types.FunctionType):
    """``pull`` (Flower's ``pull_objects`` or ``pull_and_inflate_object_from_tree``) with the
    shorter first backoff."""
    return functools.partial(pull, initial_backoff=FIRST_BACKOFF_SECONDS)


def install_in(module: types.ModuleType) -> None:
    """Replace the ``pull_objects`` that ``module`` imported (the version guard is the caller's)."""
    if not isinstance(module.pull_objects, functools.partial):
        module.pull_objects = quick(module.pull_objects)
