"""Training one worker's share of a pass: the test-then-train loop and what feeds it.

``train`` (the ``Trainer``) over ``embedding`` (the PS-backed embedding, pooled by
``pooling``) and ``pipeline`` (prefetch, push and dense refresh beside the compute);
``read_ahead`` reads the next pass's files while this one trains.
"""
