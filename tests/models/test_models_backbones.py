"""Backbones from pixels: the real-size presets counted on the meta device against analytic
parameter counts, tiny random builds forward and backward, the module names train.freeze and
optim.lr_multipliers resolve, checkpoint round trips, the byte tokenizer, and one-line errors
for missing or wrong directories."""

from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from torch import nn

from vlret.data import RetrievalBatch
from vlret.data.config import DataConfig
from vlret.models import build_model
from vlret.models.backbones import IMAGENET_MEAN, IMAGENET_STD, BackboneImageEncoder
from vlret.models.clip import CLIPByteTokenizer
from vlret.run.builders import build_encoder, encoder_from_state, encoder_state
from vlret.run.config import ConfigError
from vlret.train.hooks.core import FreezeModules, LrMultipliers, param_groups

transformers = pytest.importorskip("transformers")
Image = pytest.importorskip("PIL.Image")

TINY_CLIP = {
    "projection_dim": 12,
    "text_config": {
        "vocab_size": 260,
        "hidden_size": 16,
        "intermediate_size": 24,
        "num_hidden_layers": 1,
        "num_attention_heads": 2,
        "max_position_embeddings": 10,
        "bos_token_id": 256,
        "eos_token_id": 257,
    },
    "vision_config": {
        "hidden_size": 16,
        "intermediate_size": 24,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "image_size": 16,
        "patch_size": 8,
    },
}
TINY_RESNET = {"depths": [1, 1], "hidden_sizes": [8, 16], "embedding_size": 8}
TINY_VIT = {
    "hidden_size": 16,
    "num_hidden_layers": 1,
    "num_attention_heads": 2,
    "intermediate_size": 24,
    "image_size": 16,
    "patch_size": 8,
}


