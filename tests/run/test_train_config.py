"""Run configs: TOML and YAML, typed --set overrides, errors naming the file and the key."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from train_helpers import tiny_config, tiny_data, tiny_raw
from vlret.configs import shipped_configs
from vlret.data.writers import make_tiny_msrvtt
from vlret.models import build_model
from vlret.run.builders import check_model_config
from vlret.run.checkpoint import load_checkpoint
from vlret.run.config import (
    ConfigError,
    apply_overrides,
    config_from_dict,
    load_config,
    save_config,
)
from vlret.run.config_files import parse_value
from vlret.run.loss_builder import build_run_loss
from vlret.train import Trainer

#: Every run config the package ships: `vlret configs` lists each as one `vlret train NAME`
#: trains (a comparison config, the demo's included, its [loss]; test_demo runs their
#: [compare.losses]).
CONFIGS = list(shipped_configs().values())

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
        ("loss.margin=abc", "loss.margin", "expected a number"),
        ("loss.gamma=true", "loss.gamma", "expected a number"),
        ("loss.reduction=1", "loss.reduction", "expected a string"),
        ("loss.normalize=1", "loss.normalize", "true or false"),
        ("optim.grad_clip=-1", "optim.grad_clip", "0 or null: no clipping"),
        ("optim.decay_every=2", "optim.decay_every", "not both"),  # TOML lists decay_epochs
        ("optim.decay_every=-1", "optim.decay_every", "expected >= 0"),
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
    losses = set(cfg.loss.name.split("+"))  # a registered loss, or a combination of them
    shipped = {"triplet", "infonce", "unified", "goal", "vsl", "adacl", "cmpm", "sdm", "id", "mlm"}
    assert losses <= shipped | {"ssp", "rsp", "aoq", "uto"}
    check_model_config(cfg)  # e.g. a pair-scoring model with a loss that needs embeddings
    parts = (cfg.model, cfg.model.get("image"), cfg.model.get("text"))
    local = any(isinstance(part, dict) and part.get("path") for part in parts)
    local = local or cfg.model.get("kind") == "cvse"  # reads its concept folder (test_cvse.py)
    if cfg.model.get("kind") not in ("clip", "mmt") and not local:  # local directories: not here
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
    v = by_name["vsl_sgr_coco"]
    assert (v.optim.lr, v.train.batch_size, v.loss.params["beta"]) == (3e-4, 128, 10.0)
    assert (v.model["kind"], v.model["module"], v.model["embed_dim"]) == ("sgraf", "sgr", 2048)
    # VSL IV-A on F30K: SGR 25 + 20 epochs, SAF 10 + 15
    for module, decay, epochs in (("sgr", [25], 45), ("saf", [10], 25)):
        f = by_name[f"vsl_{module}_f30k"]
        assert (f.optim.decay_epochs, f.train.epochs, f.model["module"]) == (decay, epochs, module)
    c = by_name["clip_unified_f30k"]
    assert (c.loss.params["gamma"], c.train.epochs, c.train.batch_size) == (50.0, 10, 128)
    for data in ("coco", "f30k"):  # VSE-infinity's warm-up, kept when GOAL replaces the loss
        for loss in ("triplet", "goal"):
            assert by_name[f"goal_vseinf_{data}_{loss}"].train.all_negatives_epochs == 1
    for data in ("coco", "f30k"):
        # VSL's alpha = 1, beta = 10 balance a triplet base summed over the batch (B = 128)
        vsl = by_name[f"vsl_saf_{data}"].loss.params
        assert vsl["base_params"] == {"margin": 0.2, "hardest": True}
        # the VSE++ group's gamma = 60, summed over the batch like the VLC (Unified Eq. 3, 7)
        nce = by_name[f"vsepp_butd_{data}_infonce"].loss.params
        assert nce == {"temperature": 1 / 60, "reduction": "sum"}


def test_yaml_reads_exponent_floats_without_a_dot(tmp_path):
    text = YAML.replace("lr: 0.0005", "lr: 1e-3").replace("margin: 0.2", "margin: 2E-1")
    cfg = load_config(write(tmp_path, "a.yaml", text))
    assert cfg.optim.lr == 1e-3 and cfg.loss.params["margin"] == 0.2
    quoted = load_config(write(tmp_path, "b.yaml", YAML), ["loss.reduction=sum"])
    assert quoted.loss.params["reduction"] == "sum"
    text = YAML.replace("margin: 0.2", 'margin: "1e-3"')  # quoted: a string, rejected
    with pytest.raises(ConfigError, match=r"c\.yaml: loss\.margin: expected a number") as err:
        load_config(write(tmp_path, "c.yaml", text))
    assert err.value.key == "loss.margin"


def test_loss_parameters_are_type_checked_against_the_defaults(tmp_path):
    path = write(tmp_path, "run.toml", TOML)
    cfg = load_config(path, ["loss.margin=1", "loss.gamma=50", "loss.reduction=mean"])
    assert cfg.loss.params == {"margin": 1, "gamma": 50, "reduction": "mean"}  # ints are numbers
    raw = load_config(path).to_dict()
    raw["loss"] = {"name": "adacl", "top_k": 5, "queue_size": 8}  # top_k's default is None
    assert config_from_dict(raw).loss.params == {"top_k": 5, "queue_size": 8}
    raw["loss"]["queue_size"] = 8.5
    with pytest.raises(ConfigError, match="loss.queue_size: expected an integer"):
        config_from_dict(raw)
    # a nested loss's parameters are checked as that loss's (VSL's own check), keyed in full
    raw["loss"] = {"name": "vsl", "base_params": {"margin": "x"}}
    with pytest.raises(ConfigError, match="base_params.margin must be a finite number") as err:
        config_from_dict(raw)
    assert err.value.key == "loss.base_params.margin"
    raw["loss"] = {"name": "vsl", "base_params": {"gama": 1.0}}
    with pytest.raises(ConfigError, match="unknown parameter.*gama for loss 'triplet'") as err:
        config_from_dict(raw)
    assert err.value.key == "loss.base_params.gama"
    raw["loss"] = {"name": "vsl", "base_params": [0.2]}
    with pytest.raises(ConfigError, match="base_params must be a dict") as err:
        config_from_dict(raw)
    assert err.value.key == "loss.base_params"


def test_grad_clip_zero_or_null_disables_clipping(tmp_path):
    path = write(tmp_path, "run.toml", TOML)
    assert load_config(path, ["optim.grad_clip=0"]).optim.grad_clip == 0.0
    assert load_config(path, ["optim.grad_clip=null"]).optim.grad_clip is None


def test_msrvtt_1ka_has_no_dev_split(tmp_path):
    path = write(tmp_path, "run.toml", TOML)
    msrvtt = ["data.format=msrvtt", "data.protocol=1k-A"]
    assert load_config(path, msrvtt).data.dev_split is None  # default: no validation
    assert load_config(path, ["data.format=msrvtt"]).data.dev_split == "dev"  # full: validate
    assert load_config(path, [*msrvtt, "data.dev_split=test"]).data.dev_split == "test"
    with pytest.raises(ConfigError, match="no 'dev' split") as err:
        load_config(path, [*msrvtt, "data.dev_split=dev"])
    assert err.value.key == "data.dev_split" and "data.dev_split = null" in str(err.value)
    assert load_config(path, [*msrvtt, "data.dev_split=dev", "train.validate=false"])
    with pytest.raises(ConfigError, match="data.protocol: protocol must be one of"):
        load_config(path, ["data.format=msrvtt", "data.protocol=2k"])


@pytest.mark.parametrize(
    ("loss", "accepted"),
    [
        ({"name": "adacl", "queue_size": 8}, True),
        ({"name": "adacl"}, False),  # no queue to fill: queue_size defaults to 0
        ({"name": "unified"}, False),
    ],
)
def test_momentum_encoder_needs_a_loss_whose_queue_takes_momentum_keys(tmp_path, loss, accepted):
    raw = load_config(write(tmp_path, "run.toml", TOML)).to_dict()
    raw["loss"], raw["train"]["momentum_encoder"] = loss, 0.99
    if accepted:
        assert config_from_dict(raw).train.momentum_encoder == 0.99
        return
    with pytest.raises(ConfigError, match="only used to fill a memory queue") as err:
        config_from_dict(raw)
    assert err.value.key == "train.momentum_encoder"


# --- the config's effect on the trainer -----------------------------------------------------


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return tiny_data(tmp_path_factory.mktemp("data"))


@pytest.mark.parametrize(("hardest", "schedule"), [(None, [False, True]), (False, [False, False])])
def test_all_negatives_schedule_respects_loss_hardest(tmp_path, tiny, hardest, schedule):
    loss = {} if hardest is None else {"hardest": hardest}
    cfg = tiny_config(tiny, tmp_path / "run", ["train.all_negatives_epochs=1"], **loss)
    trainer = Trainer(cfg)
    seen = []
    for epoch in (0, 1):
        trainer.epoch = epoch
        trainer.hooks.before_epoch(trainer.context)
        seen.append(trainer.loss_fn.hardest)
    assert seen == schedule


def test_model_errors_name_the_model_key_before_the_vocabulary(tmp_path, tiny, monkeypatch):
    import vlret.train.trainer as trainer_module

    def no_vocab(*args, **kwargs):
        raise AssertionError("the vocabulary was built before the model section was checked")

    monkeypatch.setattr(trainer_module, "build_encoder", no_vocab)
    cfg = tiny_config(tiny, tmp_path / "run", ["model.image.pooling=maxx"])
    with pytest.raises(ConfigError, match="model.image.pooling: unknown pooling") as err:
        Trainer(cfg)
    assert err.value.key == "model.image.pooling"
    with pytest.raises(ConfigError, match="model: unknown key 'bogus'"):
        Trainer(tiny_config(tiny, tmp_path / "run", ["model.bogus=1"]))


def test_type_errors_of_loss_construction_name_the_loss(tmp_path, tiny, monkeypatch):
    import vlret.losses

    def build_loss(name, **params):
        raise TypeError("unsupported operand")

    monkeypatch.setattr(vlret.losses, "build_loss", build_loss)
    cfg = tiny_config(tiny, tmp_path / "run", ["loss.margin=0.3"])
    with pytest.raises(ConfigError, match=r"loss: triplet\(margin=0.3\): unsupported operand"):
        build_run_loss(cfg, None)


def test_msrvtt_1ka_trains_without_validation(tmp_path):
    root = tmp_path / "msrvtt"
    make_tiny_msrvtt(root, sizes={"train": 4, "validate": 2, "test": 3}, captions_per_video=4)
    raw = tiny_raw(root, tmp_path / "run")
    raw["data"].update(format="msrvtt", protocol="1k-A", captions_per_video=4)
    raw["model"]["image"] = {"kind": "video", "in_dim": 8, "pooling": "mean"}
    raw["train"]["epochs"] = 2
    result = Trainer(config_from_dict(raw)).fit()
    assert result.best_rsum is None and result.best_checkpoint == tmp_path / "run" / "best.pt"
    best = load_checkpoint(tmp_path / "run" / "best.pt")
    last = load_checkpoint(result.last_checkpoint)
    assert best["epoch"] == last["epoch"] == 2  # best.pt is the last epoch
    assert all(torch.equal(v, last["model"][k]) for k, v in best["model"].items())


def test_train_accepts_and_ignores_a_compare_section(tmp_path, tiny, capsys):
    import yaml

    from vlret.cli import main

    compare = '\n[compare]\nseeds = 3\n\n[compare.losses.triplet-hn]\nname = "triplet"\n'
    path = write(tmp_path, "c.toml", TOML + compare)
    plain = load_config(write(tmp_path, "p.toml", TOML))
    assert load_config(path).to_dict() == plain.to_dict()
    with pytest.raises(ConfigError, match="compare: expected a table"):
        load_config(write(tmp_path, "bad.toml", 'compare = "x"\n' + TOML))
    # `vlret train` on a compare config: trains, and the saved config has no [compare]
    raw = tiny_raw(tiny, tmp_path / "run")
    raw["train"]["epochs"] = 1
    raw["compare"] = {"seeds": 2, "losses": {"unified": {"gamma": 30.0}}}
    cfg = tmp_path / "cmp.yaml"
    cfg.write_text(yaml.safe_dump(raw), encoding="utf-8")
    assert main(["train", str(cfg)]) == 0
    assert "done: 1 epoch" in capsys.readouterr().out
    saved = yaml.safe_load((tmp_path / "run" / "config.yaml").read_text(encoding="utf-8"))
    assert "compare" not in saved and saved["loss"]["name"] == "triplet"


@pytest.mark.parametrize(
    "name",
    [
        "scan_t2i_f30k_unified",
        "scan_i2t_f30k_unified",
        "scan_t2i_coco_unified",
        "scan_i2t_coco_unified",
    ],
)
def test_scan_unified_configs_use_the_schedule_of_unified_b13(name):
    """Unified appendix B.1.3: SCAN "is trained using Adam for 30 epochs, with a batch size of 128
    for both datasets. The initial learning rate ... 0.0005 for first 15 epochs, and then decays
    by a factor of 10" (the configs used SCAN's own 2e-4, saying the paper gave no schedule)."""
    from vlret.run import load_config

    config = load_config(name)
    optim, train = config.optim, config.train
    assert (optim.name, optim.lr, optim.decay_epochs, optim.decay_factor) == (
        "adam",
        5e-4,
        [15],
        0.1,
    )
    assert (train.epochs, train.batch_size) == (30, 128)
    assert (config.loss.name, config.loss.params["margin"], config.loss.params["gamma"]) == (
        "unified",
        0.2,
        50.0,
    )


