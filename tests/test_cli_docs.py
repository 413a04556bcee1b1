"""docs/cli.md's reference is the parsers' own: regenerated in memory, it must match the
page, and a difference is named by command and flag with the command that rewrites it.
Every ``hetero-ray COMMAND`` the README, the docs, the changelog and the examples name is a
command the CLI has. No Ray; the parsers are built in this process."""

from __future__ import annotations

import os
import re

import pytest

from hetero_ray.cli.main import SUBCOMMANDS
from hetero_ray.flags import DeprecatedFlag
from hetero_ray.cli.reference import (
    BEGIN, END, REGENERATE, drift, reference_markdown, replace_block, subcommand_parsers,
)

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CLI_PAGE = os.path.join(REPO_ROOT, "docs", "cli.md")
COMMAND = re.compile(r"hetero-ray ([a-z][a-z_-]*(?:/[a-z][a-z_-]*)*)")  # also "hetero-ray train/profile"


def _read(path: str) -> str:
    with open(path, encoding="utf-8") as f:
        return f.read()


def test_docs_cli_reference_matches_the_parsers():
    problems = drift(_read(CLI_PAGE))
    assert not problems, ("docs/cli.md's reference has drifted from the parsers:\n  " + "\n  ".join(problems)
                          + f"\nregenerate it with: {REGENERATE}")


def test_the_reference_has_every_command_and_flag():
    block = reference_markdown()
    commands = subcommand_parsers()
    assert set(commands) == set(SUBCOMMANDS)
    for name, parser in commands.items():
        assert f"### `hetero-ray {name}`" in block
        section = block.split(f"### `hetero-ray {name}`")[1].split("### ")[0]
        for action in parser._actions:
            for flag in action.option_strings:
                if isinstance(action, DeprecatedFlag):  # an old spelling: named beside its new one
                    assert f"`{flag}` (now `{action.use}`)" in section, (name, flag)
                elif flag not in ("-h", "--help"):
                    assert f"| `{flag}" in section, (name, flag)


@pytest.mark.parametrize("flag, default", [
    ("--lr LR", "`0.05`"), ("--max-steps MAX_STEPS", ""), ("--plan-changes STEP:B0,B1,...", ""),
    ("--num-workers N\\|MIN-MAX", "`2`"), ("--batch-sizes B1,B2,...", "`8,16,32,64`"),
    ("--profile FILE", "required"), ("--port PORT", "`8050`"), ("--quiet", ""),
])
def test_flags_once_left_out_are_there_with_their_defaults(flag, default):
    assert f"| `{flag}` | {default} |" in _read(CLI_PAGE)


def test_drift_is_named_by_command_and_flag():
    page = replace_block("# CLI\n\nprose\n", reference_markdown())
    assert drift(page) == []
    stale = (page.replace("| `--lr LR` | `0.05` |", "| `--lr LR` | `0.1` |")
             .replace("| `--quiet` |", "| `--silent` |")
             .replace("| `--ram-fraction RAM_FRACTION` |", "| `--ram-fraction RAM_FRACTION` | x |"))
    stale = re.sub(r"\| `--seed SEED` .*\n", "", stale)
    problems = drift(stale)
    assert any(p.startswith("hetero-ray train --lr: the page says") for p in problems), problems
    assert "hetero-ray train --seed: missing from the page" in problems
    assert "hetero-ray report --quiet: missing from the page" in problems
    assert "hetero-ray report --silent: on the page, but the parser has no such flag" in problems
    assert any(p.startswith("hetero-ray profile --ram-fraction:") for p in problems), problems
    assert drift("# CLI\n") == [f"no generated block ({BEGIN!r} … {END!r})"]


def test_the_prose_around_the_block_is_kept():
    page = replace_block("# Title\n\nintro\n\n" + BEGIN + "\nold\n" + END + "\n\n## After\n", reference_markdown())
    assert page.startswith("# Title\n\nintro\n\n" + BEGIN)
    assert page.endswith(END + "\n\n## After\n")


def _pages_naming_commands() -> list[str]:
    pages = [os.path.join(REPO_ROOT, name) for name in ("README.md", "CHANGELOG.md")]
    pages.append(os.path.join(REPO_ROOT, "cluster_configs", "README.md"))
    for folder, suffixes in (("docs", (".md",)), ("examples", (".md", ".py"))):
        root = os.path.join(REPO_ROOT, folder)
        pages += [os.path.join(root, n) for n in sorted(os.listdir(root)) if n.endswith(suffixes)]
    return pages


def test_the_readme_names_the_commands():
    named = {c for m in COMMAND.findall(_read(os.path.join(REPO_ROOT, "README.md"))) for c in m.split("/")}
    assert {"train", "profile", "plan", "dashboard", "report"} <= named


@pytest.mark.parametrize("page", _pages_naming_commands(), ids=lambda p: os.path.relpath(p, REPO_ROOT))
def test_every_named_command_exists(page):
    wrong = []
    for number, line in enumerate(_read(page).splitlines(), 1):
        for match in COMMAND.findall(line):
            wrong += [f"{os.path.relpath(page, REPO_ROOT)}:{number}: hetero-ray {name}"
                      for name in match.split("/") if name not in SUBCOMMANDS]
    assert not wrong, (f"commands hetero-ray does not have (it has {', '.join(SUBCOMMANDS)}):\n"
                       + "\n".join(wrong))
