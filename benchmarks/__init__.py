"""Benchmarks that print figures and ratios (not timed tests: those flake on shared machines)."""