@pytest.mark.parametrize("data", ["cc3m", "cc12m"])
def test_adacl_table2_configs_pretrain_clip_b32_with_open_clips_defaults(data):
    """AdaCL Table 2: CLIP ViT-B/32 from scratch, 32 epochs, four V100s x 64; InfoNCE with a
    learnable temperature from 0.07 against AdaCL (4.1's settings); open_clip's optimiser."""
    from vlret.run import load_config

    samples = {"cc3m": 2905954, "cc12m": 10968539}[data]
    nce = load_config(f"adacl_clip_{data}_infonce")
    ada = load_config(f"adacl_clip_{data}_adacl")
    for c in (nce, ada):
        assert (c.model["kind"], c.model["preset"], c.data.format) == (
            "clip",
            "ViT-B-32",
            "webdataset",
        )
        assert (c.train.epochs, c.train.batch_size, c.data.train_num_samples) == (32, 256, samples)
        o = c.optim
        assert (o.name, o.lr, o.betas, o.weight_decay) == ("adamw", 5e-4, [0.9, 0.98], 0.2)
        assert (o.schedule, o.warmup_steps, o.no_decay) == ("cosine", 10000, None)
        assert (c.data.crop_scale, c.data.crop_interpolation) == ([0.9, 1.0], "bicubic")
        assert c.data.tokenizer and c.train.amp == "fp16"
        assert (c.train.zeroshot_every, c.train.zeroshot_dataset) == (2, "imagenet1k")
        # only the loss (and AdaCL's momentum key encoder) differs between the two rows
        assert {
            k: v for k, v in c.to_dict().items() if k not in ("loss", "train", "output_dir")
        } == {k: v for k, v in nce.to_dict().items() if k not in ("loss", "train", "output_dir")}
    assert nce.loss.params == {"temperature": 0.07, "learnable_temperature": True}
    p = ada.loss.params
    assert (p["m1_init"], p["m2_init"], p["p_u"], p["queue_size"]) == (20.0, 0.1, 0.03, 4096)
    assert p["embed_dim"] == 512 and ada.train.momentum_encoder == 0.99


