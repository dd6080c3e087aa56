"""The run loop: the ``driver`` performs the scheduler's actions against the PS shards and
the workers (``connection``, ``worker_client``), publishes models (``export``) and stores
progress (``state``). Shared by Kubernetes (``kube``) and local mode (``local``)."""
