"""The README is a front door (short, its commands and links real) and the Python examples of
the README and of the docs pages it sends readers to run; the command list of the docs' first
page is `vlret --help`'s."""

from __future__ import annotations

import argparse
import re
import subprocess
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
DOCS = ROOT / "docs"


def _python_blocks(text: str) -> list[str]:
    return re.findall(r"```python\n(.*?)```", text, flags=re.S)


def _section(path: Path, heading: str) -> str:
    """The text of ``path`` under the heading ``heading`` (any level), up to the next heading
    of the same or a higher level outside a fenced block (a ``# comment`` in a code block is
    no heading)."""
    lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
    start = level = None
    fenced = False
    for i, line in enumerate(lines):
        if line.startswith("```"):
            fenced = not fenced
            continue
        match = None if fenced else re.match(r"(#+) (.*)\n?$", line)
        if match and start is None and match.group(2) == heading:
            start, level = i + 1, len(match.group(1))
        elif match and start is not None and len(match.group(1)) <= level:
            return "".join(lines[start:i])
    assert start is not None, (path, heading)
    return "".join(lines[start:])


def test_readme_is_a_short_front_door():
    lines = README.read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 250, len(lines)
    headings = [line for line in lines if line.startswith("## ")]
    assert headings[:2] == ["## Install", "## The first five minutes"], headings


def test_readme_names_the_test_command_ci_runs():
    # .ci/run calls `make test`; a reader of the README must find it there too.
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    assert re.search(r"^make test\b", ci, flags=re.M)
    assert "`make test`" in _section(README, "Development")
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    assert re.search(r"^test:", makefile, flags=re.M) and re.search(r"^demo:", makefile, re.M)


def test_readme_quickstart_starts_from_an_empty_folder():
    # The first runnable block writes its own data: nothing before it, no skip marker on it.
    quick = _section(README, "The first five minutes")
    block = re.search(r"```bash\n(.*?)```", quick, flags=re.S).group(1).splitlines()
    assert block[0].startswith("vlret synth ")
    assert "docs-check: skip" not in quick
    assert any(line.startswith("vlret train ") for line in block)
    assert any(line.startswith("vlret eval ") for line in block)


def test_make_demo_runs_the_six_loss_comparison():
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    recipe = re.search(r"^demo:.*\n\t(.*)$", makefile, flags=re.M).group(1)
    assert recipe.split()[-3:] == ["demo", "--preset", "small"]
    dev = (DOCS / "development.md").read_text(encoding="utf-8")
    first = re.search(r"```bash\n(.*?)```", dev, flags=re.S).group(1).splitlines()
    assert first[0].startswith("make test")
    demo = [line for line in first if line.startswith("make demo")]
    assert demo and "six-loss" in demo[0]


def test_readme_links_are_pages_of_the_site():
    text = README.read_text(encoding="utf-8")
    links = re.findall(r"\]\((docs/[^)#]+)(?:#[^)]*)?\)", text)
    assert links
    nav = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    for link in links:
        assert (ROOT / link).is_file(), link
        assert f": {link[len('docs/') :]}" in nav, f"{link} is not in mkdocs.yml's nav"


def test_the_site_has_its_own_first_page():
    index = (DOCS / "index.md").read_text(encoding="utf-8")
    assert "guide.md" not in index and not (DOCS / "guide.md").exists()
    assert "README" not in (ROOT / "mkdocs.yml").read_text(encoding="utf-8")


