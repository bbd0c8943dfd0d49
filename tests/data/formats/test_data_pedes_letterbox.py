"""How person-search evaluation reads pedestrian pictures (vlret.data.formats.pedes.letterbox,
``data.person_transform``): a synthetic 3:1 picture written by PIL, with a red head row band
and a blue feet band, keeps both through the letterbox and IRRA's resize, loses both through a
square CLIP's centre crop; the letterbox's pixels against a naive PIL resize and paste; a run
trained on Flickr30K reads person-search folders letterboxed."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("PIL")
from PIL import Image  # noqa: E402

from vlret.data.config import DataConfig  # noqa: E402
from vlret.data.formats import open_dataset  # noqa: E402
from vlret.data.formats.pedes import ResizeNormalize  # noqa: E402
from vlret.data.formats.pedes.letterbox import (  # noqa: E402
    PERSON_TRANSFORMS,
    Letterbox,
    person_eval_transform,
)
from vlret.models.clip import CLIP_MEAN, CLIP_STD, CLIPImageTransform  # noqa: E402
from vlret.run.config import ConfigError, config_from_dict  # noqa: E402
from vlret.run.eval_data import person_search_eval_data  # noqa: E402

W, H = 64, 192  # 3:1, height to width
RED, GREEN, BLUE = (255, 0, 0), (0, 160, 0), (0, 0, 255)


def pedestrian(path: Path) -> Path:
    """A 3:1 PNG: rows 0-15 red (the head), 176-191 blue (the feet), green between."""
    pixels = np.zeros((H, W, 3), dtype=np.uint8)
    pixels[:] = GREEN
    pixels[:16] = RED
    pixels[-16:] = BLUE
    Image.fromarray(pixels).save(path)
    return path


def colours(chw: torch.Tensor) -> np.ndarray:
    """The normalised CLIP tensor back to ``(H, W, 3)`` pixel values."""
    mean = torch.tensor(CLIP_MEAN).view(3, 1, 1)
    std = torch.tensor(CLIP_STD).view(3, 1, 1)
    return ((chw * std + mean) * 255).permute(1, 2, 0).numpy()


def has(rgb: np.ndarray, colour: tuple[int, int, int], tol: float = 12.0) -> bool:
    return bool((np.abs(rgb - np.asarray(colour, dtype=np.float32)).max(axis=-1) < tol).any())


def test_the_letterbox_keeps_head_and_feet_where_a_square_crop_loses_them(tmp_path):
    path = pedestrian(tmp_path / "p.png")
    model = CLIPImageTransform(224)  # a Flickr30K CLIP: shorter side 224, centre crop
    boxed = Letterbox.from_eval(model)(path)
    resized = ResizeNormalize.from_eval(model)(path)
    cropped = model(Image.open(path))
    for out in (boxed, resized, cropped):
        assert tuple(out.shape) == (3, 224, 224)
    for out in (boxed, resized):
        rgb = colours(out)
        assert has(rgb[:20], RED) and has(rgb[-20:], BLUE)
    rgb = colours(cropped)
    assert not has(rgb, RED) and not has(rgb, BLUE)  # the defect the letterbox removes
    # letterbox: aspect kept, the person 75 pixels wide (224 / 3), centred
    rgb = colours(boxed)
    assert has(rgb[112:113, 75:149], GREEN) and not has(rgb[:, :70], GREEN)


def test_the_letterbox_pixels_are_a_pil_resize_pasted_on_the_mean_colour(tmp_path):
    """Against a naive computation: PIL's bicubic resize to 75 x 224 (aspect kept), placed at
    column (224 - 75) // 2, normalised; the bands are exactly the mean (0 normalised)."""
    path = pedestrian(tmp_path / "p.png")
    out = Letterbox.from_eval(CLIPImageTransform(224))(path)
    small = np.asarray(
        Image.open(path).convert("RGB").resize((75, 224), resample=Image.Resampling.BICUBIC),
        dtype=np.float64,
    )
    mean, std = np.asarray(CLIP_MEAN), np.asarray(CLIP_STD)
    expected = np.zeros((224, 224, 3))
    expected[:, 74:149] = (small / 255.0 - mean) / std
    got = out.permute(1, 2, 0).double().numpy()
    np.testing.assert_allclose(got, expected, atol=1e-5)
    assert (out[:, :, :74] == 0).all() and (out[:, :, 149:] == 0).all()


def test_a_wide_picture_is_padded_above_and_below():
    box = Letterbox(size=(100, 100))
    assert box.placement(width=300, height=100) == (33, 0, 33, 100)
    assert box.placement(width=1, height=1000) == (0, 49, 100, 1)  # never 0 pixels wide


def test_the_choice_follows_the_run_and_a_dg_evaluation_letterboxes(tmp_path):
    """null: IRRA's resize after train_transform "irra", else the model's transform; a run
    trained on Karpathy data and evaluated as a person-search format: the letterbox, unless
    its config named another; the config key takes exactly the module's choices."""
    model = CLIPImageTransform(224)
    plain = DataConfig(root=str(tmp_path), format="cuhk-pedes")
    assert person_eval_transform(plain, model) is model
    irra = dataclasses.replace(plain, train_transform="irra")
    assert isinstance(person_eval_transform(irra, model), ResizeNormalize)
    flickr = DataConfig(root=str(tmp_path), format="karpathy", karpathy_json="x.json")
    dg = person_search_eval_data(flickr, "cuhk-pedes")
    assert dg.person_transform == "letterbox"
    assert isinstance(person_eval_transform(dg, model), Letterbox)
    chosen = person_search_eval_data(
        dataclasses.replace(flickr, person_transform="model"), "rstpreid"
    )
    assert person_eval_transform(chosen, model) is model
    raw = {"data": {"root": str(tmp_path), "format": "cuhk-pedes", "person_transform": "crop"}}
    with pytest.raises(ConfigError, match="data.person_transform"):
        config_from_dict(
            {**raw, "output_dir": "x", "model": {}, "loss": {"name": "infonce"}, "train": {}}
        )
    assert set(PERSON_TRANSFORMS) == {"letterbox", "resize", "model"}


def test_a_person_search_folder_read_for_a_dg_evaluation_serves_letterboxed_pixels(tmp_path):
    """Through the format's opener: each test image is the letterbox of its file."""
    import json

    root = tmp_path / "cuhk"
    (root / "imgs").mkdir(parents=True)
    records = []
    for k, split in enumerate(["train", "test", "test"]):
        pedestrian(root / "imgs" / f"p{k}.png")
        records.append(
            {"split": split, "captions": [f"a person {k}"], "file_path": f"p{k}.png", "id": k}
        )
    (root / "reid_raw.json").write_text(json.dumps(records))
    flickr = DataConfig(root=str(root), format="karpathy", karpathy_json="x.json")
    data = dataclasses.replace(person_search_eval_data(flickr, "cuhk-pedes"), root=str(root))
    model = CLIPImageTransform(224)
    test = open_dataset(data, "test", image_transform=model)
    expected = Letterbox.from_eval(model)(root / "imgs" / "p1.png")
    torch.testing.assert_close(test.image(0), expected)
