"""The worker's benchmarks: training speed, parsing and the whole system end to end.

``run`` (``make bench-worker``) plain PyTorch against the PS path in process and over gRPC;
``e2e`` (``make bench-e2e``) a job through ``streamtrain run``; ``parse`` and ``quoting`` the
reader; ``read_ahead`` a pass's fixed cost; ``long_tail`` a stream whose table fits no cache.
"""
