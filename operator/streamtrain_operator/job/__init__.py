"""The job model, pure: what a ``StreamingTrainingJob`` says (``spec``, composed of the
sections each package declares with ``streamtrain_ps.plumbing.settings``), how it is cut into
passes (``plan``), the pass state machine (``scheduler``), its progress record
(``progress``) and the component configs derived from it (``render``).

Nothing here does I/O: no gRPC, no Kubernetes, no files (enforced by import-linter).
"""
