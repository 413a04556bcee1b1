"""The reference part of ``docs/cli.md``, written from the parsers themselves: every command,
every flag, its default and its help, so the page cannot fall behind ``--help``.

    python -m hetero_ray.cli.reference docs/cli.md           # rewrite the generated block
    python -m hetero_ray.cli.reference --check docs/cli.md   # exit 1 if it is out of date

Only the text between :data:`BEGIN` and :data:`END` is written; the prose around it is
the page's own. ``tests/test_cli_docs.py`` regenerates the block in memory and names the
command and flag that drifted.
"""

from __future__ import annotations

import argparse
import re
import sys
from typing import Optional, Sequence

from hetero_ray.cli.main import SUBCOMMANDS, build_parser
from hetero_ray.flags import DeprecatedFlag

REGENERATE = "python -m hetero_ray.cli.reference docs/cli.md"
BEGIN = f"<!-- BEGIN generated from the parsers by `{REGENERATE}`; edit the parsers, not this block -->"
END = "<!-- END generated -->"


def subcommand_parsers(parser: Optional[argparse.ArgumentParser] = None) -> dict[str, argparse.ArgumentParser]:
    """Each command's parser, in the order ``hetero-ray --help`` lists them."""
    parser = parser or build_parser()
    for action in parser._actions:  # argparse keeps the subcommands in this action only
        if isinstance(action, argparse._SubParsersAction):
            return {name: action.choices[name] for name in SUBCOMMANDS if name in action.choices}
    return {}


def flag_rows(parser: argparse.ArgumentParser) -> list[tuple[Optional[str], list[tuple[str, str, str]]]]:
    """The parser's arguments by group, as (group title or None, [(flag, default, help)]).

    The parser's own groups (positional arguments, options) have no title here: their
    names differ between Python versions; ``--help`` itself is left out.
    """
    own = (parser._positionals, parser._optionals)
    groups = [(None, [action for group in own for action in group._group_actions])]
    groups += [(group.title, group._group_actions) for group in parser._action_groups if group not in own]
    return [(title, rows) for title, actions in groups
            if (rows := [_row(parser, a) for a in actions
                         if not isinstance(a, argparse._HelpAction) and a.help is not argparse.SUPPRESS])]


def deprecated_aliases(parser: argparse.ArgumentParser) -> list[tuple[str, str]]:
    """The parser's old spellings of flags, as (old, new): accepted with a message, hidden from --help."""
    return [(flag, action.use) for action in parser._actions if isinstance(action, DeprecatedFlag)
            for flag in action.option_strings]


def _row(parser: argparse.ArgumentParser, action: argparse.Action) -> tuple[str, str, str]:
    text = action.help % {"default": action.default, "prog": parser.prog} if action.help else ""
    # A default --help shows as a closing "(default X)" moves to its own column, as shown.
    shown = re.search(r"\s*\(default ([^\s():]+)\)$", text)
    if shown and not action.required:
        return _invocation(action), f"`{shown.group(1)}`", text[:shown.start()]
    return _invocation(action), _default(action), text


def _invocation(action: argparse.Action) -> str:
    """How the argument is written: ``--flag METAVAR``, ``--switch``, or ``NAME [NAME ...]``."""
    if not action.option_strings:
        name = action.metavar or action.dest
        return {"+": f"{name} [{name} ...]", "*": f"[{name} ...]", "?": f"[{name}]"}.get(action.nargs, name)
    flag = ", ".join(action.option_strings)
    if action.nargs == 0:
        return flag
    if action.metavar is not None:
        metavar = action.metavar
    elif action.choices:
        metavar = "{" + ",".join(map(str, action.choices)) + "}"
    else:
        metavar = action.dest.upper()
    return f"{flag} {metavar}"


