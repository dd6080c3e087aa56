"""streamtrain parameter server: sharded sparse tables with CTR statistics and a dense table.

Layers (lowest first): ``wire`` (numpy <-> bytes), ``sharding`` (key -> logical shard ->
server), ``settings`` (declaring and parsing every setting of the project, once), ``config``
and ``validation`` (checked settings and arguments), ``index``/``table``/
``kernels``/``optim``/``accessor``/``dense`` (the in-memory model), ``shard`` (one shard's
tables and vectors), ``checkpoint``/``saving``/``staging`` (save, load, publish),
``servicer``/``server``/``grpc_serving``/``idempotency``/``metrics``/``tls`` (the gRPC
process, ``python -m streamtrain_ps``: ``process``, imported under ``startup_gc``), and the
``PSLike`` protocol (``api``) with its two implementations: ``local`` (in-process) and
``remote`` (over gRPC; ``rpc``, ``dedup``). ``launch`` starts child processes that announce
their address (PS shards, workers).
"""

__all__: list[str] = []
