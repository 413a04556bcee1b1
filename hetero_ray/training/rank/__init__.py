"""One rank's run: its session, the entry around the user's loop, the step in progress, its
identity, the plan switch, records, reports, rejoining, and the replica state rank 0 hands out."""
