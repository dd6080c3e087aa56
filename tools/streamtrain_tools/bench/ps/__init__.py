"""The parameter server's benchmarks: a shard's throughput, memory, load and cost.

``run`` (``make bench-ps``) one shard in and out of process; ``scale`` and ``capped`` the long
tail with and without a ``memoryLimit``; ``load`` concurrent clients; ``dense`` a dense push;
``disk_store`` the disk tier's store; ``tls_cost`` mutual TLS; ``wire_count`` the bytes a worker
exchanges; ``sizing`` the job sizing model built on these costs.
"""
