"""Metrics: the store that holds a run's records while it goes (live readers, the summary,
Ray's gauges); it writes them through :mod:`hetero_ray.runs`."""
