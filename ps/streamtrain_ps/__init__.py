"""streamtrain parameter server: sharded sparse tables with CTR statistics and a dense table.

Layers (lowest first): ``wire`` (numpy <-> bytes), ``sharding`` (key -> logical shard ->
server), ``settings`` (declaring and parsing every setting of the project, once),
``config`` (validated table and optimizer settings), ``index``/``table``/``optim``/
``accessor``/``dense`` (the in-memory model), ``checkpoint`` (save/load/publish), ``servicer``
and ``server`` (gRPC), ``client`` (the ``PSLike`` implementations workers and the scheduler use).
"""

__all__: list[str] = []
