"""The checks of a ``[data]`` section that depend on its format, asked of the format's record
(:mod:`vlret.data.formats.registry`) instead of its name."""

from __future__ import annotations

from typing import Any

from ..transforms import INTERPOLATIONS, TRAIN_TRANSFORMS, range_problem
from .registry import get_format, missing_key_problem, owned_key_problem


def image_data_problem(data: Any, model: dict[str, Any]) -> tuple[str, str] | None:
    """The first problem of a ``[data]`` section's image-data keys (``train_transform``,
    crops, shards, CSV), as ``(key, message)``, or None (:mod:`vlret.run.config` raises it);
    ``model`` is the ``[model]`` section (a model directory with ``path`` brings its
    tokenizer). A key only another format reads, a key the format requires
    (:attr:`~vlret.data.formats.registry.DataFormat.owns` / ``needs``), an augmentation of a
    format that serves features, and a format that builds no vocabulary without a tokenizer
    are asked of the format's record."""
    if data.train_transform not in TRAIN_TRANSFORMS:
        return "train_transform", f"expected one of {', '.join(TRAIN_TRANSFORMS)}"
    problem = range_problem(data.crop_scale, data.crop_ratio)
    if problem:
        return problem.partition(" ")[0], problem.partition(" ")[2]
    if data.crop_interpolation not in INTERPOLATIONS:
        return "crop_interpolation", f"expected one of {', '.join(INTERPOLATIONS)}"
    record = get_format(data.format)
    if data.train_transform != "none" and record.inputs == "features":
        return "train_transform", f"format {data.format!r} serves no images to augment"
    if data.train_transform != "none" and record.inputs != "pixels" and data.features_dir:
        return "train_transform", "data.features_dir serves precomputed features, no images"
    if not 0.0 <= data.max_bad_fraction <= 1.0:
        return "max_bad_fraction", f"expected a fraction in [0, 1], got {data.max_bad_fraction!r}"
    cap = data.max_image_pixels
    if isinstance(cap, bool) or not isinstance(cap, int) or cap < 1:
        return "max_image_pixels", f"expected a positive integer (width x height), got {cap!r}"
    if data.shuffle_buffer < 0:
        return "shuffle_buffer", f"expected an integer >= 0, got {data.shuffle_buffer!r}"
    if len(data.csv_separator) != 1:
        return "csv_separator", f"expected one character, got {data.csv_separator!r}"
    if (missing := missing_key_problem(data)) is not None:
        return missing
    if data.train_num_samples is not None and data.train_num_samples < 1:
        return "train_num_samples", "expected a positive integer"
    if (owned := owned_key_problem(data)) is not None:
        return owned
    text = model.get("text")
    has_tokenizer = (
        bool(model.get("path"))
        or model.get("tokenizer") == "bytes"  # a preset CLIP's byte tokenizer
        or (isinstance(text, dict) and "path" in text)
    )
    if record.vocabulary is None and not (data.vocab or data.tokenizer or has_tokenizer):
        return "tokenizer", (
            f"format {data.format!r} builds no vocabulary: give data.tokenizer (a local "
            'Hugging Face tokenizer directory), data.vocab, model.tokenizer = "bytes" (a '
            "preset CLIP) or a model directory"
        )
    return None


__all__ = ["image_data_problem"]