@pytest.mark.parametrize("data", ["f30k", "coco"])
@pytest.mark.parametrize("backbone", ["resnet152", "vitb16"])
def test_goal_vsepp_configs_run_vsepps_two_steps(backbone, data):
    """GOAL Tables 3-4: VSE++ (its paper's settings) with a ResNet-152 / ViT-B/16 backbone in
    two steps: 30 epochs with the backbone frozen (lr 2e-4, x0.1 at 15), then 15 fine-tuning
    everything at 2e-5; triplet-HN m = 0.2 against GOAL cir x sig-ms."""
    from vlret.run import load_config

    kind = {"resnet152": "resnet", "vitb16": "vit"}[backbone]
    by_loss = {k: load_config(f"goal_vsepp_{backbone}_{data}_{k}") for k in ("triplet", "goal")}
    for c in by_loss.values():
        assert (c.model["image"]["kind"], c.model["embed_dim"]) == (kind, 1024)
        assert c.model["text"] == {
            "kind": "gru",
            "word_dim": 300,
            "bidirectional": False,
            "pooling": "last",
        }
        o, t = c.optim, c.train
        assert (o.name, o.lr, o.decay_epochs, o.decay_factor, o.grad_clip) == (
            "adam",
            2e-4,
            [15],
            0.1,
            2.0,
        )
        assert (t.batch_size, t.epochs, t.freeze, t.freeze_epochs) == (
            128,
            45,
            ["image_encoder.backbone"],
            30,
        )
        lr = [o.lr * o.decay_factor ** sum(e >= d for d in o.decay_epochs) for e in range(45)]
        assert lr[t.freeze_epochs] == pytest.approx(2e-5, rel=1e-12)  # step 2's lr
        assert (c.data.train_transform, c.data.hflip, c.train.freeze_bn) == (
            "random_resized_crop",
            True,
            "train",
        )
    assert by_loss["triplet"].loss.params == {"margin": 0.2, "hardest": True}
    assert by_loss["goal"].loss.params == {
        "triplet_weight": "cir",
        "pair_weight": "sig-ms",
        "margin": 0.2,
    }


