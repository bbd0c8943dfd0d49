"""Region-feature image encoder: a linear projection to the joint space and a masked pooling.

Inputs are precomputed features: ``(N, R, D)`` bottom-up-attention regions (``R=36``,
``D=2048``) or ``(N, D)`` plain vectors of a frozen backbone. Regions are projected by one
fully connected layer to the joint space (1024 by default) and pooled:

* ``"max"``: the element-wise maximum over regions (VSE++ (BUTD), Unified paper B.1.1);
* ``"mean"``: the average over regions;
* ``"gpo"``: VSE-infinity's generalized pooling operator (:class:`GPO`).

Every pooling honours a region mask (``True`` = a real region), so padded regions (variable
region or frame counts) and regions removed by VSE-infinity's region dropout never change the
output. The embeddings are not normalised: the losses normalise.
"""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

POOLINGS = ("max", "mean", "gpo")


def lengths_to_mask(lengths: torch.Tensor, width: int) -> torch.Tensor:
    """Mask of the valid positions of padded rows.

    Args:
        lengths: ``(N,)`` valid count of each row, in ``1..width``.
        width: The padded width.

    Returns:
        A ``(N, width)`` bool mask, True at positions ``< lengths[i]``.

    Raises:
        ValueError: ``lengths`` is not 1-D or a length lies outside ``1..width``.
    """
    lengths = torch.as_tensor(lengths)
    if lengths.dim() != 1:
        raise ValueError(f"lengths must be 1-D (N,), got shape {tuple(lengths.shape)}")
    if lengths.numel() and (int(lengths.min()) < 1 or int(lengths.max()) > width):
        raise ValueError(
            f"lengths must lie in 1..{width} (the padded width), got "
            f"min {int(lengths.min())} max {int(lengths.max())}"
        )
    positions = torch.arange(width, device=lengths.device)
    return positions.unsqueeze(0) < lengths.unsqueeze(1)


def sinusoidal_positions(count: int, dim: int, *, device=None, dtype=None) -> torch.Tensor:
    """Transformer positional encodings of the indices ``0..count-1``.

    ``sin(k / 10000^(2i/dim))`` at even columns ``2i``, ``cos`` of the same at ``2i+1``.

    Args:
        count: Number of positions.
        dim: Encoding width (even).
        device: Device of the result.
        dtype: Dtype of the result (computed in float32).

    Returns:
        The ``(count, dim)`` encodings.
    """
    k = torch.arange(count, device=device, dtype=torch.float32).unsqueeze(1)
    freq = torch.exp(
        torch.arange(0, dim, 2, device=device, dtype=torch.float32) * (-math.log(10000.0) / dim)
    )
    pe = torch.zeros(count, dim, device=device, dtype=torch.float32)
    pe[:, 0::2] = torch.sin(k * freq)
    pe[:, 1::2] = torch.cos(k * freq)
    return pe if dtype is None else pe.to(dtype)


