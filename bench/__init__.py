"""Benchmarks: each prints its measurements side by side with a baseline from the same run."""
