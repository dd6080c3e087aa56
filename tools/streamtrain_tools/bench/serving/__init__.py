"""The online predictor's benchmark (``make bench-serving``) and the export folders it serves.

``run`` measures freshness, delta apply, latency, exactness and memory; ``models`` writes a
real export folder by hand (also used by the serving tests).
"""
