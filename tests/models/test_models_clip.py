"""CLIP: PIL/numpy preprocessing against per-pixel loops, a tiny local CLIPModel with the
added embedding layers (Unified paper B.1.2)."""

from __future__ import annotations

import json

import pytest
import torch

from vlret.data import RetrievalBatch
from vlret.models import build_model
from vlret.models.clip import CLIP_MEAN, CLIP_STD, CLIPImageTransform, load_clip

Image = pytest.importorskip("PIL.Image")
transformers = pytest.importorskip("transformers")

EOS, PROJ = 3, 12


def tiny_image(width: int, height: int, mode: str = "RGB"):
    image = Image.new("RGB", (width, height))
    for x in range(width):
        for y in range(height):
            image.putpixel(
                (x, y), ((37 * x + 11 * y) % 256, (5 * x * y + 90) % 256, (200 - 9 * y) % 256)
            )
    return image.convert(mode)


def naive_normalised(image, left: int, top: int, size: int) -> torch.Tensor:
    out = torch.empty(3, size, size)
    for c in range(3):
        for y in range(size):
            for x in range(size):
                value = image.getpixel((left + x, top + y))[c]
                out[c, y, x] = (value / 255.0 - CLIP_MEAN[c]) / CLIP_STD[c]
    return out


def test_preprocessing_equals_per_pixel_computation_without_resize():
    image = tiny_image(6, 4)  # shorter side already 4: only the center crop applies
    got = CLIPImageTransform(4)(image)
    assert got.dtype == torch.float32 and got.shape == (3, 4, 4)
    assert torch.allclose(got, naive_normalised(image, 1, 0, 4), atol=1e-6)


@pytest.mark.parametrize(("width", "height"), [(10, 5), (5, 9)])
def test_preprocessing_resizes_the_shorter_side_then_crops(width, height):
    image = tiny_image(width, height)
    short, long = min(width, height), max(width, height)
    new_long = int(4 * long / short)
    size = (new_long, 4) if width > height else (4, new_long)
    resized = image.resize(size, resample=Image.BICUBIC)
    offset = int(round((new_long - 4) / 2))
    left, top = (offset, 0) if width > height else (0, offset)
    got = CLIPImageTransform(4)(image)
    assert torch.allclose(got, naive_normalised(resized, left, top, 4), atol=1e-6)


def test_preprocessing_accepts_paths_and_other_modes(tmp_path):
    path = tmp_path / "img.png"
    tiny_image(7, 7, "RGBA").save(path)
    transform = CLIPImageTransform(4, resize=5)
    from_path = transform(path)
    assert torch.equal(from_path, transform(Image.open(path)))
    gray = transform(tiny_image(5, 5, "L"))
    assert torch.allclose(
        gray[0] * CLIP_STD[0] + CLIP_MEAN[0], gray[1] * CLIP_STD[1] + CLIP_MEAN[1]
    )
    with pytest.raises(ValueError, match="PIL image or a path"):
        transform(torch.zeros(3, 4, 4))


@pytest.fixture(scope="module")
def clip_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny_clip")
    config = transformers.CLIPConfig(
        text_config=dict(
            vocab_size=16,
            hidden_size=16,
            intermediate_size=24,
            num_hidden_layers=1,
            num_attention_heads=2,
            max_position_embeddings=12,
            bos_token_id=1,
            eos_token_id=EOS,
            pad_token_id=0,
        ),
        vision_config=dict(
            image_size=8,
            patch_size=4,
            hidden_size=16,
            intermediate_size=24,
            num_hidden_layers=1,
            num_attention_heads=2,
        ),
        projection_dim=PROJ,
    )
    torch.manual_seed(0)
    transformers.CLIPModel(config).save_pretrained(str(path))
    # OpenAI's steps at the tower's 8 px, saved as transformers saves a processor
    size = {"size": {"shortest_edge": 8}, "crop_size": {"height": 8, "width": 8}}
    transformers.CLIPImageProcessor(**size).save_pretrained(str(path))
    return path


def pooled(output) -> torch.Tensor:
    return output if isinstance(output, torch.Tensor) else output.pooler_output


def captions():
    ids = torch.tensor([[1, 5, 6, 7, EOS], [1, 9, EOS, 0, 0], [1, EOS, 0, 0, 0]])
    return ids, torch.tensor([5, 3, 2])


def test_encoders_match_clip_features_plus_added_layer(clip_dir):
    image_enc, text_enc, transform = load_clip(clip_dir, proj_dim=768)
    assert transform.crop == (8, 8)
    assert image_enc.embed_dim == text_enc.embed_dim == 768
    reference = transformers.CLIPModel.from_pretrained(str(clip_dir), local_files_only=True)
    pixels = torch.stack([transform(tiny_image(9 + k, 8)) for k in range(2)])
    ids, lens = captions()
    with torch.no_grad():
        img = image_enc(pixels)
        expected_img = image_enc.embed_proj(
            pooled(reference.get_image_features(pixel_values=pixels))
        )
        assert img.shape == (2, 768) and torch.allclose(img, expected_img, atol=1e-5)
        txt = text_enc(ids, lens)
        for i, n in enumerate(lens.tolist()):
            alone = pooled(reference.get_text_features(input_ids=ids[i : i + 1, :n]))
            assert torch.allclose(txt[i], text_enc.embed_proj(alone)[0], atol=1e-5)


def test_proj_dim_none_keeps_clip_projection(clip_dir):
    image_enc, text_enc, _ = load_clip(clip_dir, proj_dim=None)
    assert image_enc.embed_dim == PROJ
    ids, lens = captions()
    assert text_enc(ids, lens).shape == (3, PROJ)


def test_build_model_clip_forward_and_gradients(clip_dir):
    model = build_model({"kind": "clip", "path": str(clip_dir)})
    assert model.embed_dim == 768 and model.tokenizer_path == str(clip_dir)
    ids, lens = captions()
    images = [tiny_image(8, 8), tiny_image(12, 9), tiny_image(8, 10)]
    batch = RetrievalBatch(images, ids, lens, torch.tensor([0, 1, 2]), torch.tensor([0, 1, 2]))
    img, txt = model(batch)
    assert img.shape == txt.shape == (3, 768)
    (img @ txt.T).sum().backward()
    missing = [n for n, p in model.named_parameters() if p.grad is None]
    assert not missing  # every parameter trains: DistributedDataParallel needs no unused ones
    assert not any("logit_scale" in n for n, _ in model.named_parameters())


def test_transform_from_preprocessor_config(clip_dir, tmp_path):
    assert CLIPImageTransform.from_pretrained(clip_dir).crop == (8, 8)
    (tmp_path / "preprocessor_config.json").write_text(
        json.dumps(
            {
                "size": {"shortest_edge": 6},
                "crop_size": {"height": 5, "width": 5},
                "image_mean": [0.5, 0.5, 0.5],
                "image_std": [0.25, 0.25, 0.25],
            }
        )
    )
    transform = CLIPImageTransform.from_pretrained(tmp_path)
    assert transform.crop == (5, 5) and transform.resize == 6
    image = tiny_image(6, 6)
    expected = (torch.tensor(list(image.getpixel((0, 0))), dtype=torch.float32) / 255 - 0.5) / 0.25
    assert torch.allclose(transform(image)[:, 0, 0], expected, atol=1e-6)  # offset round(0.5)=0
    with pytest.raises(FileNotFoundError, match="never downloads"):
        load_clip(tmp_path / "absent")
