"""Run configs: TOML and YAML, typed --set overrides, errors naming the file and the key."""

from __future__ import annotations

from pathlib import Path

import pytest

from vlret.models import build_model
from vlret.train.config import (
    ConfigError,
    apply_overrides,
    config_from_dict,
    load_config,
    parse_value,
    save_config,
)

CONFIGS = sorted((Path(__file__).resolve().parents[1] / "configs").glob("*.toml"))

TOML = """
output_dir = "runs/x"

[data]
root = "data/f30k"
format = "precomp"

[model]
embed_dim = 64
image = { kind = "precomp", in_dim = 16, pooling = "max" }
text = { kind = "gru", word_dim = 8, bidirectional = true }

[loss]
name = "unified"
margin = 0.2
gamma = 60.0

[optim]
name = "adam"
lr = 5e-4
decay_epochs = [10]

[train]
epochs = 20
batch_size = 128
seed = 0
"""

YAML = """
output_dir: runs/x
data: {root: data/f30k, format: precomp}
model:
  embed_dim: 64
  image: {kind: precomp, in_dim: 16, pooling: max}
  text: {kind: gru, word_dim: 8, bidirectional: true}
loss: {name: unified, margin: 0.2, gamma: 60.0}
optim: {name: adam, lr: 0.0005, decay_epochs: [10]}
train: {epochs: 20, batch_size: 128, seed: 0}
"""


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_toml_and_yaml_give_the_same_config(tmp_path):
    a = load_config(write(tmp_path, "a.toml", TOML))
    b = load_config(write(tmp_path, "b.yaml", YAML))
    assert a.to_dict() == b.to_dict()
    assert a.loss.name == "unified" and a.loss.params == {"margin": 0.2, "gamma": 60.0}
    assert a.optim.lr == 5e-4 and a.optim.decay_epochs == [10] and a.optim.grad_clip == 2.0
    assert a.train.batch_size == 128 and a.data.dev_max_images == 1000


def test_overrides_are_typed(tmp_path):
    cfg = load_config(
        write(tmp_path, "a.toml", TOML),
        [
            "optim.lr=1e-4",
            "train.epochs=3",
            "optim.decay_epochs=[1, 2]",
            "train.amp=false",
            "loss.margin=0.1",
            "data.vocab=null",
            "output_dir=elsewhere",
            "model.image.pooling=mean",
            "optim.name=adamw",
        ],
    )
    assert cfg.optim.lr == 1e-4 and isinstance(cfg.train.epochs, int) and cfg.train.epochs == 3
    assert cfg.optim.decay_epochs == [1, 2] and cfg.train.amp is False
    assert cfg.loss.params["margin"] == 0.1 and cfg.data.vocab is None
    assert cfg.output_dir == "elsewhere" and cfg.model["image"]["pooling"] == "mean"
    assert cfg.optim.name == "adamw"


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("3", 3),
        ("1e-4", 1e-4),
        ("true", True),
        ("False", False),
        ("[1, 2]", [1, 2]),
        ("adam", "adam"),
        ('"12"', "12"),
        ("none", None),
        ("{a = 1}", {"a": 1}),
        ("a/b.c", "a/b.c"),
    ],
)
def test_parse_value(text, value):
    assert parse_value(text) == value


@pytest.mark.parametrize(
    ("override", "key", "words"),
    [
        ("train.epoch=3", "train.epoch", "unknown key"),
        ("train.epochs=three", "train.epochs", "expected an integer"),
        ("optim.lr=fast", "optim.lr", "expected a number"),
        ("loss.gama=50", "loss.gama", "not a parameter of loss 'unified'"),
        ("loss.name=nope", "loss.name", "unknown loss"),
        ("optim.name=rmsprop", "optim.name", "expected one of"),
        ("data.format=hdf5", "data.format", "expected one of"),
        ("train.all_negatives_epochs=1", "train.all_negatives_epochs", "triplet"),
        ("train.amp=3", "train.amp", "true or false"),
    ],
)
def test_errors_name_the_file_and_key(tmp_path, override, key, words):
    path = write(tmp_path, "run.toml", TOML)
    with pytest.raises(ConfigError) as err:
        load_config(path, [override])
    assert str(path) in str(err.value) and key in str(err.value) and words in str(err.value)
    assert err.value.key == key


def test_missing_keys_and_sections(tmp_path):
    raw = load_config(write(tmp_path, "a.toml", TOML)).to_dict()
    del raw["train"]["batch_size"]
    with pytest.raises(ConfigError, match=r"x\.toml: train\.batch_size: required"):
        config_from_dict(raw, source="x.toml")
    raw = load_config(write(tmp_path, "b.toml", TOML)).to_dict()
    del raw["output_dir"]
    with pytest.raises(ConfigError, match="output_dir"):
        config_from_dict(raw, source="x.toml")
    with pytest.raises(ConfigError, match="unknown section"):
        apply_overrides({}, ["trian.epochs=3"])
    with pytest.raises(ConfigError, match="cannot parse"):
        load_config(write(tmp_path, "bad.toml", "[train\nepochs = 1"))
    with pytest.raises(ConfigError, match="cannot parse"):
        load_config(write(tmp_path, "bad.yaml", "train: [1, 2"))
    with pytest.raises(FileNotFoundError, match="missing.toml"):
        load_config(tmp_path / "missing.toml")


def test_yaml_is_read_safely(tmp_path):
    path = write(tmp_path, "evil.yaml", "output_dir: !!python/object/apply:os.getcwd []\n")
    with pytest.raises(ConfigError, match="cannot parse"):
        load_config(path)


def test_resolved_config_round_trips(tmp_path):
    cfg = load_config(write(tmp_path, "a.toml", TOML), ["loss.gamma=50"])
    saved = save_config(cfg, tmp_path / "config.yaml")
    assert load_config(saved).to_dict() == cfg.to_dict()


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_shipped_configs_are_valid(path):
    cfg = load_config(path)
    assert cfg.loss.name in {"triplet", "infonce", "unified", "goal", "vsl", "adacl"}
    if cfg.model.get("kind") != "clip":  # CLIP needs a local pretrained directory
        model = build_model(cfg.model, vocab_size=20)
        assert model.embed_dim == cfg.model["embed_dim"]


def test_paper_settings_in_configs():
    by_name = {p.stem: load_config(p) for p in CONFIGS}
    assert len(CONFIGS) >= 16
    u = by_name["vsepp_butd_coco_unified"]
    assert (u.loss.params, u.optim.lr, u.optim.decay_epochs, u.train.epochs) == (
        {"margin": 0.2, "gamma": 60.0},
        5e-4,
        [10],
        20,
    )
    a = by_name["adacl_f30k"]
    assert (
        a.train.batch_size,
        a.optim.lr,
        a.model["embed_dim"],
        a.loss.params["queue_size"],
        a.train.momentum_encoder,
    ) == (64, 2e-4, 256, 4096, 0.99)
    v = by_name["vsl_sgraf_coco"]
    assert (v.optim.lr, v.train.batch_size, v.loss.params["beta"]) == (3e-4, 128, 10.0)
    c = by_name["clip_unified_f30k"]
    assert (c.loss.params["gamma"], c.train.epochs, c.train.batch_size) == (50.0, 10, 128)
    assert by_name["goal_vseinf_f30k_triplet"].train.all_negatives_epochs == 1
