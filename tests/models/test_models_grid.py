"""VSE-infinity's grid image encoder (image kind ``resnext-wsl``): grid features, size
augmentation, the pixels its transform keeps, and its construction from a model config."""

from __future__ import annotations

import pytest
import torch
from PIL import Image

from vlret.models import build_model
from vlret.models.grid import GridImageEncoder, grid_transform, size_augment_mask
from vlret.models.resnext import ResNeXt

SMALL = {"layers": [1, 1, 1, 1], "groups": 2, "width_per_group": 4}


@pytest.fixture
def weights(tmp_path):
    """A state dict of a small ResNeXt, saved as torchvision saves one (fc included)."""
    torch.manual_seed(0)
    state = ResNeXt(**SMALL).state_dict()
    state = {**state, "fc.weight": torch.zeros(1000, 2048), "fc.bias": torch.zeros(1000)}
    path = tmp_path / "resnext_small.pth"
    torch.save(state, path)
    return path


def spec(path, **image):
    return {
        "embed_dim": 16,
        "image": {"kind": "resnext-wsl", "path": str(path), "config": SMALL, **image},
        "text": {"kind": "gru", "word_dim": 8},
    }


def test_grid_features_are_the_layer4_map_in_row_major_order():
    torch.manual_seed(0)
    encoder = GridImageEncoder(ResNeXt(**SMALL), embed_dim=8, pooling="max").eval()
    x = torch.randn(2, 3, 128, 96)
    grid = encoder.backbone(x)  # (2, 2048, 4, 3)
    features = encoder.grid_features(x)
    assert tuple(features.shape) == (2, 12, 2048)
    for row in range(4):
        for col in range(3):
            torch.testing.assert_close(features[:, row * 3 + col], grid[:, :, row, col])
    # max pooling of the projected grid, computed by hand
    expected = encoder.fc(features).amax(dim=1)
    torch.testing.assert_close(encoder(x), expected)


def test_size_augmentation_drops_grids_as_vse_infinity_does():
    g = torch.Generator().manual_seed(0)
    mask = size_augment_mask(20000, 256, generator=g)
    assert bool(mask.any(dim=1).all())
    whole = mask.all(dim=1).float().mean().item()
    # P(keep all) = 0.2 (u <= 0.2), plus the rows where no v_j fell below 0.2 u (negligible)
    assert abs(whole - 0.2) < 0.01
    dropped = 1.0 - mask.float().mean().item()
    # E[drop] = P(u > 0.2) * E[0.2 u | u > 0.2] = 0.8 * 0.2 * 0.6 = 0.096
    assert abs(dropped - 0.096) < 0.003
    per_row = 1.0 - mask.float().mean(dim=1)
    assert per_row.max().item() < 0.3  # never more than about 20% of a row (0.2 u, u < 1)
    empty = size_augment_mask(500, 1, generator=torch.Generator().manual_seed(1))
    assert bool(empty.all())  # a single grid feature is always kept


def test_training_mode_pools_only_the_kept_grids():
    torch.manual_seed(0)
    encoder = GridImageEncoder(ResNeXt(**SMALL), embed_dim=8, pooling="mean")
    x = torch.randn(3, 3, 256, 256)
    encoder.eval()
    full = encoder(x)
    torch.testing.assert_close(full, encoder.fc(encoder.grid_features(x)).mean(dim=1))
    encoder.train()
    torch.manual_seed(5)
    trained = encoder(x)
    torch.manual_seed(5)
    mask = size_augment_mask(3, 64)
    projected = encoder.fc(encoder.grid_features(x))
    expected = (projected * mask[..., None]).sum(1) / mask.sum(1, keepdim=True)
    torch.testing.assert_close(trained, expected)
    assert not torch.allclose(trained, full)
    assert not encoder.backbone.bn1.training  # the backbone's BatchNorm stays in eval mode


def test_the_transform_resizes_without_cropping():
    # a 2:1 picture whose outer columns are red: a centre crop would cut them away
    image = Image.new("RGB", (64, 32), (0, 0, 255))
    for y in range(32):
        for x in (*range(4), *range(60, 64)):
            image.putpixel((x, y), (255, 0, 0))
    pixels = grid_transform(32)(image)
    assert tuple(pixels.shape) == (3, 32, 32)
    red = (1.0 - 0.485) / 0.229
    assert pixels[0, :, 0].min().item() == pytest.approx(red, abs=1e-4)
    assert pixels[0, :, 31].min().item() == pytest.approx(red, abs=1e-4)
    assert pixels[2, 16, 16].item() == pytest.approx((1.0 - 0.406) / 0.225, abs=1e-4)


def test_build_model_reads_the_local_weights(weights):
    model = build_model(spec(weights, image_size=64), vocab_size=20)
    state = torch.load(weights, weights_only=True)
    backbone = model.image_encoder.backbone
    assert torch.equal(backbone.layer3[0].conv2.weight, state["layer3.0.conv2.weight"])
    assert model.config["image"]["pooling"] == "gpo" and model.config["image"]["size_augment"]
    model.eval()
    emb = model.encode_images(torch.randn(2, 3, 64, 64))
    assert tuple(emb.shape) == (2, 16)
    picture = Image.new("RGB", (90, 40), (10, 200, 30))
    assert tuple(model.image_transform(picture).shape) == (3, 64, 64)
    names = {n.split(".")[1] for n, _ in model.named_parameters() if n.startswith("image_")}
    assert names == {"backbone", "fc", "pool"}
    rebuilt = build_model(model.config, vocab_size=20)  # the resolved config builds it back
    assert torch.equal(rebuilt.image_encoder.backbone.conv1.weight, backbone.conv1.weight)


def test_config_errors_name_the_key_or_the_file(tmp_path, weights):
    without = spec(weights)
    del without["image"]["path"]
    with pytest.raises(ValueError, match="image: key 'path' is required for kind 'resnext-wsl'"):
        build_model(without, vocab_size=20)
    with pytest.raises(FileNotFoundError, match="nowhere.pth: missing; expected a ResNeXt"):
        build_model(spec(tmp_path / "nowhere.pth"), vocab_size=20)
    with pytest.raises(ValueError, match="config: unknown key 'depth' of a ResNeXt"):
        build_model(spec(weights, config={"depth": 3}), vocab_size=20)
    with pytest.raises(ValueError, match="^image.path: .*resnext_small.pth: missing key 'layer1.1"):
        build_model(spec(weights, config={**SMALL, "layers": [2, 1, 1, 1]}), vocab_size=20)
    with pytest.raises(ValueError, match="image.size_augment must be true or false"):
        build_model(spec(weights, size_augment="yes"), vocab_size=20)
    with pytest.raises(ValueError, match="image.pooling: unknown pooling 'last'"):
        build_model(spec(weights, pooling="last"), vocab_size=20)
