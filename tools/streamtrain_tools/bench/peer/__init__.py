"""Ours against the peer (PaddlePaddle's parameter server) on one box: ``make bench-peer``.

``run`` alternates the sides; ``trainer`` is the peer's side (run under the peer's own
interpreter) and ``pipe`` the text feed its dataset reads (standard library only, run by path).
"""
