"""The README's Python examples run, in order, and its first two commands are the make targets."""

from __future__ import annotations

import re
from pathlib import Path

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
