"""``hetero-ray report RUN_DIR [RUN_DIR ...] [--out FILE]``: an HTML report and a text summary.

    hetero-ray report runs/my-run                         # → runs/my-run/report.html
    hetero-ray report runs/static runs/optimal --out cmp.html   # side by side
"""

from __future__ import annotations

import argparse

HELP = "write a self-contained HTML report of one or more runs and print their summary"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_dirs", nargs="+", metavar="RUN_DIR", help="run directories (STORAGE_PATH/NAME)")
    parser.add_argument("--out", help="HTML file to write (default RUN_DIR/report.html for one run, "
                                      "hetero_ray_report.html here for several)")
    parser.add_argument("--quiet", action="store_true", help="print only where the report went, not the summary")


def run(args: argparse.Namespace) -> int:
    from hetero_ray.reporting.html_report import check_run_dir, compare_text, summary_text, write_report

    for run_dir in args.run_dirs:  # all bad input before any work
        check_run_dir(run_dir)
    path, runs = write_report(args.run_dirs, args.out)
    if not args.quiet:
        for loaded in runs:
            print(summary_text(loaded))
            print()
        if len(runs) > 1:
            print(compare_text(runs))
            print()
    print(f"report: {path}")
    return 0
