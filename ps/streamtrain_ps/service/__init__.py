"""A shard behind gRPC, and the shard process (``python -m streamtrain_ps``).

- ``wire``: the one codec between numpy arrays and ``ps.proto``'s bytes;
- ``servicer``: decode, call the ``Shard``, encode; the one place errors become codes;
- ``idempotency``: a retried push applied once;
- ``storage_policy``: which storage URIs a Save or Load may name;
- ``metrics``: the shard's Prometheus series;
- ``server``: build, run and stop the gRPC server;
- ``process``: one shard process until SIGTERM.
"""
