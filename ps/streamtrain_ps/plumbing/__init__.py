"""Process plumbing every streamtrain package shares: the PS, the worker and the operator.

Nothing here knows about sparse tables; it is the bottom of the house, and the worker's and
the operator's processes use it as much as the shard does (``docs/decisions.md``, "Where the
shared plumbing lives"):

- ``settings``: declaring a setting once and parsing, checking and describing it from there;
- ``launch``: the one child-process launcher (start, read the start-up line, stop);
- ``startup``: the start-up line a server prints (``listening on HOST:PORT``);
- ``startup_gc``: a server's imports with the garbage collector paused;
- ``grpc_serving``: the gRPC server skeleton of the PS shard and the worker;
- ``request_budget``: a server's cap on the request bytes it holds at once;
- ``tls``: optional TLS between PS clients and shards;
- ``storage``: a URL's file system and the one durable write (temp, fsync, rename; or a PUT);
- ``heap``: the process heap (glibc ``malloc_trim`` and the large-buffer threshold).
"""
