"""The file-size rule of docs/architecture.md: no module of src/vlret is over 600 lines (a long
file is split where its jobs divide). Import cycles and the layers are lint-imports' contracts."""

from __future__ import annotations

from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src" / "vlret"
LIMIT = 600


def _lines(path: Path) -> int:
    return len(path.read_text(encoding="utf-8").splitlines())


def test_no_module_is_over_the_limit():
    sizes = {p.relative_to(SRC).as_posix(): _lines(p) for p in SRC.rglob("*.py")}
    assert len(sizes) > 200  # the walk found the package
    assert {name: n for name, n in sizes.items() if n > LIMIT} == {}


def test_the_count_is_lines_as_an_editor_shows_them(tmp_path):
    path = tmp_path / "m.py"
    path.write_text("a = 1\n" * LIMIT)
    assert _lines(path) == LIMIT
    path.write_text("a = 1\n" * LIMIT + "b = 2")  # a last line without its newline counts
    assert _lines(path) == LIMIT + 1
