"""streamtrain workers: donefile-gated data, PS-backed embeddings, the model zoo and the
test-then-train loop.

Rooms, top down: ``control`` (the worker process and its control service) and ``serving``
(the online predictor) over ``publishing`` (export, model folder, reference predictor) over
``training`` (the test-then-train loop) over ``models`` (the model zoo) over ``config`` over
``metrics`` and ``monitoring`` over ``data`` (the time-sliced layout) over ``proto``.

Modules that the control plane imports (``data.layout``, ``data.batch``, ``metrics``,
``proto``, ``config``) never import torch; torch is imported only by the training modules.
"""

__all__: list[str] = []
