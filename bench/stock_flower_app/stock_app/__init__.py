"""Minimal stock Flower app for ``bench/bench_deployment.py``."""
