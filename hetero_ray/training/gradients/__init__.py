"""One device's gradient under unequal shares: the weighting hook, exact batch norm,
micro-batches, token weighting, precision, and the model's preparation that wires them."""
