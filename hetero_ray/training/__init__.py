"""The code that runs inside each training worker: models, data, gradient weighting, timing, checkpoints."""
