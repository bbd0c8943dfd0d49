"""ResNeXt in plain torch, with the key layout of torchvision's and Facebook's WSL weights.

ResNeXt (Xie et al., CVPR 2017) is a ResNet whose bottleneck 3x3 convolution is split into
``groups`` parallel paths: a stage of ``planes`` output channels over 4 has bottleneck width
``floor(planes * width_per_group / 64) * groups``. Layout (ResNet v1.5, the stride in the
3x3, as torchvision builds it):

* stem: ``conv1`` (7x7, 64 channels, stride 2, padding 3, no bias), ``bn1``, ReLU, a 3x3
  max pool of stride 2 and padding 1;
* ``layer1`` .. ``layer4``: ``layers[i]`` bottleneck blocks of ``planes`` 64, 128, 256, 512
  (outputs 4x that), the first block of ``layer2`` .. ``layer4`` at stride 2. A block is
  ``conv1`` (1x1) / ``bn1`` / ReLU, ``conv2`` (3x3, grouped, the stride) / ``bn2`` / ReLU,
  ``conv3`` (1x1) / ``bn3``, plus the input (through ``downsample.0``, a strided 1x1
  convolution, and ``downsample.1``, a BatchNorm, where the shape changes), then ReLU.

ResNeXt-101 32x8d (``layers = (3, 4, 23, 3)``, ``groups = 32``, ``width_per_group = 8``) has
88,791,336 parameters with its 1000-way ImageNet classifier (torchvision's published 88.79M)
and 86,742,336 without it: :class:`ResNeXt` stops at ``layer4`` and returns the feature map,
``(N, 2048, H / 32, W / 32)`` (a 16 x 16 grid at VSE-infinity's 512 x 512 input).

Its weights are read from a local state dict (:func:`load_resnext_weights`): the keys
torchvision's ``resnext101_32x8d`` and ``facebookresearch/WSL-Images``' ``resnext101_32x8d_wsl``
save (``conv1.weight``, ``bn1.running_mean``, ``layer3.22.conv2.weight``,
``layer1.0.downsample.1.bias``, ...). Nothing is ever downloaded.
"""

from __future__ import annotations

import pickle
import warnings
import zipfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

#: ResNeXt-101 32x8d (Xie et al. 2017; torchvision's ``resnext101_32x8d``, the WSL weights'
#: architecture): blocks per stage, groups, width per group.
RESNEXT101_32X8D: dict[str, Any] = {"layers": [3, 4, 23, 3], "groups": 32, "width_per_group": 8}
#: The classifier a WSL / ImageNet state dict carries and the grid backbone leaves out.
CLASSIFIER_KEYS = ("fc.weight", "fc.bias")
_PLANES = (64, 128, 256, 512)
_EXPANSION = 4


