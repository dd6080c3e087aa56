"""The worker process and its control service: what the pass scheduler talks to.

``process`` (``python -m streamtrain_worker``) starts the control server of ``service`` after
``warmup`` began loading the numba kernels; ``refusals`` names, as data the operator can
branch on, why the service refused or ended a call.
"""
