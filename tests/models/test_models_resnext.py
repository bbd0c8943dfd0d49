"""ResNeXt in plain torch (vlret.models.resnext): its size, its key layout, its block against a
per-group naive computation, and the safe loading of a local state dict."""

from __future__ import annotations

import argparse
import collections
import zipfile

import pytest
import torch
import torch.nn.functional as F

from vlret.models.resnext import (
    RESNEXT101_32X8D,
    ResNeXt,
    ResNeXtBlock,
    load_resnext_weights,
)

SMALL = {"layers": [1, 2, 1, 1], "groups": 4, "width_per_group": 4}


def torchvision_layout(layers, groups, width_per_group, *, classifier=True):
    """Key -> shape of a torchvision ResNeXt state dict, written out from its definition
    (independently of vlret's module): stem, then per block conv1/bn1, grouped conv2/bn2,
    conv3/bn3 and, on a block whose shape or stride changes, downsample.0 / downsample.1."""
    shapes = collections.OrderedDict()

    def bn(prefix, c):
        for name in ("weight", "bias", "running_mean", "running_var"):
            shapes[f"{prefix}.{name}"] = (c,)
        shapes[f"{prefix}.num_batches_tracked"] = ()

    shapes["conv1.weight"] = (64, 3, 7, 7)
    bn("bn1", 64)
    cin = 64
    for stage, (planes, count) in enumerate(zip((64, 128, 256, 512), layers, strict=True), start=1):
        width = planes * width_per_group // 64 * groups
        for b in range(count):
            p = f"layer{stage}.{b}"
            shapes[f"{p}.conv1.weight"] = (width, cin, 1, 1)
            bn(f"{p}.bn1", width)
            shapes[f"{p}.conv2.weight"] = (width, width // groups, 3, 3)
            bn(f"{p}.bn2", width)
            shapes[f"{p}.conv3.weight"] = (planes * 4, width, 1, 1)
            bn(f"{p}.bn3", planes * 4)
            if b == 0 and (stage > 1 or cin != planes * 4):
                shapes[f"{p}.downsample.0.weight"] = (planes * 4, cin, 1, 1)
                bn(f"{p}.downsample.1", planes * 4)
            cin = planes * 4
    if classifier:
        shapes["fc.weight"] = (1000, 2048)
        shapes["fc.bias"] = (1000,)
    return shapes


def random_state(shapes, seed=0):
    g = torch.Generator().manual_seed(seed)
    state = {}
    for key, shape in shapes.items():
        if key.endswith("num_batches_tracked"):
            state[key] = torch.tensor(7)
        elif key.endswith("running_var"):
            state[key] = torch.rand(shape, generator=g) + 0.5
        else:
            state[key] = torch.randn(shape, generator=g)
    return state


def test_resnext101_32x8d_has_the_published_parameter_count():
    with torch.device("meta"):  # shapes only: no memory, no computation
        model = ResNeXt(**RESNEXT101_32X8D)
    trunk = sum(p.numel() for p in model.parameters())
    classifier = 2048 * 1000 + 1000  # the ImageNet fc the grid backbone leaves out
    assert trunk + classifier == 88_791_336  # torchvision's resnext101_32x8d: 88.79M
    assert trunk == 86_742_336


def test_resnext101_32x8d_keys_and_shapes_are_torchvisions():
    with torch.device("meta"):
        model = ResNeXt(**RESNEXT101_32X8D)
    ours = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    layout = torchvision_layout([3, 4, 23, 3], 32, 8, classifier=False)
    assert ours == dict(layout)
    assert ours["layer1.0.conv2.weight"] == (256, 8, 3, 3)  # 32 groups of 8 channels
    assert ours["layer4.2.conv3.weight"] == (2048, 2048, 1, 1)


def test_a_512_input_gives_a_16_by_16_grid_of_2048_features():
    with torch.device("meta"):
        model = ResNeXt(**RESNEXT101_32X8D)
        out = model(torch.empty(2, 3, 512, 512))
    assert tuple(out.shape) == (2, 2048, 16, 16)
    small = ResNeXt(**SMALL).eval()
    assert tuple(small(torch.randn(1, 3, 96, 64)).shape) == (1, 2048, 3, 2)


def naive_block(block, x):
    """One block in float64 from its weights: each grouped convolution as ``groups`` separate
    convolutions on channel slices, BatchNorm written out from its running statistics."""

    def bn(m, t):
        scale = m.weight / torch.sqrt(m.running_var + m.eps)
        return (t - m.running_mean[None, :, None, None]) * scale[None, :, None, None] + m.bias[
            None, :, None, None
        ]

    out = torch.relu(bn(block.bn1, F.conv2d(x, block.conv1.weight)))
    groups = block.conv2.groups
    size = out.size(1) // groups
    parts = [
        F.conv2d(
            out[:, g * size : (g + 1) * size],
            block.conv2.weight[g * size : (g + 1) * size],
            stride=block.conv2.stride,
            padding=1,
        )
        for g in range(groups)
    ]
    out = torch.relu(bn(block.bn2, torch.cat(parts, dim=1)))
    out = bn(block.bn3, F.conv2d(out, block.conv3.weight))
    shortcut = x
    if block.downsample is not None:
        conv, norm = block.downsample[0], block.downsample[1]
        shortcut = bn(norm, F.conv2d(x, conv.weight, stride=conv.stride))
    return torch.relu(out + shortcut)


@pytest.mark.parametrize("stride, cin", [(2, 64), (1, 64), (1, 256)])
def test_a_block_equals_a_per_group_naive_computation(stride, cin):
    torch.manual_seed(0)
    block = ResNeXtBlock(cin, 64, stride=stride, groups=8, width_per_group=4).double().eval()
    for m in block.modules():
        if isinstance(m, torch.nn.BatchNorm2d):
            m.running_mean.normal_()
            m.running_var.uniform_(0.5, 2.0)
            m.weight.data.normal_()
            m.bias.data.normal_()
    assert (block.downsample is None) == (stride == 1 and cin == 256)
    x = torch.randn(2, cin, 9, 10, dtype=torch.float64)
    torch.testing.assert_close(block(x), naive_block(block, x), rtol=1e-12, atol=1e-12)


def test_batchnorm_stays_in_eval_mode_when_frozen():
    model = ResNeXt(**SMALL)
    before = model.layer1[0].bn2.running_mean.clone()
    model.train()
    assert model.training and not model.bn1.training and not model.layer2[1].bn3.training
    model(torch.randn(2, 3, 64, 64))
    assert torch.equal(model.layer1[0].bn2.running_mean, before)
    live = ResNeXt(**SMALL, frozen_bn=False).train()
    live(torch.randn(2, 3, 64, 64))
    assert live.bn1.training and not torch.equal(live.layer1[0].bn2.running_mean, before)


def test_a_state_dict_of_the_torchvision_layout_loads_and_round_trips(tmp_path):
    shapes = torchvision_layout(**{"layers": SMALL["layers"], "groups": 4, "width_per_group": 4})
    state = random_state(shapes)
    path = tmp_path / "wsl.pth"
    torch.save(state, path)
    model = load_resnext_weights(ResNeXt(**SMALL), path)
    for key, value in model.state_dict().items():
        assert torch.equal(value, state[key].to(value.dtype)), key
    again = tmp_path / "again.pth"
    torch.save(model.state_dict(), again)
    other = load_resnext_weights(ResNeXt(**SMALL), again)
    x = torch.randn(2, 3, 64, 64)
    torch.testing.assert_close(other.eval()(x), model.eval()(x), rtol=0, atol=0)
    # old checkpoints have no num_batches_tracked and no classifier: both may be absent
    old = {k: v for k, v in state.items() if "num_batches" not in k and not k.startswith("fc.")}
    torch.save(old, tmp_path / "old.pth")
    load_resnext_weights(ResNeXt(**SMALL), tmp_path / "old.pth")


def test_bad_state_dicts_are_refused_naming_the_file_and_the_key(tmp_path):
    shapes = torchvision_layout(SMALL["layers"], 4, 4)
    state = random_state(shapes)
    cases = {
        "missing": (
            {k: v for k, v in state.items() if k != "layer2.1.conv2.weight"},
            "missing key 'layer2.1.conv2.weight'",
        ),
        "unexpected": (
            {**state, "layer5.0.conv1.weight": torch.zeros(1)},
            "unexpected key 'layer5.0.conv1.weight'",
        ),
        "wrapped": ({f"module.{k}": v for k, v in state.items()}, "keys start with 'module.'"),
        "shape": (
            {**state, "conv1.weight": torch.zeros(64, 3, 3, 3)},
            "conv1.weight has shape [64, 3, 3, 3]",
        ),
        "value": ({**state, "bn1.weight": [1.0] * 64}, "bn1.weight is a list"),
        "list": (list(state.values()), "holds a list"),
    }
    for name, (content, message) in cases.items():
        path = tmp_path / f"{name}.pth"
        torch.save(content, path)
        with pytest.raises(ValueError, match=None) as err:
            load_resnext_weights(ResNeXt(**SMALL), path)
        text = str(err.value)
        assert str(path) in text and message in text and "\n" not in text, (name, text)


def test_unsafe_or_foreign_files_are_refused(tmp_path):
    missing = tmp_path / "none.pth"
    with pytest.raises(FileNotFoundError, match="none.pth: missing"):
        load_resnext_weights(ResNeXt(**SMALL), missing)
    text = tmp_path / "notes.pth"
    text.write_text("not weights")
    with pytest.raises(ValueError, match="notes.pth: not a PyTorch state dict"):
        load_resnext_weights(ResNeXt(**SMALL), text)
    unsafe = tmp_path / "unsafe.pth"
    torch.save({"conv1.weight": argparse.Namespace(a=1)}, unsafe)
    with pytest.raises(ValueError, match="unsafe.pth: refused: it holds pickled objects"):
        load_resnext_weights(ResNeXt(**SMALL), unsafe)
    cut = tmp_path / "cut.pth"
    torch.save(random_state(torchvision_layout(SMALL["layers"], 4, 4)), cut)
    cut.write_bytes(cut.read_bytes()[:4000])
    with pytest.raises(ValueError, match="cut.pth: a truncated copy or damaged zip archive"):
        load_resnext_weights(ResNeXt(**SMALL), cut)
    other = tmp_path / "other.zip"  # a zip archive that is no PyTorch file
    with zipfile.ZipFile(other, "w") as archive:
        archive.writestr("readme.txt", "hello")
    with pytest.raises(ValueError, match="other.zip: not a readable PyTorch state dict"):
        load_resnext_weights(ResNeXt(**SMALL), other)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"layers": [3, 4, 23]}, "layers: expected four block counts"),
        ({"layers": [3, 0, 1, 1]}, "layers: expected a positive int"),
        ({"groups": 0}, "groups: expected a positive int"),
        ({"width_per_group": 2.5}, "width_per_group: expected a positive int"),
    ],
)
def test_bad_architectures_are_refused(kwargs, message):
    with pytest.raises(ValueError, match=message):
        ResNeXt(**kwargs)
