"""``fedweave.client``: a data-holding site, simulated and deployed.

What a site does with a message: ``site_app.py`` (``TaskClient``: train the task on this
site's data, evaluate the global model, federated statistics, private evaluation), inside the
mods of ``mods.py``, which turn what it raised into a coded outcome (refused, rejected, late,
failed), refuse late rounds and a wrong clock, check the update before it leaves, mask it for
SecAgg+ and apply DP.

A deployment: ``cli.py`` (``fedweave client``: checks, the SuperNode, connection state from its
events, reconnects; ``reachability.py`` probes the coordinator), ``worker_supervisor.py`` and
``worker.py`` (the long-lived process that pulls each message and runs the ClientApp of
``deployed_app.py``, which builds this site's ``TaskClient`` for the run or refuses it).
"""
