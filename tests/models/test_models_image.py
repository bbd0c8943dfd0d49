"""Image and video encoders: poolings against naive loops, GPO, masking, region dropout."""

from __future__ import annotations

import inspect
import math

import pytest
import torch

from vlret.models.image import (
    GPO,
    ImageEncoder,
    MaskedPooling,
    lengths_to_mask,
    region_dropout_mask,
    sinusoidal_positions,
)
from vlret.models.video import VideoEncoder

IN, EMB = 6, 5


def project(enc: ImageEncoder, region: torch.Tensor) -> torch.Tensor:
    """W x + b for one region, written out (no nn.Linear call)."""
    w, b = enc.fc.weight, enc.fc.bias
    return torch.stack(
        [sum(w[e, d] * region[d] for d in range(w.shape[1])) + b[e] for e in range(w.shape[0])]
    )


def naive_pool(values: list[torch.Tensor], kind: str) -> torch.Tensor:
    out = []
    for e in range(values[0].numel()):
        column = [float(v[e]) for v in values]
        out.append(max(column) if kind == "max" else sum(column) / len(column))
    return torch.tensor(out)


@pytest.mark.parametrize("kind", ["max", "mean"])
def test_max_and_mean_pooling_equal_naive_loops(kind):
    torch.manual_seed(0)
    enc = ImageEncoder(in_dim=IN, embed_dim=EMB, pooling=kind).eval()
    x = torch.randn(3, 4, IN)
    lengths = torch.tensor([4, 1, 3])
    with torch.no_grad():
        got = enc(x, lengths)
        for i in range(3):
            regions = [project(enc, x[i, r]) for r in range(int(lengths[i]))]
            assert torch.allclose(got[i], naive_pool(regions, kind), atol=1e-5)


def test_vectors_are_only_projected():
    torch.manual_seed(1)
    enc = ImageEncoder(in_dim=IN, embed_dim=EMB, pooling="gpo").eval()
    x = torch.randn(3, IN)
    with torch.no_grad():
        got = enc(x)
        for i in range(3):
            assert torch.allclose(got[i], project(enc, x[i]), atol=1e-5)


def test_sinusoidal_positions_formula():
    pe = sinusoidal_positions(5, 4)
    for k in range(5):
        for i in range(2):
            angle = k / 10000 ** (2 * i / 4)
            assert math.isclose(float(pe[k, 2 * i]), math.sin(angle), abs_tol=1e-6)
            assert math.isclose(float(pe[k, 2 * i + 1]), math.cos(angle), abs_tol=1e-6)


def test_gpo_single_region_equals_the_projected_region():
    torch.manual_seed(2)
    enc = ImageEncoder(in_dim=IN, embed_dim=EMB, pooling="gpo").eval()
    x = torch.randn(2, 5, IN)
    with torch.no_grad():
        single = enc(x[:, :1])
        padded = enc(x, torch.tensor([1, 1]))
        for i in range(2):
            assert torch.allclose(single[i], project(enc, x[i, 0]), atol=1e-5)
            assert torch.allclose(padded[i], project(enc, x[i, 0]), atol=1e-5)


def naive_gpo_weights(gpo: GPO, length: int) -> torch.Tensor:
    """Weights for ``length`` positions: unpadded bi-GRU run, directions averaged, softmax/T."""
    pe = sinusoidal_positions(length, gpo.pe_dim).unsqueeze(0)
    out, _ = gpo.gru(pe)
    h = out.shape[-1] // 2
    scores = gpo.score((out[0, :, :h] + out[0, :, h:]) / 2).squeeze(-1)
    return torch.softmax(scores / 0.1, dim=0)


def test_gpo_equals_sorted_weighted_sum_loop():
    torch.manual_seed(3)
    gpo = GPO(pe_dim=8, hidden=6)
    x = torch.randn(3, 5, 4)
    lengths = torch.tensor([5, 2, 3])
    mask = lengths_to_mask(lengths, 5)
    with torch.no_grad():
        got = gpo(x, mask)
        weights = gpo.weights(lengths, 5)
        for i in range(3):
            n = int(lengths[i])
            theta = naive_gpo_weights(gpo, n)
            assert torch.allclose(weights[i, :n], theta, atol=1e-6)
            assert float(weights[i, n:].abs().sum()) == 0.0
            assert math.isclose(float(weights[i].sum()), 1.0, abs_tol=1e-6)
            for e in range(4):
                column = sorted((float(x[i, r, e]) for r in range(n)), reverse=True)
                expected = sum(float(theta[k]) * column[k] for k in range(n))
                assert math.isclose(float(got[i, e]), expected, abs_tol=1e-5)


def test_gpo_is_a_convex_combination_of_each_dimension():
    torch.manual_seed(4)
    gpo = GPO()
    x = torch.randn(4, 7, 3) * 5
    with torch.no_grad():
        got = gpo(x, torch.ones(4, 7, dtype=torch.bool))
    assert bool((got <= x.amax(1) + 1e-5).all()) and bool((got >= x.amin(1) - 1e-5).all())


def test_gpo_temperature_sharpens_the_weights():
    torch.manual_seed(5)
    sharp, flat = GPO(temperature=0.01), GPO(temperature=100.0)
    flat.load_state_dict(sharp.state_dict())
    lengths = torch.tensor([6])
    with torch.no_grad():
        ws, wf = sharp.weights(lengths, 6)[0], flat.weights(lengths, 6)[0]
    assert float(ws.max()) > float(wf.max())
    assert torch.allclose(wf, torch.full((6,), 1 / 6), atol=1e-3)


