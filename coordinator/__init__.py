"""``fedweave.coordinator``: the federated coordinator, laid out by the process each part runs
in. ``docs/architecture.md`` maps every process of a deployment to its files and its logs, and
follows one round through them.

- ``command/``: the ``fedweave coordinator`` and ``fedweave evaluate`` process: checks, the
  SuperLink it starts and talks to (Control API, site keys, the Flower App Bundle), the
  history run it creates or resumes, the console.
- ``serverapp/``: inside Flower's ``flwr-serverapp`` (started by the SuperLink for each run):
  the ServerApp the bundle names (``deployed_server_app.py``; ``client/deployed_app.py`` is
  the site's), the evaluation-only run, the history run both record into.
- ``rounds/``: the round loop's strategy wrappers, workflows and listeners, run wherever the
  round loop runs: inside ``flwr-serverapp`` in a deployment, in the ``fedweave simulate``
  process in a simulation.
- ``plan.py``: what ``command/`` hands ``serverapp/`` through Flower's run config (and a 0600
  file); the two processes share nothing else.

Arrows: ``command → plan ← serverapp → rounds``; ``command`` also reads
``rounds/round_settings.py`` (and a few constants of ``rounds/``) to check a run and size its
deadline before anything starts. ``tests/test_layout.py`` keeps the import graph free of
cycles.
"""
