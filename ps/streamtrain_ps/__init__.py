"""streamtrain parameter server: sharded sparse tables with CTR statistics and a dense table.

The house, top floor first; a room imports only the rooms below it (the import-linter
``layers`` contract in ``pyproject.toml``; the map of every module is
``docs/architecture.md``):

- ``__main__``: ``python -m streamtrain_ps``, one shard process;
- ``client/``: ``LocalPS`` and ``RemotePS``, the two implementations of ``api.PSLike``;
- ``service/``: a shard behind gRPC (codec, servicer, server, metrics) and its process;
- ``shard``: one shard, composed of the rooms below;
- ``saves/``: save files, loads, and the two phases around them;
- ``tier/``: the disk tier under a memory limit;
- ``engine/``: one sparse table in RAM and the dense vectors (numba, no I/O);
- the vocabulary every room speaks: ``validation`` (argument checks shared by the shard
  and the client), ``config`` (a shard's settings), ``api`` (``PSLike`` and its types),
  ``errors`` and ``sharding`` (key -> logical shard -> server);
- ``plumbing/``: what the worker and the operator use too (settings, launching a
  process, gRPC serving, TLS, the heap).
"""

__all__: list[str] = []
