"""Frame-feature video encoder: the region encoder applied to frames.

MSR-VTT features (:class:`vlret.data.MSRVTTDataset`) are ``(N, T, D)`` per-frame features or
``(N, D)`` pooled vectors. Frames play the part of regions: a linear projection to the joint
space, then ``"mean"`` (the usual temporal average), ``"max"`` or ``"gpo"`` pooling over the
valid frames (``lengths`` or ``mask`` mark padded frames of shorter videos).
"""

from __future__ import annotations

from .image import ImageEncoder


class VideoEncoder(ImageEncoder):
    """``(N, T, in_dim)`` frames or ``(N, in_dim)`` vectors -> ``(N, embed_dim)``.

    Args:
        in_dim: Feature size of a frame.
        embed_dim: Size of the joint space.
        pooling: Pooling over frames, one of :data:`~vlret.models.image.POOLINGS`.
        frame_dropout: Fraction of frames dropped in training mode (the video analogue of
            VSE-infinity's region dropout), in ``[0, 1)``.
        gpo_pe_dim: :class:`~vlret.models.image.GPO`'s ``pe_dim``.
        gpo_hidden: :class:`~vlret.models.image.GPO`'s ``hidden``.
        gpo_temperature: :class:`~vlret.models.image.GPO`'s ``temperature``.

    Raises:
        ValueError: As :class:`~vlret.models.image.ImageEncoder`.
    """

    def __init__(
        self,
        *,
        in_dim: int = 2048,
        embed_dim: int = 1024,
        pooling: str = "mean",
        frame_dropout: float = 0.0,
        gpo_pe_dim: int = 32,
        gpo_hidden: int = 32,
        gpo_temperature: float = 0.1,
    ) -> None:
        super().__init__(
            in_dim=in_dim,
            embed_dim=embed_dim,
            pooling=pooling,
            region_dropout=frame_dropout,
            gpo_pe_dim=gpo_pe_dim,
            gpo_hidden=gpo_hidden,
            gpo_temperature=gpo_temperature,
        )

    @property
    def frame_dropout(self) -> float:
        """Fraction of frames dropped in training mode."""
        return self.region_dropout


__all__ = ["VideoEncoder"]
