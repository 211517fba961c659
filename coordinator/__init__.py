"""``fedweave.coordinator``: the federated coordinator, simulated and deployed.

Where a federated round happens: ``server_app.py`` (``make_server_app``): each round samples
sites, trains (plain or through SecAgg+) and evaluates, through Flower's workflows around the
``ReportingStrategy`` of ``reporting.py``, which checks and records every site's part.

Around a round, one concern per file:

- the round's parts: ``strategies.py`` (which Flower strategy), ``reporting.py`` (checks, per
  site records, the round summary of ``rounds.py``), ``site_outcomes.py`` (what each site said,
  bound to its node), ``deadlines.py`` (when a round closes), ``secure_agg.py`` and
  ``privacy.py`` (SecAgg+ and DP settings), ``federated_evaluation.py`` and
  ``private_evaluation.py`` (sites scoring the global model), ``statistics.py`` (federated
  statistics before round 1, on ``vector_exchange.py``), ``stragglers.py`` (simulated);
- what listens to a round: ``history_recorder.py``, ``site_names.py``, ``model_health.py``;
- a deployment: ``cli.py`` → ``serve.py`` (``fedweave coordinator``: checks, the SuperLink of
  ``superlink.py``, progress, shutdown; ``run_header.py``, ``refused_keys.py``) and
  ``deployed_run.py`` (the ServerApp Flower starts for the run, recording into the history);
  ``evaluation_run.py`` is ``fedweave evaluate``.
"""
