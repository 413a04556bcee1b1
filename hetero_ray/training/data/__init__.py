"""Each rank's share of every global step: the plan-following loader, its front door, the
evaluation loader, and the Ray Data feed and shard."""
