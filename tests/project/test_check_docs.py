"""scripts/check_docs.py (issue 40, "documentation that runs"): the Markdown block extractor and
its docs-check markers, the shell reader that finds the commands of a block, the check of a
skipped block by vlret's own parser and config validation, and the runner's verdicts on small
pages (a failing block, a timeout, a refused ``pip install``). Fast: nothing trains."""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))
try:
    import check_docs
    from docs_blocks import extract_blocks
    from docs_run import _tail
    from docs_shell import (
        command_words,
        console_script,
        install_command,
        split_commands,
        vlret_arguments,
    )
    from docs_static import check_block, refusals
finally:
    sys.path.remove(str(ROOT / "scripts"))


def _page(text: str) -> str:
    return textwrap.dedent(text).lstrip("\n")


# -- fences ------------------------------------------------------------------------------------


def test_backtick_and_tilde_fences_give_language_lines_and_mode():
    text = _page(
        """
        # Title

        ```bash
        vlret synth tiny --out w
        ```

        ~~~console
        $ vlret configs
        ~~~

        ```python
        print(1)
        ```

        ```
        vlret train x
        ```
        """
    )
    blocks, errors = extract_blocks(text, "p.md")
    assert errors == []
    assert [(b.line, b.language, b.mode) for b in blocks] == [
        (3, "bash", "run"),
        (7, "console", "run"),
        (11, "python", "none"),
        (15, "", "none"),
    ]
    assert blocks[0].lines == ["vlret synth tiny --out w"]
    assert blocks[0].page_line(0) == 4


def test_fence_inside_a_list_item_loses_its_indentation():
    text = _page(
        """
        1. Make the world:

           ```sh
           vlret synth tiny \\
               --out w
           ```
        2. Then
        """
    )
    blocks, errors = extract_blocks(text, "p.md")
    assert errors == []
    assert len(blocks) == 1
    assert blocks[0].line == 3
    assert blocks[0].lines == ["vlret synth tiny \\", "    --out w"]


def test_a_fence_inside_a_longer_fence_is_content_not_a_block():
    text = _page(
        """
        ````markdown
        ```bash
        rm -rf /
        ```
        ````

        ~~~text
        ```bash
        ~~~
        """
    )
    blocks, errors = extract_blocks(text, "p.md")
    assert errors == []
    assert [(b.language, b.mode) for b in blocks] == [("markdown", "none"), ("text", "none")]
    assert blocks[0].lines == ["```bash", "rm -rf /", "```"]
    assert blocks[1].lines == ["```bash"]


def test_info_string_variants_and_an_unclosed_fence():
    blocks, errors = extract_blocks('```bash title="x"\nls\n```\n```{.sh}\nls\n', "p.md")
    assert [b.language for b in blocks] == ["bash", "sh"]
    assert [str(e) for e in errors] == ["p.md:4: fence ``` is never closed"]


# -- markers -----------------------------------------------------------------------------------


def test_skip_marker_makes_a_block_checked_only_with_its_reason():
    text = _page(
        """
        <!-- docs-check: skip real-data: needs Flickr30K's features -->

        ```bash
        vlret train vsepp_butd_f30k_unified
        ```
        """
    )
    blocks, errors = extract_blocks(text, "p.md")
    assert errors == []
    assert (blocks[0].mode, blocks[0].reason, blocks[0].why) == (
        "check",
        "real-data",
        "needs Flickr30K's features",
    )


def test_skip_marker_may_keep_the_conventions_word_reason():
    text = "<!-- docs-check: skip install: CI installs vlret itself -->\n```bash\nls\n```\n"
    blocks, errors = extract_blocks(text, "p.md")
    assert errors == []
    assert (blocks[0].mode, blocks[0].reason, blocks[0].why) == (
        "check",
        "install",
        "CI installs vlret itself",
    )
    _, errors = extract_blocks(text.replace("install:", "setup:"), "p.md")
    assert "unknown reason 'setup'" in errors[0].message


