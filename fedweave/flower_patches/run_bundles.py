"""The coordinator's SuperLink starts only runs of fedweave's own apps (applied in its process
by ``fedweave.flower_patches.launch``).

``StartRun`` in Flower 1.41 accepts any bundle, a stored app or a Hub app reference, and its
SuperExec then imports whatever ServerApp the bundle names in ``flwr-serverapp``. Only the
coordinator reaches the Control API (``admin_apis``); this is the second lock behind it: a
run whose bundle is not fedweave's (``fedweave.app_bundle.bundle_problem``), or that names
an app instead of carrying one, is refused with the reason and nothing is stored.
"""

from __future__ import annotations

import logging

log = logging.getLogger("fedweave.flower_patches")


def install() -> None:
    from flwr.supercore.error import ApiErrorCode, FlowerError
    from flwr.superlink.servicer.control import control_handlers

    from fedweave.app_bundle import bundle_problem

    stock = control_handlers.start_run
    if getattr(stock, "fedweave_patch", False):
        return

    def start_run(request, account, state, fleet_api_type, **kwargs):  # Flower's signature
        if request.app_spec or not request.fab.content:
            problem = "the run names an app instead of carrying fedweave's bundle"
        else:
            problem = bundle_problem(bytes(request.fab.content))
        if problem is not None:
            log.warning("StartRun refused: %s", problem)
            raise FlowerError(ApiErrorCode.INVALID_APP_SPEC, f"fedweave refuses the run: {problem}")
        return stock(request, account, state, fleet_api_type, **kwargs)

    start_run.fedweave_patch = True  # type: ignore[attr-defined]
    control_handlers.start_run = start_run
