"""Fault pass (issue 26) over run config files: which file a path means, inputs bounded before
they are walked (YAML aliases, nesting, binary files), sane ranges of sizes and counts, the
shipped configs that `vlret configs` lists, and `vlret configs copy` into a bad folder.

Each bad input ends in one line naming the file (or ``--set``), the key where there is one, and
the value; the CLI prints it as ``vlret CMD: ...`` with exit status 2.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from fault_helpers import read_only_folder
from vlret._settings import MAX_EPOCHS
from vlret.cli import main
from vlret.cli.configs import listing
from vlret.configs import describe, first_sentence, shipped_config, shipped_configs
from vlret.run import config_files
from vlret.run.config import apply_overrides, config_from_dict, load_config
from vlret.run.config_checks import MAX_DIM, MAX_MATRIX
from vlret.run.config_files import (
    MAX_DEPTH,
    MAX_VALUES,
    ConfigError,
    parse_value,
    read_config_file,
)

TOML = """
output_dir = "runs/x"

[data]
root = "data/f30k"

[model]
embed_dim = 64
image = { kind = "precomp", in_dim = 16, pooling = "max" }
text = { kind = "gru", word_dim = 8, bidirectional = true }

[loss]
name = "unified"

[train]
epochs = 20
batch_size = 128
"""


def one_line_error(capsys, command: str) -> str:
    """The error a command printed: exactly one line, prefixed ``vlret COMMAND: ``."""
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1, err
    assert err.startswith(f"vlret {command}: "), err
    return err


def write(path: Path, text: str | bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text)
    return path


# -- item 2: a path is a file, only a bare name is a shipped config -----------------------------


@pytest.mark.parametrize(
    "given",
    [
        "/no/such/place/configs/synth_f30k_compare.toml",
        "configs/synth_f30k_compare.toml",  # a typo of one's own copy, relative
        "no/such/place/synth_f30k_compare",
    ],
)
def test_a_missing_path_is_an_error_not_the_shipped_config_of_its_name(
    tmp_path, monkeypatch, given
):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(FileNotFoundError) as err:
        read_config_file(given)
    message = str(err.value)
    assert message.startswith(f"{given}: no such file")
    assert "give its bare name: synth_f30k_compare" in message


@pytest.mark.parametrize("command", ["train", "compare", "sweep"])
def test_every_command_refuses_a_missing_config_path_in_one_line(tmp_path, capsys, command):
    given = str(tmp_path / "configs" / "synth_f30k_compare.toml")
    argv = [command, given] + (["--param", "margin=0.1,0.2"] if command == "sweep" else [])
    assert main(argv) == 2
    err = one_line_error(capsys, command)
    assert f"{given}: no such file" in err and "synth_f30k_compare" in err


def test_bare_names_select_shipped_configs_and_existing_files_win(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    shipped = shipped_configs()["adacl_coco"]
    for name in ("adacl_coco", "adacl_coco.toml"):
        assert config_files.resolve_config_path(name) == shipped
        assert load_config(name).loss.name == "adacl"
    own = write(tmp_path / "configs" / "adacl_coco.toml", shipped.read_text())
    own.write_text(own.read_text().replace('"runs/adacl_coco"', '"runs/mine"', 1))
    assert load_config("configs/adacl_coco.toml").output_dir == "runs/mine"  # the file
    write(tmp_path / "adacl_coco.toml", own.read_text())
    assert load_config("adacl_coco.toml").output_dir == "runs/mine"  # a file in the cwd wins
    assert shipped_config("configs/adacl_coco.toml") is None  # a folder part: not a name
    with pytest.raises(FileNotFoundError, match="nor a shipped config's name.*vlret configs"):
        read_config_file("no_such_config")
    with pytest.raises(FileNotFoundError, match=r"^elsewhere/mine.yaml: no such file; expected"):
        read_config_file("elsewhere/mine.yaml")
    with pytest.raises(ConfigError, match="is a folder"):
        read_config_file(tmp_path / "configs")


# -- item 4: YAML aliases are refused where they are read; every walk is bounded ---------------


def bomb_yaml() -> str:
    """A billion laughs under a section: 9**9 leaves from 9 lines."""
    lines = ["  l0: &l0 [x, x, x, x, x, x, x, x, x]"]
    for i in range(1, 9):
        refs = ", ".join([f"*l{i - 1}"] * 9)
        lines.append(f"  l{i}: &l{i} [{refs}]")
    return "\n".join(lines)


@pytest.mark.parametrize("section", ["compare", "model"])
def test_a_yaml_alias_bomb_is_refused_at_load_naming_file_and_line(tmp_path, capsys, section):
    """Before: `vlret train` hung with no output (9**9 leaves walked by the finite check)."""
    config = write(tmp_path / "bomb.yaml", f"output_dir: x\n{section}:\n{bomb_yaml()}\n")
    with pytest.raises(ConfigError) as err:
        read_config_file(config)
    assert str(err.value) == (
        f"{config}: line 4: YAML alias *l0 refused (a run config writes its values out; aliases "
        "can expand a few lines into billions)"
    )
    for command in ("train", "compare"):
        assert main([command, str(config)]) == 2
        assert "line 4: YAML alias *l0 refused" in one_line_error(capsys, command)


def test_yaml_anchors_without_aliases_and_plain_yaml_still_load(tmp_path):
    config = write(tmp_path / "a.yaml", "output_dir: x\ndata: &d {root: r, format: precomp}\n")
    assert read_config_file(config)["data"] == {"root": "r", "format": "precomp"}


def shared_bomb(levels: int = 9, width: int = 9) -> list:
    """A Python billion laughs: ``width ** levels`` leaves in ``levels * width`` list slots."""
    node: list = ["x"] * width
    for _ in range(levels - 1):
        node = [node] * width
    return node


def test_the_raw_tree_checks_visit_each_shared_table_once(tmp_path):
    """A dict from Python (no YAML) may share tables: the finite check (before: a walk of all
    9**9 leaves, a hang) now counts each object once and refuses the expansion."""
    raw = load_config_raw(tmp_path)
    raw["compare"] = {"losses": {"bomb": shared_bomb()}}
    with pytest.raises(ConfigError, match=rf"compare.losses.bomb.*more than {MAX_VALUES} values"):
        config_from_dict(raw, source="mine.toml")
    raw["compare"] = {"a": shared_bomb(levels=3, width=3)}  # 27 values: fine
    config_from_dict(raw, source="mine.toml")


def test_a_config_that_refers_to_itself_is_one_line(tmp_path):
    """Before: RecursionError from the finite check."""
    raw = load_config_raw(tmp_path)
    loop: list = []
    loop.append(loop)
    raw["compare"] = {"loop": loop}
    with pytest.raises(ConfigError, match=r"^x.toml: compare.loop\[0\]: refers to itself"):
        config_from_dict(raw, source="x.toml")


def load_config_raw(tmp_path: Path) -> dict:
    return read_config_file(write(tmp_path / "base.toml", TOML))


def load_config_raw_text() -> dict:
    return config_files.tomllib.loads(TOML)


# -- item 7: nesting depth ---------------------------------------------------------------------


def deep_files(levels: int) -> dict[str, str]:
    return {
        "inline.toml": f"output_dir = 'x'\n[model]\na = {'[' * levels}{']' * levels}\n",
        "headers.toml": f"output_dir = 'x'\n[{'.'.join(['a'] * levels)}]\nb = 1\n",
        "deep.yaml": f"output_dir: x\nmodel: {'[' * levels}{']' * levels}\n",
        "deep.json": '{"model": ' + '{"a": ' * levels + "1" + "}" * levels + "}",
    }


@pytest.mark.parametrize("name", list(deep_files(1)))
@pytest.mark.parametrize("levels", [5000, MAX_DEPTH + 5])
def test_deep_nesting_is_one_line_naming_the_file_and_the_depth(tmp_path, capsys, name, levels):
    """Before: 5000 levels were a RecursionError traceback (or, under the interpreter's
    recursion limit, accepted and walked recursively by every later check)."""
    config = write(tmp_path / name, deep_files(levels)[name])
    with pytest.raises(ConfigError) as err:
        read_config_file(config)
    message = str(err.value)
    assert message.startswith(f"{config}: ")
    assert f"{MAX_DEPTH} levels" in message
    assert main(["train", str(config)]) == 2
    one_line_error(capsys, "train")


def test_real_nesting_passes_the_depth_check(tmp_path):
    config = write(tmp_path / "ok.toml", f"output_dir = 'x'\n[{'.'.join(['a'] * 10)}]\nb = 1\n")
    assert read_config_file(config)["a"]["a"]


@pytest.mark.parametrize("levels", [5000, MAX_DEPTH + 5])
def test_a_deep_set_value_is_one_line_naming_the_key(tmp_path, capsys, levels):
    """Before: RecursionError traceback from ``--set`` (5000) / accepted (37)."""
    value = "[" * levels + "]" * levels
    with pytest.raises(ConfigError, match=rf"^--set: model.a.*{MAX_DEPTH} levels"):
        parse_value(value, "model.a")
    with pytest.raises(ConfigError, match=rf"^--set: model.a.*{MAX_DEPTH} levels"):
        apply_overrides({}, [f"model.a={value}"])
    config = write(tmp_path / "base.toml", TOML)
    assert main(["train", str(config), "--set", f"model.a={value}"]) == 2
    assert "--set: model.a" in one_line_error(capsys, "train")


def test_parse_value_still_types_inf_for_its_callers():
    """``parse_value`` bounds depth only: the synth hint probes it with "inf" (quoting the
    string), and a non-finite number is refused where the config is validated."""
    assert parse_value("inf") == float("inf")
    with pytest.raises(ConfigError, match=r"^x.toml: optim.lr: expected a finite number"):
        config_from_dict(apply_overrides(load_config_raw_text(), ["optim.lr=inf"]), source="x.toml")


# -- item 10: a binary file is not a text config ------------------------------------------------


@pytest.mark.parametrize(
    ("name", "data", "what"),
    [
        ("garbage.toml", b"\x80garbage\xff", "byte 0x80 at offset 0 is not UTF-8"),
        ("late.yaml", b"output_dir: x\n\xc3\x28", "byte 0xc3 at offset 14 is not UTF-8"),
        ("nul.json", b'{"a": 1}\x00\x00', "a NUL byte at offset 8"),
    ],
)
def test_a_binary_config_names_the_file_and_the_offset(tmp_path, capsys, name, data, what):
    """Before: "'utf-8' codec can't decode byte 0x80 ..." without the file name (the NUL case:
    a parser message)."""
    config = write(tmp_path / name, data)
    with pytest.raises(ConfigError) as err:
        read_config_file(config)
    assert str(err.value) == (
        f"{config}: not a text config: {what} (expected a TOML, YAML or JSON file)"
    )
    assert main(["train", str(config)]) == 2
    assert str(config) in one_line_error(capsys, "train")


def test_an_oversized_config_is_refused_before_it_is_read(tmp_path, monkeypatch):
    monkeypatch.setattr(config_files, "MAX_BYTES", 64)
    config = write(tmp_path / "big.toml", TOML)
    with pytest.raises(ConfigError, match=rf"^{config}: \d+ bytes; a run config is text of at"):
        read_config_file(config)


def test_an_unreadable_or_irregular_config_is_one_line(tmp_path, monkeypatch):
    with pytest.raises(ConfigError, match="^/dev/null: not a regular file"):
        read_config_file("/dev/null")
    config = write(tmp_path / "a.toml", TOML)

    def refused(self):
        raise PermissionError(13, "Permission denied", str(self))

    monkeypatch.setattr(Path, "read_bytes", refused)
    with pytest.raises(ConfigError, match=rf"^{config}: cannot read \(Permission denied\)$"):
        read_config_file(config)


# -- item 8: sane ranges ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("override", "key", "message"),
    [
        ("train.epochs=100000000000000000000", "train.epochs", f"[1, {MAX_EPOCHS}]"),
        ("train.batch_size=10000000000", "train.batch_size", "got 10000000000"),
        ("train.seed=100000000000000000000", "train.seed", "got 100000000000000000000"),
        ("train.max_steps_per_epoch=10000000000", "train.max_steps_per_epoch", "got 10000000000"),
        ("data.num_workers=100000", "data.num_workers", "[0, 1024], got 100000"),
        ("optim.decay_epochs=[10, 1000000000]", "optim.decay_epochs[1]", "got 1000000000"),
        ("model.embed_dim=100000000", "model.embed_dim", f"[1, {MAX_DIM}], got 100000000"),
        ("model.embed_dim=1e8", "model.embed_dim", "expected an integer, got 100000000.0"),
        ("model.embed_dim=0", "model.embed_dim", f"[1, {MAX_DIM}], got 0"),
        ("model.text.word_dim=1e3", "model.text.word_dim", "expected an integer, got 1000.0"),
        ("model.text.num_layers=1000000000", "model.text.num_layers", "[0, 1024]"),
        ("model.text.vocab_size=1000000000", "model.text.vocab_size", "got 1000000000"),
        ("model.experts={rgb = 2048, audio = 1e9}", "model.experts.audio", "got 1000000000.0"),
        ("model.vlad_clusters={audio = 100000}", "model.vlad_clusters.audio", "got 100000"),
        (
            "model.image.in_dim=60000",
            "model.image.in_dim",
            f"60000 x model.embed_dim 60000 = 3600000000 elements in one weight matrix (more "
            f"than {MAX_MATRIX}",
        ),
    ],
)
def test_sizes_and_counts_out_of_range_are_one_line_naming_key_and_value(
    tmp_path, capsys, override, key, message
):
    """Before: epochs = 10**20 and the like were accepted (a run that never ends);
    model.embed_dim = 10**8 ended in an allocation traceback when the model was built."""
    config = write(tmp_path / "base.toml", TOML)
    overrides = [override] + (["model.embed_dim=60000"] if "in_dim=60000" in override else [])
    with pytest.raises(ConfigError) as err:
        load_config(config, overrides)
    assert str(err.value).startswith(f"{config}: {key}: ")
    assert message in str(err.value)
    assert main(["train", str(config), *(f"--set={o}" for o in overrides)]) == 2
    assert f"{key}: " in one_line_error(capsys, "train")


def test_values_at_the_bounds_still_validate(tmp_path):
    config = write(tmp_path / "base.toml", TOML)
    cfg = load_config(
        config,
        [
            f"train.epochs={MAX_EPOCHS}",
            "train.seed=-5",
            "model.embed_dim=65536",
            "model.image.in_dim=16384",  # 2**30 elements: at the bound
            "model.text.num_layers=0",
            "data.num_workers=1024",
        ],
    )
    assert cfg.train.epochs == MAX_EPOCHS and cfg.model["embed_dim"] == MAX_DIM


# -- item 12: every listed config trains; whole first sentences ---------------------------------


@pytest.mark.parametrize("name", ["demo_tiny", "demo_small"])
def test_the_demo_configs_train_their_own_loss(name):
    """Before: "loss: required section is missing" although `vlret configs` lists them."""
    raw = read_config_file(name)
    cfg = config_from_dict(raw, source=name)
    assert (cfg.loss.name, cfg.loss.params) == ("triplet", {"margin": 0.2, "hardest": True})
    assert len(raw["compare"]["losses"]) == 6  # `vlret compare` still trains the six


def test_vlret_train_demo_tiny_runs_on_the_tiny_world(tmp_path, capsys):
    """`vlret configs` says `vlret train NAME` runs each config: the tiny demo's, on the world
    `vlret synth tiny` writes (its data.root), for two steps."""
    world = tmp_path / "data-tiny"
    assert main(["synth", "tiny", "--out", str(world)]) == 0
    capsys.readouterr()
    argv = ["train", "demo_tiny", "--set", f"data.root={world}"]
    argv += [f"--set={o}" for o in ("train.epochs=1", "train.max_steps_per_epoch=2")]
    argv += ["--set=train.all_negatives_epochs=1", f"--set=output_dir={tmp_path / 'run'}"]
    assert main([*argv, "--set=train.validate=false"]) == 0, capsys.readouterr().err
    assert (tmp_path / "run" / "last.pt").is_file()


def test_descriptions_are_whole_first_sentences():
    """Before: the first comment line, cut mid-sentence ("... (Liu et al. 2019; the settings
    of")."""
    text = shipped_configs()["bfan_equal_coco_triplet"].read_text()
    assert first_sentence(text) == (
        "BFAN (equal) on MS-COCO with its own triplet-HN loss (Liu et al. 2019; the settings of "
        "its code's README: Adam lr 5e-4, x0.1 at epoch 15, 20 epochs, batch 128, "
        "lambda_softmax 20, grad clip 2)."
    )
    assert first_sentence("# AdaCL paper 4.1. Adam, batch 64\n# more.\n") == "AdaCL paper 4.1."
    assert first_sentence("# Intro line (a.\n#   vlret x\n# rest.\n") == "Intro line (a."
    for name, path in shipped_configs().items():
        sentence, _, what = describe(path).rpartition(" [")
        assert sentence.endswith((".", ".)")), (name, sentence)
        assert what.startswith(("loss ", "compare ")), name


def test_the_listing_wraps_without_cutting(capsys):
    configs = shipped_configs()
    whole = {name: describe(path) for name, path in configs.items()}
    width = max(map(len, configs))
    unwrapped = listing(None)  # not a terminal: one line per config (grep works)
    assert main(["configs"]) == 0
    assert capsys.readouterr().out.splitlines() == unwrapped
    assert unwrapped[: len(configs)] == [f"{n:<{width}}  {text}" for n, text in whole.items()]
    wrapped = listing(80)  # a terminal 80 columns wide
    assert all(len(line) <= 80 for line in wrapped)
    blocks: dict[str, list[str]] = {}
    for line in wrapped[: wrapped.index("")]:
        if line[:width].strip():
            blocks[line[:width].strip()] = []
        blocks[list(blocks)[-1]].append(line[width + 2 :])
    assert {name: " ".join(parts) for name, parts in blocks.items()} == whole
    assert "`vlret train NAME` trains one" in " ".join(wrapped)


# -- item 8: vlret configs copy into a bad folder -----------------------------------------------


def test_configs_copy_into_a_file_is_one_line_and_writes_nothing(tmp_path, capsys):
    """Before: "[Errno 17] File exists" (a file) / NotADirectoryError traceback (under it)."""
    target = write(tmp_path / "mine.toml", "# mine\n")
    assert main(["configs", "copy", "demo_tiny", str(target)]) == 2
    assert one_line_error(capsys, "configs copy") == (
        f"vlret configs copy: {target}: DIR is a file; expected a folder\n"
    )
    assert main(["configs", "copy", "demo_tiny", str(target / "sub")]) == 2
    assert "cannot be written" in one_line_error(capsys, "configs copy")
    assert target.read_text() == "# mine\n" and sorted(tmp_path.iterdir()) == [target]


def test_configs_copy_into_a_read_only_folder_is_one_line(tmp_path, capsys):
    """Before: a PermissionError / OSError(EROFS) traceback from the write."""
    with read_only_folder(tmp_path / "ro") as folder:
        assert main(["configs", "copy", "demo_tiny", str(folder)]) == 2
        err = one_line_error(capsys, "configs copy")
        assert f"{folder}: DIR cannot be written" in err
        assert main(["configs", "copy", "demo_tiny", str(folder / "new")]) == 2
        one_line_error(capsys, "configs copy")
        assert list(folder.iterdir()) == []


def test_configs_copy_still_copies_and_never_replaces(tmp_path, capsys):
    assert main(["configs", "copy", "demo_tiny", str(tmp_path / "a" / "b")]) == 0
    copied = tmp_path / "a" / "b" / "demo_tiny.toml"
    assert copied.read_text() == shipped_configs()["demo_tiny"].read_text()
    copied.write_text("# edited\n")
    capsys.readouterr()
    assert main(["configs", "copy", "demo_tiny", str(tmp_path / "a" / "b")]) == 2
    assert "exists; not replaced" in one_line_error(capsys, "configs copy")
    assert copied.read_text() == "# edited\n"
