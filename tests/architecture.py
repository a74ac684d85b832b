"""The house as Python imports it: the package laid out as it is installed, its import-linter
contracts, and the picture of its import graph in docs/layout.md.

pyproject.toml maps `queuectl` onto toolkit/, jobs/, migrations/, sql/ and bench/, which
import-graph tools cannot follow in a checkout; `lay_out` copies the installed packages'
modules into one folder the way `pip install .` places them (bench/lab/ is not a package, so
it is not copied, as it is not installed).

    python tests/architecture.py lint     # lint-imports over the laid-out package
    python tests/architecture.py graph    # rewrite the picture in docs/layout.md
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import tomllib
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PYPROJECT = ROOT / "pyproject.toml"
LAYOUT_PAGE = ROOT / "docs" / "layout.md"
BEGIN, END = "<!-- import-graph:begin -->", "<!-- import-graph:end -->"


def lay_out(dest: Path) -> Path:
    """Copy every module of the packages pyproject.toml installs into dest, as installed."""
    setup = tomllib.loads(PYPROJECT.read_text())["tool"]["setuptools"]
    mapping = setup["package-dir"]
    for package in setup["packages"]:
        parts = package.split(".")
        for cut in range(len(parts), 0, -1):
            if ".".join(parts[:cut]) in mapping:
                source = ROOT / mapping[".".join(parts[:cut])] / Path(*parts[cut:])
                break
        target = dest.joinpath(*parts)
        target.mkdir(parents=True, exist_ok=True)
        for module in source.glob("*.py"):
            shutil.copy(module, target)
    return dest


def lint_imports(house: Path, config: Path = PYPROJECT) -> subprocess.CompletedProcess:
    """Run import-linter's contracts from `config` over the laid-out package in `house`."""
    lint = Path(sys.executable).with_name("lint-imports")
    env = {**os.environ, "PYTHONPATH": str(house), "NO_COLOR": "1", "COLUMNS": "300"}
    return subprocess.run([str(lint), "--no-cache", str(config)], cwd=house, env=env,
                          capture_output=True, text=True, timeout=300)


def layers(config: Path = PYPROJECT) -> list[list[str]]:
    """The layers contract's rooms, top first."""
    contracts = tomllib.loads(config.read_text())["tool"]["importlinter"]["contracts"]
    spec = next(c for c in contracts if c["type"] == "layers")
    return [[room.strip() for room in re.split(r"[:|]", layer)] for layer in spec["layers"]]


_ROOM_EDGES = """
import json, grimp
graph = grimp.build_graph("queuectl", exclude_type_checking_imports=True, cache_dir=None)
print(json.dumps([[a, b] for a in graph.modules for b in graph.find_modules_directly_imported_by(a)]))
"""


def room_edges(house: Path) -> dict[str, set[str]]:
    """Which rooms (the children of `queuectl`) import which, directly. grimp runs in a fresh
    interpreter whose `queuectl` is the laid-out one, never an editable install's."""
    env = {**os.environ, "PYTHONPATH": str(house)}
    done = subprocess.run([sys.executable, "-c", _ROOM_EDGES], cwd=house, env=env,
                          capture_output=True, text=True, timeout=300, check=True)
    edges: dict[str, set[str]] = defaultdict(set)
    for module, imported in json.loads(done.stdout):
        a, b = (m.split(".")[1] if "." in m else "" for m in (module, imported))
        if a and b and a != b:
            edges[a].add(b)
    return edges


def reduced(edges: dict[str, set[str]]) -> dict[str, set[str]]:
    """The transitive reduction: an arrow a -> c is left out when a longer path a -> ... -> c
    exists (the graph has no circles, so this keeps exactly what reaches what)."""
    def reach(start: str, skip: tuple[str, str]) -> set[str]:
        seen, todo = set(), [start]
        while todo:
            node = todo.pop()
            for nxt in edges.get(node, ()):
                if (node, nxt) != skip and nxt not in seen:
                    seen.add(nxt)
                    todo.append(nxt)
        return seen

    return {a: {b for b in bs if b not in reach(a, (a, b))} for a, bs in edges.items()}


def mermaid(house: Path) -> str:
    """The import graph of the rooms as a Mermaid flowchart, one band per layer, top first."""
    bands = layers()
    level = {room: i for i, band in enumerate(bands) for room in band}
    lines = ["```mermaid", "flowchart TB"]
    for i, band in enumerate(bands):
        lines.append(f"  subgraph L{i}[\" \"]")
        lines.extend(f"    {room}" for room in band)
        lines.append("  end")
    for a, bs in sorted(reduced(room_edges(house)).items()):
        for b in sorted(bs):
            arrow = "-->" if level[a] < level[b] else "-.->"  # dotted: within one band
            lines.append(f"  {a} {arrow} {b}")
    lines.append("```")
    return "\n".join(lines)


def page_with_graph(page: str, graph: str) -> str:
    head, rest = page.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    return f"{head}{BEGIN}\n{graph}\n{END}{tail}"


def main(argv: list[str]) -> int:
    with tempfile.TemporaryDirectory(prefix="queuectl-house-") as tmp:
        house = lay_out(Path(tmp))
        if argv[1:] == ["lint"]:
            done = lint_imports(house)
            print(done.stdout + done.stderr)
            return done.returncode
        if argv[1:] == ["graph"]:
            LAYOUT_PAGE.write_text(page_with_graph(LAYOUT_PAGE.read_text(), mermaid(house)))
            return 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
