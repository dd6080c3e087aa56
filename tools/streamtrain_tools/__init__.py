"""Tools around the product, never imported by it: the demo (``make demo``), the real data
samples laid out as a stream (``samples``), CRD and reference generation (``crdgen``,
``crdref``) and the benchmarks (``bench``)."""