def test_nothing_points_outside_the_repository():
    # Before: the README, losses/_base.py and pyproject.toml named an ARCHITECTURE.md "of the
    # project's shared folder", and two paper notes a file under ../shared/.
    tracked = subprocess.run(
        ["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.split()
    pattern = re.compile(r"ARCHITECTURE\.md|shared folder|\.\./shared/")
    offenders = []
    for name in tracked:
        path = ROOT / name
        if name == Path(__file__).resolve().relative_to(ROOT).as_posix() or not path.is_file():
            continue
        if path.suffix not in {".md", ".py", ".toml", ".yml", ".yaml", ".cfg", ".txt", ""}:
            continue
        if pattern.search(path.read_text(encoding="utf-8", errors="replace")):
            offenders.append(name)
    assert not offenders, offenders


def test_readme_examples_run():
    blocks = _python_blocks(README.read_text(encoding="utf-8"))
    assert blocks
    namespace: dict = {}
    for block in blocks:
        exec(compile(block, str(README), "exec"), namespace)
    assert namespace["loss"].ndim == 0 and namespace["img_emb"].grad is not None


@pytest.mark.parametrize(
    ("page", "heading"),
    [
        ("own-loop.md", "A loss in two lines"),
        ("own-loop.md", "The papers' objectives"),
        ("evaluation.md", "Metrics in Python"),
        ("large-batches.md", "Large batches and many GPUs"),
    ],
)
def test_docs_examples_run_on_their_own(page, heading):
    # Before: the evaluation snippet used torch without importing it, so it ran only after the
    # earlier examples (NameError: name 'torch' is not defined on its own).
    path = DOCS / page
    text = _section(path, heading)
    blocks = _python_blocks(text)
    assert blocks, (page, heading)
    namespace: dict = {}
    for block in blocks:
        exec(compile(block, f"{path} ({heading})", "exec"), namespace)
    if heading == "Metrics in Python":
        assert namespace["coco_1k"].folds and namespace["coco_5k"].rsum > 0


def test_docs_command_list_is_vlret_help():
    from vlret.cli import build_parser

    parser = build_parser()
    (sub,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    text = (DOCS / "index.md").read_text(encoding="utf-8")
    block = re.search(r"## Commands\n\n(.*?)\n\n", text, re.S).group(1)
    listed = [m.group(1) for m in re.finditer(r"^\| `vlret (\S+)`", block, flags=re.M)]
    assert len(listed) == len(set(listed))
    assert set(listed) == set(sub.choices), "docs/index.md's command list vs vlret --help"


def test_docs_local_shard_list_is_the_registry():
    # Before: one place listed 5 losses (InfoNCE, Unified, Triplet, GOAL, DCL), the other 8
    # (without sdm); the code declares 9.
    from vlret.losses import available_losses, loss_capabilities, loss_parameters

    declared = {n for n in available_losses() if loss_capabilities(n).local_shards}
    text = " ".join(
        (DOCS / page).read_text(encoding="utf-8")
        for page in ("large-batches.md", "loss-reference.md", "train.md")
    )
    # every parenthesis after "local shards" that names losses (before a ":"), any spelling
    lists = [
        {w.lower() for w in re.findall(r"\w+", m.split(":")[0])} & set(available_losses())
        for m in re.findall(r"local[ _]shards`?\s+\(([^)]*)\)", text)
    ]
    lists = [names for names in lists if names]
    assert lists and all(names == declared for names in lists), (lists, declared)
    # "every loss with chunk_size but AdaCL"
    tiled = {n for n in available_losses() if "chunk_size" in loss_parameters(n)}
    assert "every loss with `chunk_size` but AdaCL" in " ".join(text.split())
    assert tiled - {"adacl"} == declared


def test_docs_run_folder_rule_is_the_code():
    # "an empty `output_dir` ... is refused" read as an empty folder being refused: it is the
    # empty string that is refused, and an empty folder is fine.
    from vlret.run.folder import RunFolderError, prepare_run_folder

    text = " ".join((DOCS / "train.md").read_text(encoding="utf-8").split())
    assert "an empty `output_dir`," not in text
    assert 'An empty string, `output_dir = ""`' in text
    assert "an existing empty folder is fine" in text
    with pytest.raises(RunFolderError, match="empty"):
        prepare_run_folder("", create=False)
    with tempfile.TemporaryDirectory() as folder:
        assert prepare_run_folder(folder, create=False) == Path(folder)
