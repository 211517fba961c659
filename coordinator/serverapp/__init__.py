"""What runs inside Flower's ``flwr-serverapp`` process, which the SuperLink starts for each
run: ``deployed_server_app.py`` (the ServerApp the Flower App Bundle names: reads the plan,
resumes the history run, runs the rounds of ``coordinator/rounds/``; as
``client/deployed_app.py`` is the site's ClientApp), ``evaluation_app.py`` (``fedweave
evaluate``'s evaluation-only run) and ``history_run.py`` (the history run both record into,
tied to the coordinator process's life).
"""
