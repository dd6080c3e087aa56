"""The two implementations of ``streamtrain_ps.api.PSLike`` that everything above uses.

- ``local``: ``LocalPS``, in-process shards (tests, single-process training);
- ``remote``: ``RemotePS``, N shards over gRPC, with ``rpc`` (channels, fan-out, retries,
  codes mapped back to errors), ``dedup`` (keys deduplicated before the wire) and
  ``dense_push`` (a push's dense gradients sent straight from their arrays).
"""
