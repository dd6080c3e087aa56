"""streamtrain workers: donefile-gated data, PS-backed embeddings, the model zoo and the
test-then-train loop.

Modules that the control plane imports (``data.layout``, ``data.batch``, ``metrics``,
``proto``, ``config``) never import torch; torch is imported only by the training modules.
"""

__all__: list[str] = []
