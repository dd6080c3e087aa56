"""Serving: published models delivered to an online table and scored online.

- ``versions`` (pure): a delivered model version, the delivery state, the guard.
- ``tables``: the versioned sparse tables, embedded (in-process) and Redis; a version's
  rows never change once written, so a request pinned to one version reads only it.
- ``delivery``: follows an export's donefile into a table, exactly once, guarded.
- ``server``: ``streamtrain serve`` (KServe v2 HTTP/JSON and gRPC), ``streamtrain deliver``.

docs/serving.md describes the layout, the guarantees and the operations.
"""
