"""Benchmarks behind ``make bench-*``; each prints one JSON object as its last line, and
``docs/benchmarks.md`` records results with the exact command.

Rooms by what they measure: ``ps`` (a shard), ``worker`` (training, parsing, end to end),
``quality`` (model quality against other learners), ``serving`` (the online predictor) and
``peer`` (ours against PaddlePaddle's parameter server). ``python -m
streamtrain_tools.bench.ROOM`` runs a room's headline benchmark (its ``run`` module).
"""
