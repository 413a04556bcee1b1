"""``hetero-ray report``: a self-contained HTML file and a text summary; bad input → exit 2."""

from __future__ import annotations

import os
import re
import shutil

import pytest

from tests.cli import run_cli
from tests.helpers import write_run


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("runs")
    static = write_run(root / "static", policy="static")
    optimal = write_run(root / "optimal", policy="optimal", batches=(7, 1), decisions=True,
                        reason="<script>alert('x')</script> gain 9 %")
    running = write_run(root / "running", finish=False)
    return static, optimal, running


def own_copy(run_dir: str, tmp_path) -> str:
    """A copy of a module run for a test whose report lands in the run directory itself;
    the module's runs stay as written."""
    return str(shutil.copytree(run_dir, tmp_path / os.path.basename(run_dir)))


def test_one_run_report_is_self_contained_html(runs, capsys, tmp_path):
    static = own_copy(runs[0], tmp_path)
    code, out, err = run_cli(["report", static], capsys)
    path = os.path.join(static, "report.html")
    assert code == 0 and err == "" and f"report: {path}" in out
    html = open(path, encoding="utf-8").read()
    assert html.startswith("<!doctype html>") and "static" in html
    assert len(html) > 1_000_000  # plotly.js is inside, once
    assert html.count("Plotly.newPlot") >= 8
    # Nothing is fetched when it is opened: no external scripts, styles or fonts.
    assert not re.search(r'<(script|link)[^>]+(src|href)="https?://', html)
    assert "Cluster samples" in html and "Ranks (recent steps)" in html


def test_report_prints_the_text_summary(runs, capsys, tmp_path):
    static = own_copy(runs[0], tmp_path)
    code, out, _ = run_cli(["report", static], capsys)
    assert code == 0 and "== static" in out


def test_quiet_report_says_only_where_it_went(runs, capsys, tmp_path):
    static, optimal, _ = runs
    out_file = tmp_path / "both.html"
    code, out, _ = run_cli(["report", "--quiet", static, optimal, "--out", str(out_file)], capsys)
    assert code == 0 and out.strip() == f"report: {out_file}"


def test_report_of_a_run_still_going_builds_its_summary_from_the_tables(runs, capsys, tmp_path):
    _, _, running = runs
    out_file = tmp_path / "running.html"
    code, out, _ = run_cli(["report", running, "--out", str(out_file)], capsys)
    assert code == 0 and out_file.exists()
    assert "40 steps" in out and "policy static" in out


def test_several_runs_are_compared(runs, capsys, tmp_path):
    static, optimal, _ = runs
    out_file = tmp_path / "compare.html"
    code, out, _ = run_cli(["report", static, optimal, "--out", str(out_file)], capsys)
    html = out_file.read_text(encoding="utf-8")
    assert code == 0 and "<h2>Comparison</h2>" in html and "Time to accuracy" in html
    assert "steady samples/s" in out and "optimal" in out  # the comparison table on stdout
    # Text from the run files is escaped, never markup.
    assert "<script>alert" not in html and "&lt;script&gt;alert" in html


@pytest.mark.parametrize("make_bad, message", [
    (lambda tmp: str(tmp / "missing"), "is not a folder"),
    (lambda tmp: str(tmp), "is not a run directory"),
])
def test_a_bad_run_dir_is_a_user_error(tmp_path, capsys, make_bad, message):
    code, out, err = run_cli(["report", make_bad(tmp_path)], capsys)
    assert code == 2 and message in err and "report.html" not in os.listdir(tmp_path)


def test_a_bad_output_folder_is_a_user_error(runs, capsys, tmp_path):
    static, _, _ = runs
    code, _, err = run_cli(["report", static, "--out", str(tmp_path / "nope" / "r.html")], capsys)
    assert code == 2 and "does not exist" in err


def test_report_files_are_written_atomically(runs, capsys, tmp_path):
    static = own_copy(runs[0], tmp_path)
    before = set(os.listdir(static))
    code, _, err = run_cli(["report", static], capsys)
    assert code == 0, err
    # The whole report under its own name, and no temporary file left beside it.
    assert set(os.listdir(static)) - before == {"report.html"}
    with open(os.path.join(static, "report.html"), encoding="utf-8") as f:
        assert f.read().rstrip().endswith("</html>")