@pytest.mark.parametrize("kind", ["max", "mean", "gpo"])
def test_padding_regions_never_change_the_output(kind):
    torch.manual_seed(6)
    enc = ImageEncoder(in_dim=IN, embed_dim=EMB, pooling=kind).eval()
    x = torch.randn(3, 6, IN)
    lengths = torch.tensor([6, 2, 4])
    with torch.no_grad():
        got = enc(x, lengths)
        noisy = x.clone()
        for i, n in enumerate(lengths.tolist()):
            noisy[i, n:] = torch.randn(6 - n, IN) * 100
        assert torch.equal(enc(noisy, lengths), got)
        for i, n in enumerate(lengths.tolist()):
            assert torch.allclose(enc(x[i : i + 1, :n])[0], got[i], atol=1e-5)


@pytest.mark.parametrize("kind", ["max", "mean", "gpo"])
def test_non_prefix_mask_equals_selected_regions(kind):
    torch.manual_seed(7)
    enc = ImageEncoder(in_dim=IN, embed_dim=EMB, pooling=kind).eval()
    x = torch.randn(1, 5, IN)
    mask = torch.tensor([[True, False, True, False, True]])
    with torch.no_grad():
        got = enc(x, mask=mask)
        assert torch.allclose(got, enc(x[:, [0, 2, 4]]), atol=1e-5)


def test_region_dropout_mask_properties():
    torch.manual_seed(8)
    mask = lengths_to_mask(torch.randint(1, 37, (400,)), 36)
    keep = region_dropout_mask(mask, 0.2)
    assert not bool((keep & ~mask).any())  # padding stays dropped
    assert bool(keep.any(1).all())  # every row keeps a region
    dropped = (mask & ~keep).sum() / mask.sum()
    assert 0.17 < float(dropped) < 0.23
    single = region_dropout_mask(torch.tensor([[False, True, False]] * 50), 0.99)
    assert bool(single[:, 1].all()) and int(single.sum()) == 50


def test_region_dropout_in_training_only():
    torch.manual_seed(9)
    enc = ImageEncoder(in_dim=IN, embed_dim=EMB, pooling="max", region_dropout=0.2)
    x = torch.randn(4, 36, IN)
    torch.manual_seed(10)
    train_out = enc(x)
    torch.manual_seed(10)
    keep = region_dropout_mask(torch.ones(4, 36, dtype=torch.bool), 0.2)
    with torch.no_grad():
        for i in range(4):
            kept = enc.fc(x[i][keep[i]])
            assert torch.allclose(train_out[i], kept.amax(0), atol=1e-6)
        enc.eval()
        assert torch.allclose(enc(x), enc.fc(x).amax(1), atol=1e-6)


@pytest.mark.parametrize("kind", ["max", "mean", "gpo"])
def test_gradients_flow(kind):
    torch.manual_seed(11)
    enc = ImageEncoder(in_dim=IN, embed_dim=EMB, pooling=kind, region_dropout=0.2)
    x = torch.randn(3, 5, IN, requires_grad=True)
    enc(x, torch.tensor([5, 3, 1])).pow(2).sum().backward()
    assert x.grad is not None and float(x.grad.abs().sum()) > 0
    for name, p in enc.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), name
        assert float(p.grad.abs().sum()) > 0, name


def test_bad_inputs_raise():
    enc = ImageEncoder(in_dim=IN, embed_dim=EMB)
    with pytest.raises(ValueError, match="in_dim"):
        enc(torch.randn(2, 3, IN + 1))
    with pytest.raises(ValueError, match="lengths"):
        enc(torch.randn(2, 3, IN), torch.tensor([0, 3]))
    with pytest.raises(ValueError, match="lengths"):
        enc(torch.randn(2, 3, IN), torch.tensor([4, 3]))
    with pytest.raises(ValueError, match="pooling"):
        ImageEncoder(pooling="sum")
    with pytest.raises(ValueError, match="region_dropout"):
        ImageEncoder(region_dropout=1.0)
    with pytest.raises(ValueError, match="valid"):
        MaskedPooling("mean")(torch.randn(2, 3, 4), torch.zeros(2, 3, dtype=torch.bool))


def test_video_encoder_pools_valid_frames():
    torch.manual_seed(12)
    enc = VideoEncoder(in_dim=IN, embed_dim=EMB, frame_dropout=0.1).eval()
    assert enc.pooling == "mean" and enc.frame_dropout == 0.1
    frames = torch.randn(2, 8, IN)
    lengths = torch.tensor([8, 3])
    with torch.no_grad():
        got = enc(frames, lengths)
        for i, n in enumerate(lengths.tolist()):
            assert torch.allclose(got[i], enc.fc(frames[i, :n]).mean(0), atol=1e-6)
        assert enc(frames.mean(1)).shape == (2, EMB)


def test_video_encoder_defaults_are_the_image_encoders_but_pooling():
    """VideoEncoder restates ImageEncoder's keywords (frames for regions): its defaults may
    differ only in the pooling (the temporal mean), never drift apart silently."""
    image = {k: p.default for k, p in inspect.signature(ImageEncoder).parameters.items()}
    video = {k: p.default for k, p in inspect.signature(VideoEncoder).parameters.items()}
    image["frame_dropout"] = image.pop("region_dropout")
    assert video.pop("pooling") == "mean" and image.pop("pooling") == "max"
    assert video == image
