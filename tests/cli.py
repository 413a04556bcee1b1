"""Running the real CLI entry point in-process, as a user's shell would."""

from __future__ import annotations


def run_cli(argv: list[str], capsys) -> tuple[int, str, str]:
    """``hetero-ray ARGV``: (exit code, stdout, stderr). argparse's own exits count too."""
    from hetero_ray.cli.main import main

    try:
        code = main(argv)
    except SystemExit as e:
        code = e.code
    captured = capsys.readouterr()
    return code, captured.out, captured.err