def count(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def transformer_layers(width: int, mlp: int, layers: int) -> int:
    ln = 2 * width
    attention = 4 * (width * width + width)
    return layers * (2 * ln + attention + width * mlp + mlp + mlp * width + width)


def clip_vit_b32_count() -> int:
    """OpenAI's ViT-B/32 without logit_scale, from the architecture's description."""
    vision = 3 * 32 * 32 * 768 + 768 + (7 * 7 + 1) * 768  # patch conv (no bias), class, pos
    vision += 2 * 768 + transformer_layers(768, 3072, 12) + 2 * 768  # pre / post layer norms
    text = 49408 * 512 + 77 * 512 + transformer_layers(512, 2048, 12) + 2 * 512
    return vision + 768 * 512 + text + 512 * 512  # projections without bias


def resnet152_count() -> int:
    """ResNet-152's convolutions and batch norms (bottlenecks 3-8-36-3), no classifier."""
    total = 3 * 64 * 7 * 7 + 2 * 64
    width_in = 64
    for blocks, out in zip((3, 8, 36, 3), (256, 512, 1024, 2048), strict=True):
        mid = out // 4
        for b in range(blocks):
            total += width_in * mid + 2 * mid + 9 * mid * mid + 2 * mid + mid * out + 2 * out
            if b == 0:  # projection shortcut (channels or stride change)
                total += width_in * out + 2 * out
            width_in = out
    return total


def vit_b16_count() -> int:
    embeddings = 3 * 16 * 16 * 768 + 768 + 768 + (14 * 14 + 1) * 768
    return embeddings + transformer_layers(768, 3072, 12) + 2 * 768


def test_real_presets_have_the_published_sizes_on_the_meta_device():
    with torch.device("meta"):
        clip = build_model({"kind": "clip", "preset": "ViT-B-32"})
        resnet = build_model(
            {"image": {"kind": "resnet", "preset": "resnet-152"}, "embed_dim": 1024}, vocab_size=9
        )
        vit = build_model(
            {"image": {"kind": "vit", "preset": "vit-b-16"}, "embed_dim": 1024}, vocab_size=9
        )
    assert count(clip) == clip_vit_b32_count() == 151_277_312  # open_clip: + logit_scale
    assert clip.embed_dim == 512 and clip.config["proj_dim"] is None
    assert clip.image_transform.crop == (224, 224)
    vision = clip.image_encoder.vision_model.config
    text = clip.text_encoder.text_model.config
    assert vision.hidden_act == text.hidden_act == "gelu"  # open_clip's, not quick_gelu
    assert (vision.hidden_size, vision.num_hidden_layers, vision.num_attention_heads) == (
        768,
        12,
        12,
    )
    assert (vision.patch_size, vision.image_size) == (32, 224)
    assert (text.hidden_size, text.num_hidden_layers, text.num_attention_heads) == (512, 12, 8)
    assert (text.max_position_embeddings, text.vocab_size) == (77, 49408)
    assert count(resnet.image_encoder.backbone) == resnet152_count() == 58_143_808
    assert count(vit.image_encoder.backbone) == vit_b16_count() == 85_798_656
    assert resnet.image_encoder.feature_dim == 2048 and vit.image_encoder.feature_dim == 768
    assert count(resnet.image_encoder.fc) == 2048 * 1024 + 1024


def pixels(n: int, size: int) -> torch.Tensor:
    return torch.randn(n, 3, size, size, generator=torch.Generator().manual_seed(n))


def tiny_clip(**extra):
    torch.manual_seed(0)
    return build_model({"kind": "clip", "preset": "ViT-B-32", "config": TINY_CLIP, **extra})


def test_tiny_clip_preset_forward_backward_and_byte_captions():
    model = tiny_clip(tokenizer="bytes")
    assert model.embed_dim == 12 and model.tokenizer_path is None
    tok = CLIPByteTokenizer.for_preset("ViT-B-32", TINY_CLIP)
    assert tok.encode("  A  Dog ") == [256, ord("a"), ord(" "), ord("d"), ord("o"), ord("g"), 257]
    assert tok.encode("é" * 20) == [256, *("é" * 4).encode(), 257]  # 10 ids, eos kept
    caps = [torch.tensor(tok.encode(t)) for t in ("a dog", "two red cats on a mat", "x")]
    ids = nn.utils.rnn.pad_sequence(caps, batch_first=True, padding_value=tok.pad_id)
    lens = torch.tensor([len(c) for c in caps])
    images = [Image.new("RGB", (20 + k, 16), (40 * k, 90, 200)) for k in range(3)]
    batch = RetrievalBatch(images, ids, lens, torch.arange(3), torch.arange(3))
    img, txt = model(batch)
    assert img.shape == txt.shape == (3, 12)
    (img @ txt.T).sum().backward()
    assert not [n for n, p in model.named_parameters() if p.grad is None]
    # CLIP's own projection (no added layer): the text embedding is get_text_features'
    hf = transformers.CLIPModel(transformers.CLIPConfig(**TINY_CLIP, **{}))
    hf.text_model, hf.text_projection = (
        model.text_encoder.text_model,
        model.text_encoder.text_projection,
    )
    with torch.no_grad():
        alone = hf.get_text_features(input_ids=caps[1][None])
        alone = alone if isinstance(alone, torch.Tensor) else alone.pooler_output
        assert torch.allclose(model.encode_texts(ids, lens)[1], alone[0], atol=1e-5)


@pytest.mark.parametrize(("kind", "overrides"), [("resnet", TINY_RESNET), ("vit", TINY_VIT)])
def test_tiny_backbones_forward_backward_match_the_hf_model(kind, overrides):
    torch.manual_seed(0)
    preset = {"resnet": "resnet-152", "vit": "vit-b-16"}[kind]
    image = {"kind": kind, "preset": preset, "config": overrides, "image_size": 16}
    model = build_model({"image": image, "embed_dim": 6}, vocab_size=9)
    encoder = model.image_encoder
    assert isinstance(encoder, BackboneImageEncoder)
    x = pixels(2, 16)
    out = model.encode_images(x)
    assert out.shape == (2, 6)
    out.sum().backward()
    grads = [n for n, p in encoder.named_parameters() if p.grad is None]
    assert not grads
    with torch.no_grad():
        encoder.eval()
        hidden = encoder.backbone(pixel_values=x)
        feature = (
            hidden.pooler_output.flatten(1) if kind == "resnet" else hidden.last_hidden_state[:, 0]
        )
        assert feature.shape == (2, 16)  # hidden_sizes[-1] / hidden_size
        expected = feature.double() @ encoder.fc.weight.double().T + encoder.fc.bias.double()
        assert torch.allclose(encoder(x).double(), expected, atol=1e-5)
    assert model.image_transform is encoder.transform


def naive_vsepp_transform(image, *, resize: int, crop: int, resample) -> torch.Tensor:
    w, h = image.size
    size = (resize, int(resize * h / w)) if w <= h else (int(resize * w / h), resize)
    resized = image.resize(size, resample=resample)
    left, top = int(round((size[0] - crop) / 2)), int(round((size[1] - crop) / 2))
    out = torch.empty(3, crop, crop, dtype=torch.float64)
    for c in range(3):
        for y in range(crop):
            for x in range(crop):
                value = resized.getpixel((left + x, top + y))[c] / 255.0
                out[c, y, x] = (value - IMAGENET_MEAN[c]) / IMAGENET_STD[c]
    return out


@pytest.mark.parametrize(("kind", "resample"), [("resnet", "BILINEAR"), ("vit", "BICUBIC")])
def test_backbone_transform_is_vsepp_resize_256_crop_224_scaled(kind, resample):
    preset = {"resnet": "resnet-152", "vit": "vit-b-16"}[kind]
    config = TINY_RESNET if kind == "resnet" else TINY_VIT
    image = {"kind": kind, "preset": preset, "config": config, "image_size": 14}
    transform = build_model({"image": image, "embed_dim": 4}, vocab_size=9).image_transform
    assert (transform.crop, transform.resize) == ((14, 14), 16)  # round(14 * 256 / 224)
    rng = np.random.default_rng(0)
    picture = Image.fromarray(rng.integers(0, 256, (21, 30, 3), dtype=np.uint8))
    expected = naive_vsepp_transform(picture, resize=16, crop=14, resample=getattr(Image, resample))
    assert torch.allclose(transform(picture).double(), expected, atol=1e-5)
    default = build_model(
        {"image": {"kind": kind, "preset": preset, "config": config}, "embed_dim": 4}, vocab_size=9
    ).image_transform
    assert default.crop == ((224, 224) if kind == "resnet" else (16, 16))


def test_freeze_and_lr_multiplier_names_resolve():
    image = {"kind": "resnet", "preset": "resnet-152", "config": TINY_RESNET, "image_size": 16}
    model = build_model({"image": image, "embed_dim": 4}, vocab_size=9)
    backbone = {id(p) for p in model.image_encoder.backbone.parameters()}
    hook = FreezeModules(model, ["image_encoder.backbone"], epochs=1)
    assert {id(p) for p in hook.params} == backbone
    nothing_locked = SimpleNamespace(train=SimpleNamespace(lock=[], freeze=[]), source="run")
    trainer = SimpleNamespace(model=model, loss_fn=nn.Module(), config=nothing_locked)
    groups = param_groups(trainer, LrMultipliers({"image_encoder.backbone": 0.01}))
    assert [g.lr_scale for g in groups] == [1.0, 0.01]
    assert {id(p) for p in groups[1].params} == backbone
    assert all(n.startswith("image_encoder.backbone.") for n in groups[1].names)
    assert "image_encoder.fc.weight" in groups[0].names
    clip = tiny_clip(tokenizer="bytes")
    hook = FreezeModules(clip, ["image_encoder.vision_model", "text_encoder.text_model"], epochs=1)
    towers = [
        *clip.image_encoder.vision_model.parameters(),
        *clip.text_encoder.text_model.parameters(),
    ]
    assert {id(p) for p in hook.params} == {id(p) for p in towers}


@pytest.mark.parametrize(
    "config",
    [
        {"kind": "clip", "preset": "ViT-B-32", "config": TINY_CLIP, "tokenizer": "bytes"},
        {"image": {"kind": "vit", "preset": "vit-b-16", "config": TINY_VIT}, "embed_dim": 4},
        {
            "image": {"kind": "resnet", "preset": "resnet-152", "config": TINY_RESNET},
            "embed_dim": 4,
        },
    ],
)
def test_preset_models_rebuild_from_their_stored_config(tmp_path, config):
    torch.manual_seed(1)
    model = build_model(config, vocab_size=9).eval()
    path = tmp_path / "ckpt.pt"
    torch.save({"config": json.loads(json.dumps(model.config)), "model": model.state_dict()}, path)
    state = torch.load(path, weights_only=True)
    torch.manual_seed(2)  # another random init, replaced by the stored weights
    rebuilt = build_model(state["config"], vocab_size=9).eval()
    rebuilt.load_state_dict(state["model"])
    assert rebuilt.config == model.config
    x = pixels(2, 16)
    with torch.no_grad():
        assert torch.equal(rebuilt.encode_images(x), model.encode_images(x))


def test_byte_tokenizer_is_chosen_checked_and_stored(tmp_path):
    data = DataConfig(root=str(tmp_path), format="karpathy")
    model = {"kind": "clip", "preset": "ViT-B-32", "config": TINY_CLIP}
    with pytest.raises(ConfigError, match=r"data.tokenizer.*model.tokenizer = \"bytes\""):
        build_encoder(data, model=model)
    tok = build_encoder(data, model={**model, "tokenizer": "bytes"})
    assert tok == CLIPByteTokenizer(bos_id=256, eos_id=257, context_length=10)
    assert encoder_from_state(encoder_state(tok, SimpleNamespace(data=data, model=model))) == tok
    small = {**model, "tokenizer": "bytes", "config": {"text_config": {"vocab_size": 200}}}
    with pytest.raises(ConfigError, match=r"model.config.text_config.*vocab_size 200"):
        build_encoder(data, model=small)
    real = build_encoder(data, model={"kind": "clip", "preset": "ViT-B-32", "tokenizer": "bytes"})
    assert (real.bos_id, real.eos_id, real.context_length) == (49406, 49407, 77)


@pytest.mark.parametrize(
    ("config", "error", "pattern"),
    [
        ({"kind": "clip"}, ValueError, r"exactly one of 'path'.*'preset'.*neither"),
        ({"kind": "clip", "path": "x", "preset": "ViT-B-32"}, ValueError, r"got both"),
        ({"kind": "clip", "preset": "ViT-B-16"}, ValueError, r"preset: unknown CLIP preset"),
        (
            {"kind": "clip", "preset": "ViT-B-32", "config": {"text_config": {"hiden_size": 8}}},
            ValueError,
            r"config.text_config: unknown key 'hiden_size' of transformers' CLIPTextConfig",
        ),
        ({"kind": "clip", "path": "x", "config": {"a": 1}}, ValueError, r"apply to a preset"),
        ({"kind": "clip", "path": "x", "tokenizer": "bytes"}, ValueError, r"is for a preset"),
        ({"image": {"kind": "resnet"}}, ValueError, r"exactly one of path.*neither"),
        ({"image": {"kind": "vit", "preset": "vit-l-14"}}, ValueError, r"unknown vit preset"),
        (
            {"image": {"kind": "resnet", "preset": "resnet-152", "config": {"depth": [1]}}},
            ValueError,
            r"config: unknown key 'depth' of transformers' ResNetConfig",
        ),
        ({"image": {"kind": "resnet", "path": "/nonexistent/r152"}}, FileNotFoundError, r"never"),
    ],
)
def test_bad_backbone_configs_are_one_line(config, error, pattern):
    with pytest.raises(error, match=pattern) as info:
        build_model(config, vocab_size=9)
    assert "\n" not in str(info.value)


def test_backbone_directories_load_locally_and_wrong_ones_are_named(tmp_path):
    torch.manual_seed(0)
    vit = transformers.ViTModel(transformers.ViTConfig(**TINY_VIT), add_pooling_layer=False)
    vit.save_pretrained(str(tmp_path / "vit"))
    (tmp_path / "vit" / "preprocessor_config.json").write_text(
        json.dumps({"image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5]})
    )
    model = build_model(
        {"image": {"kind": "vit", "path": tmp_path / "vit"}, "embed_dim": 4}, vocab_size=9
    )
    assert torch.equal(model.image_encoder.backbone.embeddings.cls_token, vit.embeddings.cls_token)
    assert model.image_transform.mean.tolist() == [0.5, 0.5, 0.5]
    assert model.config["image"]["path"] == str(tmp_path / "vit")
    with pytest.raises(ValueError, match=r"config.json: model_type is 'vit'; expected 'resnet'"):
        build_model({"image": {"kind": "resnet", "path": tmp_path / "vit"}}, vocab_size=9)
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match=r"empty/config.json: missing"):
        build_model({"image": {"kind": "vit", "path": tmp_path / "empty"}}, vocab_size=9)
    with pytest.raises(FileNotFoundError, match=r"absent: missing.*never downloads"):
        build_model({"kind": "clip", "path": tmp_path / "absent"})


def test_preset_clip_trains_and_evaluates_from_its_checkpoint(tmp_path):
    """vlret train of a tiny preset CLIP with byte captions, then its checkpoint alone (no
    directory) rebuilds the model and the tokenizer that vlret eval scores with."""
    yaml = pytest.importorskip("yaml")
    from vlret.cli import main
    from vlret.data.writers import make_tiny_karpathy
    from vlret.run.builders import load_trained_model

    data = tmp_path / "d"
    splits = {"train": 4, "val": 2, "test": 2}
    make_tiny_karpathy(
        data / "dataset_f30k.json", dataset="f30k", splits=splits, image_root=data / "images"
    )
    model = {"kind": "clip", "preset": "ViT-B-32", "config": TINY_CLIP, "tokenizer": "bytes"}
    config = {
        "output_dir": str(tmp_path / "run"),
        "data": {
            "root": str(data),
            "format": "karpathy",
            "karpathy_json": str(data / "dataset_f30k.json"),
            "image_root": str(data / "images"),
            "dev_split": "val",
        },
        "model": model,
        "loss": {"name": "infonce"},
        "optim": {"name": "adamw", "lr": 1e-3},
        "train": {"epochs": 1, "batch_size": 5, "seed": 0, "progress": False},
    }
    (tmp_path / "run.yaml").write_text(yaml.safe_dump(config))
    assert main(["train", str(tmp_path / "run.yaml")]) == 0
    trained, run, encoder = load_trained_model(tmp_path / "run" / "best.pt")
    assert encoder == CLIPByteTokenizer(bos_id=256, eos_id=257, context_length=10)
    assert trained.config["path"] is None and trained.config["preset"] == "ViT-B-32"
    out = tmp_path / "m.json"
    argv = ["eval", str(tmp_path / "run" / "best.pt"), "--data", str(data), "--split", "test"]
    assert main([*argv, "--protocol", "f30k", "--json", str(out)]) == 0
    assert json.loads(out.read_text())["protocol"] == "f30k"
