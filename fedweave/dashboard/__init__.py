"""``fedweave.dashboard``: the operator's live view of a history, and Prometheus metrics.

``views.py`` reads the history into what a page shows (incrementally, read-only);
``app.py`` serves the pages, their JSON and ``/metrics`` (``prometheus.py``); ``security.py``
decides who may look and over what (loopback by default; elsewhere TLS and a credential);
``server.py`` runs it with uvicorn; ``cli.py`` is ``fedweave dashboard``. The stall rules are
the history's (``fedweave/history/alerts.py``), shared with the coordinator's warnings.
"""
