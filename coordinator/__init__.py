"""``fedweave.coordinator``: the Flower ServerApp, its strategy wrapper, SecAgg+ and privacy
settings, the SuperLink plumbing and ``fedweave coordinator``."""
