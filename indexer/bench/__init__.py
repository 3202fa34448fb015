"""Benchmarks (``python -m indexer bench``): timed with device events, never in unit tests."""
