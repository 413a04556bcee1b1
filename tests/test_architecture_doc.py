"""docs/architecture.md's table of packages names every package and module at the top of
``hetero_ray/`` (a package as `name/`, a module as `name.py`): a newcomer finds each one's
job there, and a new one is documented when it is added."""

from __future__ import annotations

import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parent.parent


def _table_rows() -> str:
    text = (ROOT / "docs" / "architecture.md").read_text()
    section = text.split("## Each package's job", 1)[1].split("\n## ", 1)[0]
    return "\n".join(line.split("|")[1] for line in section.splitlines() if line.startswith("| `"))


def test_every_top_level_package_and_module_has_a_row():
    package = ROOT / "hetero_ray"
    entries = {f"{p.name}/" for p in package.iterdir() if (p / "__init__.py").exists()}
    entries |= {p.name for p in package.glob("*.py")}
    named = set(re.findall(r"`([A-Za-z_]+(?:/|\.py))`", _table_rows()))
    assert entries - named == set(), f"docs/architecture.md's table lacks {sorted(entries - named)}"
    assert named - entries <= {"hetero_ray_dashboards/", "dashboards/"}, f"the table names {sorted(named - entries)}"