def test_skip_marker_with_an_unknown_reason_is_an_error_naming_its_line():
    text = "Intro\n\n<!-- docs-check: skip slow: an hour -->\n```bash\nls\n```\n"
    blocks, errors = extract_blocks(text, "docs/x.md")
    assert len(errors) == 1
    assert str(errors[0]).startswith("docs/x.md:3: docs-check skip: unknown reason 'slow'")
    assert "real-data" in errors[0].message


@pytest.mark.parametrize(
    ("marker", "expected"),
    [
        ("<!-- docs-check: skip long -->", "expected 'skip REASON: why'"),
        ("<!-- docs-check: skip long: -->", "say why"),
        ("<!-- docs-check: skipped long: x -->", "REASON one of"),
        ("<!-- docs-check: skip REASON: long: x -->", "unknown reason 'REASON'"),  # the placeholder
        ("<!-- docs-check: ignore -->", "not understood"),
        ("<!-- docs-check: skip long: x", "write it on one line"),
        ("<!-- docs-check: setup: -->", "no command"),
    ],
)
def test_malformed_markers_are_errors(marker, expected):
    _, errors = extract_blocks(f"{marker}\n```bash\nls\n```\n", "p.md")
    assert len(errors) == 1 and errors[0].line == 1
    assert expected in errors[0].message


def test_marker_must_precede_a_block_of_the_right_kind():
    text = _page(
        """
        <!-- docs-check: skip long: x -->
        some text
        ```bash
        ls
        ```
        <!-- docs-check: run -->
        ```bash
        ls
        ```
        <!-- docs-check: skip gpu: x -->
        ```python
        x = 1
        ```
        <!-- docs-check: setup: touch f -->
        <!-- docs-check: skip gpu: x -->
        ```sh
        ls
        ```
        <!-- docs-check: run -->
        """
    )
    blocks, errors = extract_blocks(text, "p.md")
    messages = {e.line: e.message for e in errors}
    assert "not followed by a fenced block" in messages[1]
    assert "shell blocks run by default" in messages[6]
    assert "not a shell block" in messages[10]
    assert "setup before a skipped block" in messages[14]
    assert "not followed by a fenced block" in messages[19]
    assert blocks[0].mode == "run"  # the stray marker does not reach it


def test_run_marker_runs_a_python_block_and_setup_is_kept_in_order():
    text = _page(
        """
        <!-- docs-check: run -->
        ```python
        print(1)
        ```
        <!-- docs-check: setup: mkdir d -->
        <!-- docs-check: setup: touch d/f -->
        ```console
        $ ls d
        f
        ```
        """
    )
    blocks, errors = extract_blocks(text, "p.md")
    assert errors == []
    assert blocks[0].mode == "python"
    assert blocks[1].setup == ["mkdir d", "touch d/f"]


# -- the shell reader --------------------------------------------------------------------------


def test_console_prompts_continuations_and_output():
    lines = [
        "$ vlret synth tiny --out w \\",
        ">     --seed 3",
        "wrote w/ (1000 images)",
        "$ ls w",
        "dataset.json",
        "$ echo 'a \\'",
    ]
    script, origin = console_script(lines)
    assert script == ["vlret synth tiny --out w \\", "    --seed 3", "ls w", "echo 'a \\'"]
    assert origin == [0, 1, 3, 5]


def test_split_commands_reads_continuations_operators_comments_and_heredocs():
    text = _page(
        """
        OMP_NUM_THREADS=1 vlret compare c --set 'a=#1' x#y  # a comment
        vlret synth tiny \\
            --out w && time -p python -m vlret train c; ls 2>&1 | head
        cat <<EOF > f.toml
        vlret not a command
        EOF
        for s in 0 1; do vlret eval "r/$s/best.pt" --json "m$s.json"; done
        """
    )
    commands = split_commands(text)
    lines = [(c.first, c.last) for c in commands]
    argv = [vlret_arguments(c.words) for c in commands]
    assert argv[0] == ["compare", "c", "--set", "a=#1", "x#y"]
    assert argv[1] == ["synth", "tiny", "--out", "w"] and lines[1] == (1, 2)
    assert argv[2] == ["train", "c"]
    assert [c.words for c in commands[3:5]] == [("ls",), ("head",)]
    assert commands[5].words == ("cat",)
    assert ["not", "a", "command"] not in argv
    assert argv[7] == ["eval", "r/$s/best.pt", "--json", "m$s.json"] and lines[7] == (6, 6)
    assert command_words(commands[6].words) == []  # for s in 0 1


