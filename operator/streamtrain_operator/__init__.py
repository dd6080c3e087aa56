"""streamtrain control plane: job spec, pass scheduler, launchers (Kubernetes and local
processes), kopf handlers and the ``streamtrain`` CLI. Never imports torch."""

__all__: list[str] = []
