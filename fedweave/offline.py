"""Keep Flower offline: no telemetry, no update checks (sites often have no internet)."""

import os

FLOWER_OFFLINE_ENV = {
    "FLWR_TELEMETRY_ENABLED": "0",
    "FLWR_DISABLE_UPDATE_CHECK": "1",
    "RAY_USAGE_STATS_ENABLED": "0",
    "RAY_DEDUP_LOGS": "0",
    "RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO": "0",
}


def make_flower_offline() -> None:
    """Set the environment before flwr or ray is imported; existing values win."""
    for key, value in FLOWER_OFFLINE_ENV.items():
        os.environ.setdefault(key, value)
