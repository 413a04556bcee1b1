"""What the subcommands' parsers share. The flag parsers themselves (``"40,24"`` →
``[40, 24]``) live in :mod:`hetero_ray.flags`, below the configurations that name them."""

from __future__ import annotations

import argparse


class ErrorExitParser(argparse.ArgumentParser):
    """argparse exits with code 2 on bad flags already; this adds the hint to --help."""

    def error(self, message: str):
        self.print_usage()
        self.exit(2, f"{self.prog}: error: {message}\n(see {self.prog} --help)\n")
