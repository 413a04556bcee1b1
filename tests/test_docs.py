"""The documentation's links and commands: every relative link in the README, CHANGELOG,
docs/, cluster_configs/README.md and examples/README.md reaches a file (and, for
``#anchor``, a heading of that file), and every command line in their shell blocks parses
with the CLI it names; examples/README.md lists every example. No Ray: the ``hetero-ray``
lines are parsed by the real argument parser in this process, and each distinct command's
``--help`` runs as a user would run it."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys

import pytest

from hetero_ray.cli.main import build_parser

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOCS = os.path.join(REPO_ROOT, "docs")
PAGES = sorted(
    [os.path.join(REPO_ROOT, name) for name in ("README.md", "CHANGELOG.md")]
    + [os.path.join(REPO_ROOT, "cluster_configs", "README.md"), os.path.join(REPO_ROOT, "examples", "README.md")]
    + [os.path.join(DOCS, name) for name in os.listdir(DOCS) if name.endswith(".md")]
)
COMMAND_LANGUAGES = {"bash", "sh", "console", "shell"}
FENCE = re.compile(r"^```([\w-]*)\s*$")
LINK = re.compile(r"!?\[(?:[^\]`]|`[^`]*`)*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
INLINE_CODE = re.compile(r"`[^`\n]*`")


def _read(path: str) -> str:
    with open(path, encoding="utf-8") as f:
        return f.read()


def split_fences(text: str) -> tuple[list[str], list[tuple[str, list[str]]]]:
    """The prose lines, and each fenced block as (language, lines)."""
    prose, blocks, current = [], [], None
    for line in text.splitlines():
        match = FENCE.match(line.strip())
        if current is None and match:
            current = (match.group(1).lower(), [])
        elif current is not None and line.strip() == "```":
            blocks.append(current)
            current = None
        elif current is not None:
            current[1].append(line)
        else:
            prose.append(line)
    assert current is None, "a code block is not closed"
    return prose, blocks


def github_anchors(text: str) -> set[str]:
    """The anchors GitHub gives a file's headings: lower case, punctuation dropped, spaces
    as '-', a repeated heading numbered (-1, -2, …)."""
    prose, _ = split_fences(text)
    anchors: set[str] = set()
    seen: dict[str, int] = {}
    for line in prose:
        match = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if not match:
            continue
        slug = re.sub(r"[^\w\- ]", "", match.group(1).lower()).replace(" ", "-")
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        anchors.add(slug if count == 0 else f"{slug}-{count}")
    return anchors


def relative_links(path: str) -> list[str]:
    prose, _ = split_fences(_read(path))
    text = INLINE_CODE.sub("", "\n".join(prose))
    return [target for target in LINK.findall(text)
            if not re.match(r"^[a-z][a-z0-9+.-]*:", target)]  # http:, https:, mailto: …


def test_the_pages_are_found():
    names = {os.path.relpath(p, REPO_ROOT) for p in PAGES}
    assert {"README.md", "CHANGELOG.md", "docs/api.md", "docs/benchmarks.md", "docs/clusters.md"} <= names


@pytest.mark.parametrize("page", PAGES, ids=lambda p: os.path.relpath(p, REPO_ROOT))
def test_every_relative_link_resolves(page):
    broken = []
    for target in relative_links(page):
        file_part, _, anchor = target.partition("#")
        resolved = os.path.normpath(os.path.join(os.path.dirname(page), file_part)) if file_part else page
        if not os.path.exists(resolved):
            broken.append(f"{target}: no {os.path.relpath(resolved, REPO_ROOT)}")
        elif anchor and resolved.endswith(".md") and anchor not in github_anchors(_read(resolved)):
            broken.append(f"{target}: no heading #{anchor} in {os.path.relpath(resolved, REPO_ROOT)}")
    assert not broken, f"{os.path.relpath(page, REPO_ROOT)}: broken links:\n" + "\n".join(broken)


def test_the_link_checker_catches_a_broken_link(tmp_path):
    """The checks above can fail: a missing file and a missing heading are both seen."""
    page = tmp_path / "page.md"
    page.write_text("# Title\n\n[ok](#title) [gone](missing.md) [no heading](#nowhere)\n"
                    "```bash\n[not a link](ignored.md)\n```\n")
    assert relative_links(str(page)) == ["#title", "missing.md", "#nowhere"]
    assert github_anchors(page.read_text()) == {"title"}


def command_lines(page: str) -> list[list[str]]:
    """The command lines of a page's shell blocks that run hetero_ray: ``hetero-ray …``,
    ``python -m hetero_ray …``, ``python jobs/….py …``, ``python examples/….py …``, also
    after ``ray job submit … --`` (a line ending in ``\\`` continues on the next; comments
    are dropped)."""
    _, blocks = split_fences(_read(page))
    commands = []
    for language, lines in blocks:
        if language not in COMMAND_LANGUAGES:
            continue
        joined, pending = [], ""
        for line in lines:
            line = line.removeprefix("$ ")
            if line.rstrip().endswith("\\"):
                pending += line.rstrip()[:-1] + " "
                continue
            joined.append(pending + line)
            pending = ""
        for line in joined:
            words = shlex.split(line, comments=True)
            if words[:3] == ["ray", "job", "submit"] and "--" in words:
                words = words[words.index("--") + 1:]
            if words[:1] == ["hetero-ray"] or words[:3] == ["python", "-m", "hetero_ray"] or (
                    words[:1] == ["python"] and len(words) > 1
                    and re.match(r"^(jobs|examples)/\w+\.py$", words[1])):
                commands.append(words)
    return commands


README = os.path.join(REPO_ROOT, "README.md")


def test_examples_readme_lists_every_example():
    listed = _read(os.path.join(REPO_ROOT, "examples", "README.md"))
    scripts = sorted(n for n in os.listdir(os.path.join(REPO_ROOT, "examples")) if n.endswith(".py"))
    missing = [n for n in scripts if f"]({n})" not in listed or f"python examples/{n}" not in listed]
    assert not missing, f"examples/README.md lacks a row and a command for: {', '.join(missing)}"


def test_the_readme_has_commands_to_check():
    commands = command_lines(README)
    assert any(words[0] == "hetero-ray" and words[1] == "train" for words in commands)


def _cli_args(words: list[str]) -> list[str]:
    """``hetero-ray``'s arguments for a line that runs it (jobs/train.py is ``train``)."""
    if words[0] == "hetero-ray":
        return words[1:]
    if words[:3] == ["python", "-m", "hetero_ray"]:
        return words[3:]
    return ["train", *words[2:]] if words[1] == "jobs/train.py" else []


