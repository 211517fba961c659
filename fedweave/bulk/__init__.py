"""Direct transfers: a round's tensors move beside Flower's messages (``fedweave coordinator
--bulk-address``), while Flower keeps carrying who is in a round, what to do and each site's
outcome.

- ``records.py``: a message's array records as one safetensors blob, and back;
- ``spool.py``: the folder the ServerApp and the coordinator's transfer server share;
- ``server.py``: the transfer server, in the coordinator's process;
- ``transfer.py``: a site's fetch and upload.

The ServerApp's grid (``coordinator/rounds/bulk.py``) and the site's mod
(``client/bulk_mod.py``) put them to work.
"""
