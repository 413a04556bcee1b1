"""The built-in job that ``hetero-ray train`` runs: its models, datasets, loop, optimiser
schedule, evaluation and checkpoint format, and the checks it makes before a run.

It is a user of the worker API (:mod:`hetero_ray.train`), as the examples are; the
worker runtime below it (:mod:`hetero_ray.training`) knows nothing of it.
"""
