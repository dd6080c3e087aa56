"""Model quality: streamtrain against Vowpal Wabbit and plain PyTorch on the same streams.

``run`` (``make bench-quality``) scores the ``learners`` on the ``streams``; ``reference`` is
the single-process PyTorch side of ``make bench-e2e``'s quality protocol.
"""