@pytest.mark.parametrize("page", PAGES, ids=lambda p: os.path.relpath(p, REPO_ROOT))
def test_every_hetero_ray_line_parses(page):
    """Each line's flags are parsed by the real parser (nothing runs)."""
    failures = []
    for words in command_lines(page):
        args = _cli_args(words)
        if not args or "--help" in args or "-h" in args:
            continue  # the --help test below runs it
        try:
            build_parser().parse_args(args)
        except SystemExit as e:
            failures.append(f"{' '.join(words)}: exit {e.code}")
    assert not failures, "command lines that do not parse:\n" + "\n".join(failures)


def _help_commands() -> list[list[str]]:
    distinct = set()
    for page in PAGES:
        for words in command_lines(page):
            if words[0] == "hetero-ray" or words[:3] == ["python", "-m", "hetero_ray"]:
                distinct.add(("-m", "hetero_ray.cli.main", _cli_args(words)[0]))
            else:
                distinct.add((words[1],))
    return [list(c) for c in sorted(distinct)]


@pytest.mark.parametrize("command", _help_commands(), ids=" ".join)
def test_every_documented_cli_answers_help(command):
    result = subprocess.run([sys.executable, *command, "--help"], cwd=REPO_ROOT, capture_output=True, text=True,
                            timeout=300, env={**os.environ, "PYTHONPATH": REPO_ROOT})
    assert result.returncode == 0, result.stderr
    assert "usage:" in result.stdout
    if command[0].startswith("examples/"):  # an example runs standalone, as a Ray job, and can ask for GPUs
        assert "--global-batch-size" in result.stdout and "ray job submit --working-dir ." in result.stdout
        assert "--use-gpu" in result.stdout and "--worker-devices" in result.stdout


def test_every_example_is_documented():
    """So that the check above runs every example's --help."""
    examples = {f"examples/{name}" for name in os.listdir(os.path.join(REPO_ROOT, "examples"))
                if name.endswith(".py") and not name.startswith("_")}
    assert examples <= {command[0] for command in _help_commands()}


def test_the_readme_is_read_in_five_minutes():
    """At most 300 lines: the detail lives in docs/, linked from the README."""
    lines = _read(README).count("\n")
    assert lines <= 300, f"README.md has {lines} lines; move detail to docs/ (at most 300)"


@pytest.mark.parametrize("page", [p for p in PAGES if not p.endswith("CHANGELOG.md")],
                         ids=lambda p: os.path.relpath(p, REPO_ROOT))
def test_no_page_teaches_an_old_flag(page):
    """The pages show the current flags; the old spellings (still accepted) are listed in
    docs/cli.md only. The changelog keeps the words of its time."""
    from hetero_ray.cli.reference import deprecated_aliases, subcommand_parsers

    old = {alias: new for parser in subcommand_parsers().values() for alias, new in deprecated_aliases(parser)}
    found = [f"{' '.join(words)}: {word} (now {old[word.split('=')[0]]})" for words in command_lines(page)
             for word in words if word.split("=")[0] in old]
    assert not found, "\n".join(found)
