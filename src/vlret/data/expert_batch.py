"""Per-video multi-expert features in memory: one video (:class:`ExpertSample`) and a batch
(:class:`ExpertBatch`), the ``features`` of a :class:`~vlret.data.RetrievalBatch` for the
multi-expert video models (CE, MMT; :mod:`vlret.models.video_experts`).

Every video carries every expert of the data set in one fixed order (``names``): a pooled
expert as a ``(D_e,)`` vector, a temporal one as ``(T_e, D_e)`` frames padded with zeros to the
data set's ``T_e``. ``present`` says which experts a video has and ``frames`` how many of a
temporal expert's frames are real (a present pooled expert counts 1, an absent expert 0). An
absent expert's features are whatever the file holds (zeros by our writers): models must never
read them, only ``present``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch


@dataclass
class ExpertSample:
    """One video's experts.

    Attributes:
        names: The experts, in the data set's order.
        features: ``name -> (D_e,)`` (pooled) or ``(T_e, D_e)`` (temporal) float32 tensors.
        present: ``(E,)`` bool, whether the video has each expert.
        frames: ``(E,)`` long, real frames of each expert (1 for a present pooled expert, 0
            for an absent one).
    """

    names: tuple[str, ...]
    features: dict[str, torch.Tensor]
    present: torch.Tensor
    frames: torch.Tensor


@dataclass
class ExpertBatch:
    """A batch of videos' experts (:meth:`collate` of :class:`ExpertSample`).

    Attributes:
        names: The experts, in order (``present[:, e]`` is ``names[e]``).
        features: ``name -> (B, D_e)`` or ``(B, T_e, D_e)``.
        present: ``(B, E)`` bool.
        frames: ``(B, E)`` long.
    """

    names: tuple[str, ...]
    features: dict[str, torch.Tensor]
    present: torch.Tensor
    frames: torch.Tensor

    @classmethod
    def collate(cls, samples: Sequence[ExpertSample]) -> ExpertBatch:
        """Stack videos that share one expert list.

        Raises:
            ValueError: No samples, or samples with different expert names.
        """
        if not samples:
            raise ValueError("ExpertBatch.collate needs at least one sample")
        names = samples[0].names
        for s in samples[1:]:
            if s.names != names:
                raise ValueError(f"samples disagree on the experts: {s.names} vs {names}")
        return cls(
            names=names,
            features={n: torch.stack([s.features[n] for s in samples]) for n in names},
            present=torch.stack([s.present for s in samples]),
            frames=torch.stack([s.frames for s in samples]),
        )

    def __len__(self) -> int:
        return int(self.present.shape[0])

    def __getitem__(self, index: slice | torch.Tensor) -> ExpertBatch:
        """The videos at ``index`` (a slice or an index tensor), as a batch."""
        return ExpertBatch(
            self.names,
            {n: f[index] for n, f in self.features.items()},
            self.present[index],
            self.frames[index],
        )

    def to(self, device: torch.device | str, *, non_blocking: bool = False) -> ExpertBatch:
        """A copy on ``device``."""
        return ExpertBatch(
            self.names,
            {n: f.to(device, non_blocking=non_blocking) for n, f in self.features.items()},
            self.present.to(device, non_blocking=non_blocking),
            self.frames.to(device, non_blocking=non_blocking),
        )

    def pin_memory(self) -> ExpertBatch:
        """A copy in pinned memory (what a ``DataLoader(pin_memory=True)`` asks of a batch)."""
        return ExpertBatch(
            self.names,
            {n: f.pin_memory() for n, f in self.features.items()},
            self.present.pin_memory(),
            self.frames.pin_memory(),
        )

    def is_temporal(self, name: str) -> bool:
        """Whether expert ``name`` has frames ``(B, T_e, D_e)``."""
        return self.features[name].dim() == 3

    def frame_mask(self, name: str) -> torch.Tensor:
        """``(B, T_e)`` bool, the real frames of temporal expert ``name`` (all False where the
        video lacks it)."""
        feats = self.features[name]
        if feats.dim() != 3:
            raise ValueError(f"expert {name!r} is pooled; it has no frames")
        count = self.frames[:, self.names.index(name)]
        steps = torch.arange(feats.shape[1], device=feats.device)
        return steps[None, :] < count.to(feats.device)[:, None]


__all__ = ["ExpertBatch", "ExpertSample"]
