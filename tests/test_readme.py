"""The README's Python examples run, in order, and its first two commands are the make targets."""

from __future__ import annotations

import argparse
import re
import tempfile
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"


def test_readme_examples_run():
    text = README.read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, flags=re.S)
    assert len(blocks) >= 3
    namespace: dict = {}
    for block in blocks:
        exec(compile(block, str(README), "exec"), namespace)
    assert namespace["coco_1k"].folds and namespace["coco_5k"].rsum > 0


def test_readme_opens_with_the_two_commands():
    text = README.read_text()
    first_block = re.search(r"```bash\n(.*?)```", text, flags=re.S).group(1).splitlines()
    assert first_block[0].startswith("make demo")
    assert first_block[1].startswith("make test")
    makefile = (README.parent / "Makefile").read_text()
    assert re.search(r"^demo:", makefile, flags=re.M) and re.search(r"^test:", makefile, flags=re.M)


def test_make_demo_runs_the_six_loss_comparison():
    makefile = (README.parent / "Makefile").read_text()
    recipe = re.search(r"^demo:.*\n\t(.*)$", makefile, flags=re.M).group(1)
    assert recipe.split()[-3:] == ["demo", "--preset", "small"]
    first = re.search(r"```bash\n(.*?)```", README.read_text(), flags=re.S).group(1)
    assert "six losses" in first.splitlines()[0]


def _section(text: str, heading: str) -> str:
    """The README's text under the heading ``heading`` (any level), up to the next heading of
    the same or a higher level."""
    match = re.search(rf"^(#+) {re.escape(heading)}\n", text, flags=re.M)
    assert match, heading
    body = text[match.end() :]
    end = re.search(rf"^#{{1,{len(match.group(1))}}} ", body, flags=re.M)
    return body[: end.start()] if end else body


@pytest.mark.parametrize(
    "heading", ["Use a loss in two lines", "Evaluation", "Large batches and many GPUs"]
)
def test_readme_sections_examples_run_on_their_own(heading):
    # Before: the evaluation snippet used torch without importing it, so it ran only after the
    # earlier examples (NameError: name 'torch' is not defined on its own).
    blocks = re.findall(r"```python\n(.*?)```", _section(README.read_text(), heading), re.S)
    assert blocks, heading
    for block in blocks:
        exec(compile(block, f"{README} ({heading})", "exec"), {})


def test_readme_command_list_is_vlret_help():
    from vlret.cli import build_parser

    parser = build_parser()
    (sub,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    block = re.search(r"## Command line\n\n```\n(.*?)```", README.read_text(), re.S).group(1)
    listed = [m.group(1) for m in re.finditer(r"^vlret (\S+)", block, flags=re.M)]
    assert len(listed) == len(set(listed))
    assert set(listed) == set(sub.choices), "README's command list vs vlret --help"


def test_readme_local_shard_list_is_the_registry():
    # Before: one place listed 5 losses (InfoNCE, Unified, Triplet, GOAL, DCL), the other 8
    # (without sdm); the code declares 9.
    from vlret.losses import available_losses, loss_capabilities, loss_parameters

    declared = {n for n in available_losses() if loss_capabilities(n).local_shards}
    text = README.read_text()
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


def test_readme_run_folder_rule_is_the_code():
    # "an empty `output_dir` ... is refused" read as an empty folder being refused: it is the
    # empty string that is refused, and an empty folder is fine.
    from vlret.train.run_folder import RunFolderError, prepare_run_folder

    text = " ".join(README.read_text().split())
    assert "an empty `output_dir`," not in text
    assert 'An empty string, `output_dir = ""`' in text
    assert "an existing empty folder is fine" in text
    with pytest.raises(RunFolderError, match="empty"):
        prepare_run_folder("", create=False)
    with tempfile.TemporaryDirectory() as folder:
        assert prepare_run_folder(folder, create=False) == Path(folder)