def test_vlret_invocations_and_installs():
    assert vlret_arguments(["torchrun", "--nproc_per_node=4", "-m", "vlret", "train", "C"]) == [
        "train",
        "C",
    ]
    assert vlret_arguments(["env", "-u", "X", "A=1", "vlret", "--version"]) == ["--version"]
    assert vlret_arguments([".venv/bin/vlret", "demo"]) == ["demo"]
    assert vlret_arguments(["python", "script.py", "-m", "vlret"]) is None
    assert vlret_arguments(["echo", "vlret", "train"]) is None
    assert install_command(["pip", "install", "-e", ".[dev]"])
    assert install_command(["python3", "-m", "pip", "-q", "install", "x"])
    assert install_command(["uv", "pip", "install", "x"])
    assert not install_command(["pip", "show", "vlret"])
    assert not install_command(["echo", "pip", "install"])


# -- checking without running ------------------------------------------------------------------


def _only_block(text: str, page: str = "docs/p.md"):
    blocks, errors = extract_blocks(_page(text), page)
    assert errors == []
    return blocks[-1]


def test_a_skipped_command_with_an_unknown_option_fails_naming_page_and_line():
    block = _only_block(
        """
        Text.

        <!-- docs-check: skip real-data: Flickr30K -->
        ```console
        $ vlret configs
        ...
        $ vlret eval runs/x/best.pt --data data/f30k --split test \\
        >   --protocol f30k --no-such-option 3
        ```
        """
    )
    result = check_block(block, ROOT)
    assert result.parsed == 2
    assert len(result.errors) == 1
    error = result.errors[0]
    assert (error.page, error.line) == ("docs/p.md", 7)
    assert "--no-such-option" in error.message and "unrecognized arguments" in error.message


def test_a_skipped_train_command_validates_the_shipped_config_and_its_overrides():
    good = _only_block(
        """
        <!-- docs-check: skip real-data: x -->
        ```bash
        vlret train vsepp_butd_f30k_unified --set data.root=data/f30k_precomp
        vlret train CONFIG --resume runs/NAME/last.pt
        ```
        """
    )
    result = check_block(good, ROOT)
    assert result.errors == []
    assert result.validated == ["vsepp_butd_f30k_unified"]
    assert result.not_validated == ["CONFIG"]
    bad = _only_block(
        """
        <!-- docs-check: skip long: x -->
        ```bash
        vlret train vsepp_butd_f30k_unified --set train.no_such_key=1
        ```
        """
    )
    result = check_block(bad, ROOT)
    assert len(result.errors) == 1 and result.errors[0].line == 3
    assert "train.no_such_key" in result.errors[0].message


def test_a_skipped_compare_command_checks_its_loss_list():
    block = _only_block(
        """
        <!-- docs-check: skip long: x -->
        ```bash
        vlret compare synth_f30k_compare --losses siglip,dcl --seeds 3
        vlret compare synth_f30k_compare --losses no-such-loss
        ```
        """
    )
    result = check_block(block, ROOT)
    assert result.validated == ["synth_f30k_compare"]
    assert [e.line for e in result.errors] == [4]
    assert "no-such-loss" in result.errors[0].message


def test_runnable_blocks_refuse_installs_and_prompts():
    block = _only_block(
        """
        ```bash
        pip install 'vlret[all]'
        $ vlret --help
        ```
        """
    )
    messages = {e.line: e.message for e in refusals(block)}
    assert "docs-check: skip install" in messages[2]
    assert "'$ ' prompt" in messages[3]


# -- running -----------------------------------------------------------------------------------


def _repo(tmp_path: Path, pages: dict[str, str]) -> Path:
    for name, text in pages.items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(_page(text))
    return tmp_path


