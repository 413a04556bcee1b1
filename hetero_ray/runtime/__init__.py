"""The Ray shell: connecting to a cluster, the named actors, the driver's orchestration."""