class ResNeXtBlock(nn.Module):
    """One ResNeXt bottleneck block (module docstring), torchvision's parameter names.

    Args:
        in_channels: Channels of the input.
        planes: The stage's ``planes``; the block outputs ``4 * planes`` channels.
        stride: Stride of the grouped 3x3 convolution (and of the shortcut).
        groups: Paths of the 3x3 convolution.
        width_per_group: Channels of each path at ``planes = 64``.
    """

    def __init__(
        self, in_channels: int, planes: int, *, stride: int, groups: int, width_per_group: int
    ) -> None:
        super().__init__()
        width = int(planes * (width_per_group / 64.0)) * groups
        out_channels = planes * _EXPANSION
        self.conv1 = nn.Conv2d(in_channels, width, kernel_size=1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = nn.Conv2d(
            width, width, kernel_size=3, stride=stride, padding=1, groups=groups, bias=False
        )
        self.bn2 = nn.BatchNorm2d(width)
        self.conv3 = nn.Conv2d(width, out_channels, kernel_size=1, bias=False)
        self.bn3 = nn.BatchNorm2d(out_channels)
        self.relu = nn.ReLU(inplace=True)
        self.downsample: nn.Sequential | None = None
        if stride != 1 or in_channels != out_channels:
            self.downsample = nn.Sequential(
                nn.Conv2d(in_channels, out_channels, kernel_size=1, stride=stride, bias=False),
                nn.BatchNorm2d(out_channels),
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``relu(bn3(conv3(...)) + shortcut(x))``."""
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        shortcut = x if self.downsample is None else self.downsample(x)
        return self.relu(out + shortcut)


def _positive_int(name: str, value: Any) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{name}: expected a positive int, got {value!r}")
    return value


class ResNeXt(nn.Module):
    """The ResNeXt trunk up to ``layer4``: pixels ``(N, 3, H, W)`` -> ``(N, 2048, H/32, W/32)``
    (``512 * 4`` channels; module docstring). Random weights (torchvision's initialisation:
    Kaiming-normal fan-out convolutions, BatchNorm weight 1 and bias 0) until
    :func:`load_resnext_weights` fills them.

    ``frozen_bn`` (VSE-infinity's grid backbone): every BatchNorm stays in eval mode whatever
    ``train()`` says, so its running statistics are the loaded ones for the whole run (the
    affine weights still train).

    Args:
        layers: Blocks of ``layer1`` .. ``layer4`` (four positive ints).
        groups: Paths of each grouped convolution.
        width_per_group: Channels per path at ``planes = 64``.
        frozen_bn: Keep the BatchNorms in eval mode.

    Raises:
        ValueError: ``layers`` is not four positive ints, or ``groups`` / ``width_per_group``
            is not a positive int.
    """

    def __init__(
        self,
        *,
        layers: Sequence[int] = (3, 4, 23, 3),
        groups: int = 32,
        width_per_group: int = 8,
        frozen_bn: bool = True,
    ) -> None:
        super().__init__()
        if isinstance(layers, (str, bytes)) or not isinstance(layers, Sequence) or len(layers) != 4:
            raise ValueError(f"layers: expected four block counts, got {layers!r}")
        blocks = [_positive_int("layers", n) for n in layers]
        self.groups = _positive_int("groups", groups)
        self.width_per_group = _positive_int("width_per_group", width_per_group)
        self.frozen_bn = bool(frozen_bn)
        self.conv1 = nn.Conv2d(3, 64, kernel_size=7, stride=2, padding=3, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(kernel_size=3, stride=2, padding=1)
        in_channels = 64
        for index, (planes, count) in enumerate(zip(_PLANES, blocks, strict=True)):
            stage = []
            for b in range(count):
                stride = 2 if (index > 0 and b == 0) else 1
                stage.append(
                    ResNeXtBlock(
                        in_channels,
                        planes,
                        stride=stride,
                        groups=groups,
                        width_per_group=width_per_group,
                    )
                )
                in_channels = planes * _EXPANSION
            self.add_module(f"layer{index + 1}", nn.Sequential(*stage))
        self.out_channels = in_channels
        for module in self.modules():
            if isinstance(module, nn.Conv2d):
                nn.init.kaiming_normal_(module.weight, mode="fan_out", nonlinearity="relu")
            elif isinstance(module, nn.BatchNorm2d):
                nn.init.ones_(module.weight)
                nn.init.zeros_(module.bias)

    def train(self, mode: bool = True) -> ResNeXt:
        """``nn.Module.train``, the BatchNorms then back in eval mode when ``frozen_bn``."""
        super().train(mode)
        if self.frozen_bn:
            for module in self.modules():
                if isinstance(module, nn.BatchNorm2d):
                    module.eval()
        return self

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        """The ``(N, 2048, H', W')`` output of ``layer4``.

        Raises:
            ValueError: ``pixel_values`` is not ``(N, 3, H, W)``.
        """
        if (
            not isinstance(pixel_values, torch.Tensor)
            or pixel_values.dim() != 4
            or (pixel_values.size(1) != 3)
        ):
            got = tuple(pixel_values.shape) if isinstance(pixel_values, torch.Tensor) else None
            shown = got or type(pixel_values).__name__
            raise ValueError(f"pixel_values must be a (N, 3, H, W) tensor, got {shown}")
        x = self.maxpool(self.relu(self.bn1(self.conv1(pixel_values))))
        for name in ("layer1", "layer2", "layer3", "layer4"):
            x = getattr(self, name)(x)
        return x

    def extra_repr(self) -> str:
        depths = [len(getattr(self, f"layer{i}")) for i in range(1, 5)]
        return (
            f"layers={depths}, groups={self.groups}, width_per_group={self.width_per_group}, "
            f"frozen_bn={self.frozen_bn}"
        )


def _read_state(path: Path) -> Any:
    """``torch.load(path, weights_only=True)`` on the CPU, each failure one line naming it."""
    if not path.exists():
        raise FileNotFoundError(
            f"{path}: missing; expected a ResNeXt state dict (torchvision's or the WSL-Images "
            "layout; nothing is downloaded)"
        )
    if not path.is_file():
        raise ValueError(f"{path}: is a folder; expected a ResNeXt state dict file")
    with open(path, "rb") as fh:
        head = fh.read(4)
    is_zip = zipfile.is_zipfile(path)
    if head == b"PK\x03\x04" and not is_zip:
        raise ValueError(
            f"{path}: a truncated copy or damaged zip archive (the PyTorch format, "
            f"{path.stat().st_size} bytes): the directory at its end is missing"
        )
    if not is_zip and head[:1] != b"\x80":
        raise ValueError(
            f"{path}: not a PyTorch state dict ({path.stat().st_size} bytes, neither a zip "
            "archive nor a pickle)"
        )
    try:
        with warnings.catch_warnings():  # torch's notes on old pickles: the error says enough
            warnings.simplefilter("ignore")
            return torch.load(str(path), map_location="cpu", weights_only=True)
    except pickle.UnpicklingError:
        raise ValueError(
            f"{path}: refused: it holds pickled objects other than tensors (torch.load "
            "weights_only=True; nothing in it was run)"
        ) from None
    except Exception as err:  # a damaged archive, a pickle cut short, ...
        first = (str(err).strip().splitlines() or [type(err).__name__])[0][:200]
        raise ValueError(f"{path}: not a readable PyTorch state dict ({first})") from None


def load_resnext_weights(model: ResNeXt, path: str | Path) -> ResNeXt:
    """Fill ``model`` from a local state dict saved with torchvision's key layout.

    Read with ``torch.load(weights_only=True)`` (a pickle holding anything but tensors and
    plain containers is refused, nothing in it run). The file must hold exactly the model's
    keys with their shapes, except that the classifier (:data:`CLASSIFIER_KEYS`, which the grid
    backbone does not use) is accepted and dropped, and BatchNorm ``num_batches_tracked``
    counters (absent from old checkpoints, unused in eval mode) may be missing. Tensors are
    copied into the model in its dtype.

    Args:
        model: The :class:`ResNeXt` to fill.
        path: The state dict file (e.g. the WSL-Images ``resnext101_32x8d_wsl`` weights).

    Returns:
        ``model``.

    Raises:
        FileNotFoundError: ``path`` does not exist.
        ValueError: Not a readable or safe state dict; a missing or unexpected key; a value
            that is not a tensor or has another shape (each naming the file and the key).
    """
    path = Path(path)
    state = _read_state(path)
    expected = model.state_dict()
    if not isinstance(state, Mapping):
        raise ValueError(
            f"{path}: holds a {type(state).__name__}; expected a state dict (key -> tensor)"
        )
    # stops at the first foreign key: at most len(expected) + 3 steps, however large the dict
    for key in state:
        if key not in expected and key not in CLASSIFIER_KEYS:
            hint = (
                " (saved from a wrapper? keys start with 'module.')"
                if str(key).startswith("module.")
                else ""
            )
            raise ValueError(f"{path}: unexpected key {key!r} for this ResNeXt{hint}")
    for key, target in expected.items():
        if key not in state:
            if key.endswith("num_batches_tracked"):
                continue
            raise ValueError(
                f"{path}: missing key {key!r} (layers, groups or width_per_group of another "
                "ResNeXt?)"
            )
        value = state[key]
        if not isinstance(value, torch.Tensor):
            raise ValueError(f"{path}: {key} is a {type(value).__name__}; expected a tensor")
        if tuple(value.shape) != tuple(target.shape):
            raise ValueError(
                f"{path}: {key} has shape {list(value.shape)}; this ResNeXt's is "
                f"{list(target.shape)}"
            )
    with torch.no_grad():
        for key, target in expected.items():
            if key in state:
                target.copy_(state[key].to(target.dtype))
    return model


__all__ = [
    "CLASSIFIER_KEYS",
    "RESNEXT101_32X8D",
    "ResNeXt",
    "ResNeXtBlock",
    "load_resnext_weights",
]
