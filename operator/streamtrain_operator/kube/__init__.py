"""The Kubernetes side: kopf ``handlers``, the per-job ``daemon`` around the driver, the
desired children (``desired``, ``resources``), the custom resource's ``status``, operator
``metrics`` and the one API client (``api``). Independent of ``local``."""
