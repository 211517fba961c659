"""A federated run's rounds: the strategy wrappers, workflows and listeners of the round loop.

They run wherever the round loop runs: inside ``flwr-serverapp`` in a deployment
(``coordinator/serverapp/``), in the ``fedweave simulate`` process in a simulation. Nothing
here starts a process or reads the command line.

- the loop: ``round_app.py`` (synchronous rounds, ``make_server_app``), ``fedbuff.py``
  (``--schedule async``), ``round_settings.py`` (what the rounds run with, and the checks
  every command runs on it first);
- a round's parts: ``strategies.py`` (which Flower strategy), ``reporting.py`` (checks and
  records every site's part, builds the ``RoundSummary``), ``site_outcomes.py`` (what each
  site said, bound to its node), ``deadlines.py`` (when a round closes), ``stragglers.py``
  (simulated), ``traffic.py`` (bytes in and out);
- protections: ``secure_agg.py`` (SecAgg+ settings), ``secure_buffer.py`` (SecAgg+ per
  FedBuff buffer), ``privacy.py`` (DP);
- evaluation: ``central_evaluation.py`` (the coordinator's own test data),
  ``federated_evaluation.py`` and ``private_evaluation.py`` (sites scoring the global model),
  ``federated_statistics.py`` (statistics before round 1), both exchanges on
  ``vector_exchange.py``;
- listeners: ``site_names.py``, ``model_health.py``, ``simulated_clock.py``,
  ``history_listener.py`` (each round and its checkpoint into the SQL history).
"""
