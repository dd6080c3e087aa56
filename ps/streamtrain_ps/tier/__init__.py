"""The disk tier: a table's coldest keys on an embedded RocksDB past ``memoryLimit``.

- ``tiering``, ``tiered_saves``: a sparse table with a disk tier (``TieredTable``) and its
  save side, which covers the disk rows;
- ``tier_kernels``, ``demotion_order``, ``compaction``: which RAM rows leave, moving them,
  and giving their pages back;
- ``disk_rows``, ``disk_store``, ``disk_filter``: full rows, their RocksDB store, and the
  in-RAM filter of the keys on disk;
- ``memory_limit``, ``memory_feedback``, ``request_gate``: the memory cap's split, what
  the process holds beyond it, and how many requests a capped shard serves at once;
- ``memory_plan``: the one place the cap sizes a shard's parts (store, slabs, gate);
- ``warmup``: the engine's and tier's kernels loaded beside the start-up.
"""
