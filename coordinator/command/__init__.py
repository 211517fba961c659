"""The ``fedweave coordinator`` and ``fedweave evaluate`` process: checks, the SuperLink it
starts and talks to, the history run it plans, the console it prints.

``cli.py`` (the commands) → ``supervisor.py`` (check everything, start the SuperLink of
``superlink.py``, wait for the sites, start the run, follow the history, stop cleanly), with
``training_setup.py`` and ``evaluation_setup.py`` (each command's run checked, its history
run created or resumed, its plan), ``run_header.py`` (what protects the run, said once) and
``refused_key_notices.py`` (one line per site key the SuperLink refused). What it hands the
ServerApp: ``coordinator/plan.py``.
"""
