"""``python -m streamtrain_ps``: one PS shard process (``process.main``).

Its imports (numba, gRPC) run with the garbage collector paused (``startup_gc``): a shard
restarted after a crash is serving again sooner.
"""

from streamtrain_ps.plumbing.startup_gc import collector_paused

with collector_paused():
    from streamtrain_ps.plumbing.grpc_serving import exit_now
    from streamtrain_ps.service.process import main

if __name__ == "__main__":
    exit_now(main())