def test_runner_runs_pages_in_order_in_their_own_folder(tmp_path, capsys):
    repo = _repo(
        tmp_path,
        {
            "README.md": """
                ```bash
                test -z "$(ls -A)"    # a fresh, empty folder
                mkdir sub && cd sub
                export GREETING=hello
                echo "$GREETING" > f.txt
                ```

                ```console
                $ cat f.txt \\
                >   f.txt
                hello
                hello
                ```

                <!-- docs-check: run -->
                ```python
                import pathlib
                assert pathlib.Path("f.txt").read_text() == "hello\\n"
                ```
                """,
            "docs/other.md": """
                ```sh
                test ! -e sub && test ! -e f.txt
                ```
                """,
        },
    )
    record = tmp_path / "out" / "docs-check.json"
    assert check_docs.main(["--root", str(repo), "--json", str(record)]) == 0
    out = capsys.readouterr().out
    assert "README.md:1 " in out and "README.md:8 " in out and "README.md:16 " in out
    assert "README.md:9 " in out and "cat f.txt f.txt" in out  # the command's own time line
    table = out[out.index("page ") :]
    assert "README.md" in table and "docs/other.md" in table and "FAIL" not in out
    pages = json.loads(record.read_text())["pages"]
    assert [(p["page"], p["blocks_run"]) for p in pages] == [("README.md", 3), ("docs/other.md", 1)]
    commands = [c["command"] for c in pages[0]["blocks"][1]["commands"]]
    assert commands == ["cat f.txt f.txt"]


def test_runner_fails_on_a_failing_block_naming_page_line_command_and_stderr(tmp_path, capsys):
    repo = _repo(
        tmp_path,
        {
            "docs/guide.md": """
                # Guide

                ```bash
                echo start
                ls /no/such/docs-check-path \\
                    -l
                echo never
                ```

                ```bash
                echo not reached
                ```
                """
        },
    )
    assert check_docs.main(["--root", str(repo)]) == 1
    out = capsys.readouterr().out
    failures = out[out.index("failures (") :]
    assert "docs/guide.md:5: ls /no/such/docs-check-path -l" in failures
    assert "(the block at line 3) exit status 2" in failures
    assert "No such file or directory" in failures
    assert "docs/guide.md:10: not run" in failures
    assert "never" not in out.replace("echo never", "")


def test_runner_refuses_pip_install_and_stops_at_the_time_limit(tmp_path, capsys):
    repo = _repo(
        tmp_path,
        {
            "README.md": """
                ```bash
                pip install vlret
                ```
                """,
            "docs/slow.md": """
                ```bash
                echo a
                sleep 30
                ```
                """,
        },
    )
    assert check_docs.main(["--root", str(repo), "--page-timeout", "1"]) == 1
    out = capsys.readouterr().out
    assert "README.md:2: pip install vlret: CI does not install packages" in out
    assert "FAIL (refused, not run)" in out
    assert "docs/slow.md:3: sleep 30" in out
    assert "stopped after 1 s in this block: the page's time limit (--page-timeout 1 s" in out


def test_dry_run_checks_runnable_blocks_without_running_them(tmp_path, capsys):
    repo = _repo(
        tmp_path,
        {"README.md": "```bash\nvlret synth tiny --out w --bogus\ntouch made\n```\n"},
    )
    assert check_docs.main(["--root", str(repo), "--dry-run"]) == 1
    out = capsys.readouterr().out
    assert "README.md:2: vlret synth tiny --out w --bogus" in out
    assert not (repo / "made").exists()


def test_output_tail_shows_what_a_terminal_shows(tmp_path):
    """A progress bar redrawn with carriage returns leaves its last state; blank and repeated
    lines go, so the error line is not pushed out of the tail."""
    log = tmp_path / "stderr.log"
    log.write_bytes(b"start\r\n 10%\r 50%\r100%\n\n\n100%\nvlret train: data.root: missing\n")
    assert _tail(log) == ["start", "100%", "vlret train: data.root: missing"]


def test_the_repository_pages_markers_are_well_formed():
    """Every docs-check marker of README.md and docs/ reads (a wrong one fails CI's run)."""
    errors = []
    for path in check_docs.find_pages(ROOT):
        _, found = extract_blocks(path.read_text(encoding="utf-8"), path.name)
        errors += [str(e) for e in found]
    assert errors == []
