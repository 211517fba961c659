"""The learning kernel every mode trains with: the Task protocol and built-in tasks
(``task``, ``tasks/``), the local training loop (``training``), site data readers (``data``;
image folders streamed from disk: ``images``),
model weights as arrays and files (``weights``) and update checks (``validation``).

It imports no mode: the coordinator, the site app, the gossip peer and the simulations all
build on it.
"""
