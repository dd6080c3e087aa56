"""Benchmarks behind ``make bench-*``; each prints one JSON object as its last line, and
``docs/benchmarks.md`` records results with the exact command."""
