"""The house keeps its shape: import-linter's contracts hold over the package as installed,
an upward import or a circle breaks them, and docs/layout.md's picture is today's graph."""

from __future__ import annotations

from pathlib import Path

import pytest

from architecture import END, BEGIN, LAYOUT_PAGE, lay_out, layers, lint_imports, mermaid, page_with_graph


@pytest.fixture(scope="module")
def house(tmp_path_factory) -> Path:
    return lay_out(tmp_path_factory.mktemp("house"))


def _broken(result) -> list[str]:
    return [line for line in result.stdout.splitlines() if line.rstrip().endswith("BROKEN")]


def test_every_contract_is_kept(house):
    result = lint_imports(house)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout


def test_every_installed_module_has_a_layer(house):
    rooms = {p.stem if p.is_file() else p.name for p in (house / "queuectl").iterdir()
             if p.name != "__init__.py" and p.name != "__pycache__" and (p.is_dir() or p.suffix == ".py")}
    assert rooms == {room for band in layers() for room in band}


def _append(path: Path, line: str) -> None:
    path.write_text(path.read_text() + f"\n{line}\n")


def test_an_upward_import_from_the_engine_wing_breaks_the_layers(tmp_path):
    house = lay_out(tmp_path)
    _append(house / "queuectl" / "engine" / "base.py", "import queuectl.cli  # an upward arrow")
    result = lint_imports(house)
    assert result.returncode != 0
    assert any(line.startswith("Layers:") for line in _broken(result)), result.stdout
    assert "queuectl.engine.base -> queuectl.cli" in result.stdout


def test_the_registry_importing_the_installer_breaks_the_layers(tmp_path):
    house = lay_out(tmp_path)
    _append(house / "queuectl" / "registry.py", "from queuectl import install  # an upward arrow")
    result = lint_imports(house)
    assert result.returncode != 0
    assert any(line.startswith("Layers:") for line in _broken(result)), result.stdout


def test_one_database_module_importing_another_breaks_the_engine_wing(tmp_path):
    house = lay_out(tmp_path)
    _append(house / "queuectl" / "engine" / "mssql.py", "import queuectl.engine.postgresql")
    result = lint_imports(house)
    assert [line.split(":")[0] for line in _broken(result)] == ["One module per database"], result.stdout


def test_a_circle_inside_one_band_breaks_the_no_circles_contract(tmp_path):
    # catalog and sqlfiles share a band, so the layers allow either arrow; both make a circle.
    house = lay_out(tmp_path)
    _append(house / "queuectl" / "catalog.py", "import queuectl.sqlfiles")
    _append(house / "queuectl" / "sqlfiles.py", "import queuectl.catalog")
    result = lint_imports(house)
    assert [line.split(":")[0] for line in _broken(result)] == ["No circles"], result.stdout


def test_the_layout_page_shows_todays_import_graph(house):
    page = LAYOUT_PAGE.read_text()
    assert BEGIN in page and END in page
    assert page_with_graph(page, mermaid(house)) == page, "imports changed: run `make graph`"


def test_every_arrow_in_the_picture_points_down(house):
    level = {room: i for i, band in enumerate(layers()) for room in band}
    arrows = [line.split() for line in mermaid(house).splitlines() if "->" in line]
    assert arrows
    for a, arrow, b in arrows:
        assert level[a] <= level[b], (a, b)
        assert (arrow == "-->") == (level[a] < level[b])
