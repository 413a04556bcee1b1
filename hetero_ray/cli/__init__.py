"""The ``hetero-ray`` command line: one module per subcommand."""