@pytest.mark.parametrize("name", ["f30k_triplet", "f30k_goal", "coco_triplet", "coco_goal"])
def test_goal_vseinf_configs_train_bert_at_a_tenth_of_the_lr(name):
    """GOAL Table 5 / VSE-infinity (BUTD): BERT-base + GPO text whose parameters train at 0.1x
    the learning rate (lr 5e-4, AdamW weight decay 1e-4, 25 epochs, x0.1 at 15)."""
    from vlret.run import load_config

    c = load_config(f"goal_vseinf_{name}")
    assert (c.model["text"]["kind"], c.model["text"]["pooling"]) == ("bert", "gpo")
    assert c.model["image"]["pooling"] == "gpo" and c.model["image"]["region_dropout"] == 0.2
    assert c.optim.lr_multipliers == {"text_encoder.bert": 0.1}
    assert (c.optim.name, c.optim.lr, c.optim.weight_decay, c.optim.no_decay) == (
        "adamw",
        5e-4,
        1e-4,
        [],
    )
    assert (c.optim.decay_epochs, c.train.epochs, c.train.all_negatives_epochs) == ([15], 25, 1)


@pytest.mark.parametrize("data", ["f30k", "coco"])
def test_clip_vlc_configs_are_clip_unified_with_the_vlc_loss(data):
    """Unified Table 2, CLIP + VLC: as clip_unified_* (B.1.2) but the VLC loss of Eq. (3), i.e.
    InfoNCE at gamma = 50 (temperature 1/50), summed over the batch."""
    from vlret.run import load_config

    vlc, uni = (
        load_config(f"clip_vlc_{data}").to_dict(),
        load_config(f"clip_unified_{data}").to_dict(),
    )
    assert vlc["loss"] == {"name": "infonce", "temperature": 1 / 50, "reduction": "sum"}
    for key in ("data", "model", "optim", "train"):
        assert vlc[key] == uni[key], key


def test_synth_vsepp_resnet_compare_is_a_small_two_step_resnet():
    """docs/results.md (b): a random-init ResNet of the resnet-152 design, small enough to train
    in about a minute on 2 CPU cores; two steps; triplet-HN against GOAL (cir, sig-ms)."""
    import tomllib

    from vlret.configs import shipped_config
    from vlret.run import load_config

    c = load_config("synth_vsepp_resnet_compare")
    model = build_model(c.model, vocab_size=20)
    assert sum(p.numel() for p in model.image_encoder.backbone.parameters()) < 100_000
    assert c.train.freeze == ["image_encoder.backbone"] and c.optim.decay_epochs == [
        c.train.freeze_epochs
    ]
    path = shipped_config("synth_vsepp_resnet_compare")
    assert path is not None
    compare = tomllib.loads(path.read_text(encoding="utf-8"))["compare"]
    assert compare["seeds"] == 3 and set(compare["losses"]) == {"triplet-hn", "goal"}
