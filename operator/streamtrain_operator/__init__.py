"""streamtrain control plane, in four wings (``docs/architecture.md``): ``job`` (the pure job
model and pass scheduler), ``run`` (the driver that performs it), ``kube`` (the kopf operator)
and ``local`` (``streamtrain run`` on one machine); ``cli`` and ``main`` wire them up. Never
imports torch."""

__all__: list[str] = []
