"""``python -m streamtrain_worker``: the worker process (``process.main``).

Its imports (torch above all) run with the garbage collector paused
(``streamtrain_ps.plumbing.startup_gc``): they are the longest part of a job's start-up.
"""

from streamtrain_ps.plumbing.startup_gc import collector_paused

with collector_paused():
    from streamtrain_ps.plumbing.grpc_serving import exit_now
    from streamtrain_worker.control.process import main

if __name__ == "__main__":
    exit_now(main())
