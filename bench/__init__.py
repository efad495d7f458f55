"""Benchmarks (run as scripts; see docs/benchmarks.md)."""