def _default(action: argparse.Action) -> str:
    """The default of an argument whose help does not show it: ``required``, the value, or
    empty (a switch, a positional, or nothing set unless given)."""
    if action.required and action.option_strings:
        return "required"
    value = action.default
    if action.nargs == 0 or value is None or value is argparse.SUPPRESS or not action.option_strings:
        return ""
    if isinstance(value, (list, tuple)):
        value = ",".join(map(str, value))
    return f"`{value}`"


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def reference_markdown(parser: Optional[argparse.ArgumentParser] = None) -> str:
    """The generated block, markers included."""
    commands = subcommand_parsers(parser)
    lines = [BEGIN, "", "## Reference: every command and flag", "",
             f"The {len(commands)} commands and every flag, from the parsers `--help` prints "
             "(`-h`/`--help` on each is left out). A flag with no default is unset unless given; "
             "a switch is off unless given.", ""]
    for name, sub in commands.items():
        lines += [f"### `hetero-ray {name}`", "", _cell(sub.description or ""), ""]
        for title, rows in flag_rows(sub):
            if title:
                lines += [f"*{title}*", ""]
            lines += ["| flag | default | what it does |", "|---|---|---|"]
            lines += [f"| `{_cell(flag)}` | {_cell(default)} | {_cell(text)} |" for flag, default, text in rows]
            lines.append("")
        aliases = deprecated_aliases(sub)
        if aliases:
            lines += ["Old spellings, still accepted with a deprecation message on stderr: "
                      + ", ".join(f"`{old}` (now `{new}`)" for old, new in aliases) + ".", ""]
    lines.append(END)
    return "\n".join(lines) + "\n"


def replace_block(page: str, block: str) -> str:
    """``page`` with its generated block replaced by ``block`` (appended if it has none)."""
    start, end = page.find(BEGIN), page.find(END)
    if start < 0 or end < 0:
        return page.rstrip("\n") + "\n\n" + block
    return page[:start] + block.rstrip("\n") + page[end + len(END):]


def generated_block(page: str) -> str:
    """The page's generated block as it stands (empty if it has none)."""
    start, end = page.find(BEGIN), page.find(END)
    return page[start:end + len(END)] + "\n" if start >= 0 and end >= 0 else ""


def drift(page: str, block: Optional[str] = None) -> list[str]:
    """What differs between the page's generated block and ``block`` (default: the parsers'
    now), one line per command or flag, named: ``hetero-ray train --lr: …``."""
    block = block if block is not None else reference_markdown()
    documented, current = _rows(generated_block(page)), _rows(block)
    if not documented:
        return [f"no generated block ({BEGIN!r} … {END!r})"]
    problems = []
    for key in current.keys() | documented.keys():
        name = " ".join(filter(None, key))
        if key not in documented:
            problems.append(f"{name}: missing from the page")
        elif key not in current:
            problems.append(f"{name}: on the page, but the parser has no such {'flag' if key[1] else 'command'}")
        elif documented[key] != current[key]:
            problems.append(f"{name}: the page says {documented[key]!r}, the parser {current[key]!r}")
    if not problems and block.strip() != generated_block(page).strip():
        problems.append("the block's text around the tables differs")
    return sorted(problems)


def _rows(block: str) -> dict[tuple[str, str], str]:
    """A generated block's commands and flags: (``hetero-ray CMD``, flag) → its row; the
    command itself under (``hetero-ray CMD``, "") → its description and groups."""
    rows: dict[tuple[str, str], str] = {}
    command = ""
    for line in block.splitlines():
        heading = re.match(r"^### `(hetero-ray \S+)`$", line)
        if heading:
            command = heading.group(1)
            rows[(command, "")] = ""
        elif command and line.startswith("| `"):
            flag = re.match(r"^\| `((?:[^`\\]|\\.)*?)`", line).group(1).split(" ")[0]
            rows[(command, flag)] = line
        elif command and line.strip() and not line.startswith("|"):
            rows[(command, "")] += line.strip() + " "
    return rows


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m hetero_ray.cli.reference", description=__doc__.split("\n\n")[0])
    parser.add_argument("page", help="the Markdown page whose generated block to write (docs/cli.md)")
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 if the block is out of date")
    args = parser.parse_args(argv)
    with open(args.page, encoding="utf-8") as f:
        page = f.read()
    new = replace_block(page, reference_markdown())
    if args.check:
        problems = drift(page)
        if problems:
            print(f"{args.page} is out of date:\n  " + "\n  ".join(problems)
                  + f"\nregenerate it with: {REGENERATE}", file=sys.stderr)
            return 1
        return 0
    if new != page:
        with open(args.page, "w", encoding="utf-8") as f:
            f.write(new)
        print(f"written: {args.page}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