class GPO(nn.Module):
    """Generalized pooling operator of VSE-infinity (Chen et al., CVPR 2021, Sec. 3.2).

    Each dimension of the features is sorted in descending order and pooled as
    ``v_i = sum_k theta_k * max_k(phi_{., i})``, a weighted sum of the k-th largest values.
    The weights depend only on the index ``k`` and the number of valid features ``K``: the
    positional encodings of ``0..K-1`` run through a small bi-GRU (directions averaged), a
    linear layer gives one score per position and ``theta = softmax(score / temperature)``
    over the ``K`` positions (temperature 0.1). With ``K=1`` it returns the single feature; it
    can learn max pooling (all weight on ``k=0``), mean pooling (uniform weights) or anything
    between, for every feature count.

    Args:
        pe_dim: Width of the positional encodings (even).
        hidden: Hidden size of the bi-GRU.
        temperature: Softmax temperature of the position scores.

    Raises:
        ValueError: ``pe_dim`` is odd or below 2, ``hidden < 1`` or ``temperature <= 0``.
    """

    def __init__(self, *, pe_dim: int = 32, hidden: int = 32, temperature: float = 0.1) -> None:
        super().__init__()
        if pe_dim < 2 or pe_dim % 2:
            raise ValueError(f"pe_dim must be an even int >= 2, got {pe_dim!r}")
        if hidden < 1:
            raise ValueError(f"hidden must be a positive int, got {hidden!r}")
        if not temperature > 0:
            raise ValueError(f"temperature must be > 0, got {temperature!r}")
        self.pe_dim = pe_dim
        self.temperature = float(temperature)
        self.gru = nn.GRU(pe_dim, hidden, batch_first=True, bidirectional=True)
        self.score = nn.Linear(hidden, 1)

    def weights(self, lengths: torch.Tensor, width: int) -> torch.Tensor:
        """Pooling weights ``theta`` for rows of ``lengths`` valid features.

        Args:
            lengths: ``(N,)`` valid feature count of each row.
            width: The padded width.

        Returns:
            ``(N, width)`` weights; row ``i`` sums to 1 over its first ``lengths[i]`` entries.
        """
        # The weights depend on the length only: run the GRU once per distinct length.
        distinct, inverse = torch.unique(lengths, return_inverse=True)
        pe = sinusoidal_positions(width, self.pe_dim, device=lengths.device)
        pe = pe.unsqueeze(0).expand(distinct.numel(), width, self.pe_dim)
        packed = pack_padded_sequence(pe, distinct.cpu(), batch_first=True, enforce_sorted=False)
        out, _ = self.gru(packed)
        out, _ = pad_packed_sequence(out, batch_first=True, total_length=width)
        half = out.size(-1) // 2
        scores = self.score((out[..., :half] + out[..., half:]) / 2).squeeze(-1).float()
        mask = lengths_to_mask(distinct, width)
        scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
        return torch.softmax(scores / self.temperature, dim=1)[inverse]

    def forward(self, features: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """Pool each dimension's sorted values with the weights ``theta``.

        Args:
            features: ``(N, K, E)`` features.
            mask: ``(N, K)`` bool, True at valid features.

        Returns:
            The pooled ``(N, E)`` features.

        Raises:
            ValueError: A row has no valid feature.
        """
        lengths = mask.sum(dim=1)
        if bool((lengths == 0).any()):
            raise ValueError("mask has a row without any valid feature; GPO needs at least one")
        low = torch.finfo(features.dtype).min
        # Invalid entries sort last in every dimension; positions >= length are then zeroed.
        ranked = features.masked_fill(~mask.unsqueeze(-1), low).sort(dim=1, descending=True)[0]
        valid = lengths_to_mask(lengths, features.size(1)).unsqueeze(-1)
        ranked = ranked.masked_fill(~valid, 0.0)
        theta = self.weights(lengths, features.size(1))
        return (theta.unsqueeze(-1).to(ranked.dtype) * ranked).sum(dim=1)


class MaskedPooling(nn.Module):
    """Pooling over dimension 1 of ``(N, K, E)`` features, masked entries excluded.

    Args:
        kind: ``"max"``, ``"mean"`` or ``"gpo"``.
        gpo_pe_dim: :class:`GPO`'s ``pe_dim`` (used with ``"gpo"`` only).
        gpo_hidden: :class:`GPO`'s ``hidden``.
        gpo_temperature: :class:`GPO`'s ``temperature``.

    Raises:
        ValueError: ``kind`` is not one of :data:`POOLINGS`.
    """

    def __init__(
        self,
        kind: str = "max",
        *,
        gpo_pe_dim: int = 32,
        gpo_hidden: int = 32,
        gpo_temperature: float = 0.1,
    ) -> None:
        super().__init__()
        if kind not in POOLINGS:
            raise ValueError(f"pooling must be one of {POOLINGS}, got {kind!r}")
        self.kind = kind
        self.gpo = (
            GPO(pe_dim=gpo_pe_dim, hidden=gpo_hidden, temperature=gpo_temperature)
            if kind == "gpo"
            else None
        )

    def forward(self, features: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        """Pool the valid entries of each row.

        Args:
            features: ``(N, K, E)`` features.
            mask: ``(N, K)`` bool, True at valid entries; None means all valid.

        Returns:
            The pooled ``(N, E)`` features.

        Raises:
            ValueError: ``features`` is not 3-D, ``mask`` has another shape, or a row has no
                valid entry.
        """
        if features.dim() != 3:
            raise ValueError(f"features must be (N, K, E), got shape {tuple(features.shape)}")
        if mask is None:
            mask = torch.ones(features.shape[:2], dtype=torch.bool, device=features.device)
        if mask.shape != features.shape[:2]:
            raise ValueError(
                f"mask must be (N, K) = {tuple(features.shape[:2])}, got {tuple(mask.shape)}"
            )
        mask = mask.to(torch.bool)
        if not bool(mask.any(dim=1).all()):
            raise ValueError("mask has a row without any valid entry; nothing to pool")
        if self.kind == "max":
            low = torch.finfo(features.dtype).min
            return features.masked_fill(~mask.unsqueeze(-1), low).amax(dim=1)
        if self.kind == "mean":
            weights = mask.to(features.dtype).unsqueeze(-1)
            count = weights.sum(dim=1).clamp_min(1.0)
            return (features * weights).sum(dim=1) / count
        assert self.gpo is not None  # kind == "gpo"
        return self.gpo(features, mask)

    def extra_repr(self) -> str:
        return f"kind={self.kind!r}"


def region_dropout_mask(mask: torch.Tensor, rate: float) -> torch.Tensor:
    """VSE-infinity's region dropout: drop each valid region with probability ``rate``.

    A row that would lose every region keeps one random valid region.

    Args:
        mask: ``(N, R)`` bool, True at valid regions.
        rate: Drop probability (VSE-infinity uses 0.2 at train time).

    Returns:
        The ``(N, R)`` mask of the kept regions.
    """
    noise = torch.rand(mask.shape, device=mask.device)
    keep = mask & (noise >= rate)
    empty = ~keep.any(dim=1)
    if bool(empty.any()):
        rescue = noise.masked_fill(~mask, -1.0).argmax(dim=1)
        keep[empty, rescue[empty]] = True
    return keep


class ImageEncoder(nn.Module):
    """Precomputed features -> joint-space embeddings ``(N, embed_dim)``.

    ``(N, R, in_dim)`` regions are projected by one linear layer and pooled with ``pooling``
    (``"max"`` is VSE++ (BUTD), ``"gpo"`` VSE-infinity); ``(N, in_dim)`` vectors are only
    projected. ``region_dropout`` drops that fraction of regions in training mode (VSE-infinity
    uses 0.2); evaluation mode uses every region. ``lengths`` (valid regions per row, the first
    ``lengths[i]``) or a boolean ``mask`` mark padding for variable region counts.

    Args:
        in_dim: Feature size of the inputs (2048 for bottom-up-attention regions).
        embed_dim: Size of the joint space.
        pooling: One of :data:`POOLINGS`.
        region_dropout: Fraction of regions dropped in training mode, in ``[0, 1)``.
        gpo_pe_dim: :class:`GPO`'s ``pe_dim``.
        gpo_hidden: :class:`GPO`'s ``hidden``.
        gpo_temperature: :class:`GPO`'s ``temperature``.

    Raises:
        ValueError: A size is not a positive int, ``region_dropout`` lies outside ``[0, 1)``,
            or ``pooling`` is unknown.
    """

    def __init__(
        self,
        *,
        in_dim: int = 2048,
        embed_dim: int = 1024,
        pooling: str = "max",
        region_dropout: float = 0.0,
        gpo_pe_dim: int = 32,
        gpo_hidden: int = 32,
        gpo_temperature: float = 0.1,
    ) -> None:
        super().__init__()
        for name, value in (("in_dim", in_dim), ("embed_dim", embed_dim)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        if not 0.0 <= region_dropout < 1.0:
            raise ValueError(f"region_dropout must lie in [0, 1), got {region_dropout!r}")
        self.in_dim = in_dim
        self.embed_dim = embed_dim
        self.region_dropout = float(region_dropout)
        self.fc = nn.Linear(in_dim, embed_dim)
        self.pool = MaskedPooling(
            pooling,
            gpo_pe_dim=gpo_pe_dim,
            gpo_hidden=gpo_hidden,
            gpo_temperature=gpo_temperature,
        )
        # Xavier-uniform as in the VSE lineage's FC image encoders.
        r = math.sqrt(6.0) / math.sqrt(in_dim + embed_dim)
        nn.init.uniform_(self.fc.weight, -r, r)
        nn.init.zeros_(self.fc.bias)

    @property
    def pooling(self) -> str:
        """The pooling kind, one of :data:`POOLINGS`."""
        return self.pool.kind

    def forward(
        self,
        features: torch.Tensor,
        lengths: torch.Tensor | None = None,
        *,
        mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Project and pool precomputed features into the joint space.

        Args:
            features: ``(N, R, in_dim)`` regions or ``(N, in_dim)`` vectors.
            lengths: ``(N,)`` valid regions per row (the first ``lengths[i]``).
            mask: ``(N, R)`` bool, True at valid regions (instead of ``lengths``).

        Returns:
            The ``(N, embed_dim)`` embeddings (not normalised).

        Raises:
            ValueError: ``features`` has the wrong rank or last dimension, both ``lengths`` and
                ``mask`` are given, or either is given with vectors.
        """
        if not isinstance(features, torch.Tensor) or features.dim() not in (2, 3):
            shape = tuple(features.shape) if isinstance(features, torch.Tensor) else features
            raise ValueError(
                f"features must be a tensor (N, R, {self.in_dim}) or (N, {self.in_dim}), "
                f"got {shape!r:.80}"
            )
        if features.size(-1) != self.in_dim:
            raise ValueError(
                f"features have last dimension {features.size(-1)}; expected in_dim="
                f"{self.in_dim} (shape {tuple(features.shape)})"
            )
        features = features.to(self.fc.weight.dtype)
        if features.dim() == 2:
            if lengths is not None or mask is not None:
                raise ValueError("lengths/mask apply to (N, R, D) region features, not vectors")
            return self.fc(features)
        if lengths is not None and mask is not None:
            raise ValueError("pass either lengths or mask, not both")
        if lengths is not None:
            mask = lengths_to_mask(lengths.to(features.device), features.size(1))
        elif mask is None:
            mask = torch.ones(features.shape[:2], dtype=torch.bool, device=features.device)
        if self.training and self.region_dropout > 0:
            mask = region_dropout_mask(mask.to(torch.bool), self.region_dropout)
        return self.pool(self.fc(features), mask)

    def extra_repr(self) -> str:
        return f"region_dropout={self.region_dropout}"


__all__ = [
    "GPO",
    "POOLINGS",
    "ImageEncoder",
    "MaskedPooling",
    "lengths_to_mask",
    "region_dropout_mask",
    "sinusoidal_positions",
]
