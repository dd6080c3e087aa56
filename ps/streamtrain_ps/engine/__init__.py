"""The in-memory model: one sparse table's hash index, compact row slabs and update rules,
and the dense vectors. Pure array code over numba kernels; no I/O, no gRPC.

- ``index``: uint64 key -> row; ``address_space``: arrays that grow in place;
- ``slabs``, ``packed``: the compact rows and their packed word;
- ``accessor``, ``optim``, ``kernels``: the row layout and CTR rules, the update rules,
  and the nogil batch kernels (pull, push, shrink, save snapshots);
- ``table``, ``table_lock``: one sparse table and who may run with whom on it;
- ``table_saves``, ``snapshot``: what a save reads from and commits to a table;
- ``push_errors``: a refused push, named by field and entry;
- ``dense``: the dense network's vectors and summed statistics.
"""
