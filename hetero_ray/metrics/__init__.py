"""Metrics: the records workers produce, the store that holds them, the files they end in."""
