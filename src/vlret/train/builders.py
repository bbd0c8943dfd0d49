"""From a :class:`~vlret.train.config.RunConfig` to datasets, caption encoders and losses.

Shared by the trainer and ``vlret eval`` (which rebuilds them from the config stored in a
checkpoint).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from torch import nn

from ..data import (
    KarpathyDataset,
    MSRVTTDataset,
    PrecompDataset,
    RetrievalDataset,
    Vocabulary,
    build_karpathy_vocab,
    build_msrvtt_vocab,
    build_vocab,
    load_hf_tokenizer,
)
from ..data.precomp import load_precomp_captions
from .config import ConfigError, DataConfig, RunConfig


def model_tokenizer_path(model: dict[str, Any]) -> str | None:
    """The local Hugging Face directory whose tokenizer a BERT or CLIP model config expects."""
    if model.get("kind") in ("bert", "clip"):
        return str(model["path"]) if "path" in model else None
    text = model.get("text")
    if isinstance(text, dict) and text.get("kind") == "bert" and "path" in text:
        return str(text["path"])
    return None


def build_encoder(
    data: DataConfig, *, model: dict[str, Any] | None = None, source: str = "<config>"
) -> Any:
    """The caption encoder: ``data.tokenizer`` (a local HF tokenizer directory), the tokenizer
    of a BERT / CLIP model's directory, ``data.vocab`` (a vocab JSON), or a vocabulary built
    from the train (+dev) captions."""
    tokenizer = data.tokenizer or model_tokenizer_path(model or {})
    if tokenizer is not None:
        return load_hf_tokenizer(tokenizer)
    if data.vocab is not None:
        return Vocabulary.load(data.vocab)
    root = Path(data.root)
    if data.format == "precomp":
        splits = [data.train_split]
        if data.dev_split and (root / f"{data.dev_split}_caps.txt").is_file():
            splits.append(data.dev_split)
        captions = load_precomp_captions(root, splits, captions_per_image=data.captions_per_image)
        return build_vocab(captions, min_count=data.min_count)
    if data.format == "msrvtt":
        return build_msrvtt_vocab(root, protocol=data.protocol, min_count=data.min_count)
    if data.karpathy_json is None:
        raise ConfigError(source, "data.karpathy_json", "required for format 'karpathy'")
    return build_karpathy_vocab(data.karpathy_json, min_count=data.min_count)


def encoder_state(encoder: Any, config: RunConfig) -> dict[str, Any]:
    """What a checkpoint stores to rebuild the encoder without the training data."""
    if isinstance(encoder, Vocabulary):
        return {"kind": "vocab", "idx2word": list(encoder.idx2word)}
    return {"kind": "hf", "path": config.data.tokenizer or model_tokenizer_path(config.model)}


def encoder_from_state(state: dict[str, Any]) -> Any:
    if state["kind"] == "vocab":
        return Vocabulary(state["idx2word"])
    return load_hf_tokenizer(state["path"])


def vocab_size(encoder: Any) -> int | None:
    """``len(vocabulary)`` for the GRU's word embeddings; ``None`` for HF tokenizers."""
    return len(encoder) if isinstance(encoder, Vocabulary) else None


def build_dataset(
    data: DataConfig,
    split: str,
    encoder: Any,
    *,
    root: str | Path | None = None,
    max_images: int | None = None,
    protocol: str | None = None,
    image_transform: Any = None,
) -> RetrievalDataset:
    """One split in the configured format (``root`` and ``protocol`` override the config)."""
    root = Path(root if root is not None else data.root)
    if data.format == "precomp":
        return PrecompDataset(
            root,
            split,
            encoder=encoder,
            captions_per_image=data.captions_per_image,
            max_images=max_images,
        )
    if data.format == "msrvtt":
        ds = MSRVTTDataset(
            root,
            split,
            protocol=protocol or data.protocol,
            encoder=encoder,
            features_dir=data.features_dir,
            captions_per_video=data.captions_per_video,
        )
        return _first_images(ds, max_images)
    json_path = Path(data.karpathy_json) if data.karpathy_json else root
    ds = KarpathyDataset(
        json_path,
        split,
        image_root=data.image_root,
        image_transform=image_transform,
        encoder=encoder,
        captions_per_image=data.captions_per_image,
    )
    return _first_images(ds, max_images)


def _first_images(ds: RetrievalDataset, max_images: int | None) -> RetrievalDataset:
    """Keep the first ``max_images`` images (and their captions) of a dataset in place."""
    if max_images is None or max_images >= ds.num_images:
        return ds
    keep = ds.txt_to_img < max_images
    ds.captions = [c for c, k in zip(ds.captions, keep.tolist(), strict=True) if k]
    ds.txt_to_img = ds.txt_to_img[keep]
    ds.image_ids = ds.image_ids[:max_images]
    return ds


def train_captions_by_image(dataset: RetrievalDataset) -> dict[int, list[str]]:
    """Captions of each training image keyed by image index (VSL's CaptionTfidf)."""
    out: dict[int, list[str]] = {i: [] for i in range(dataset.num_images)}
    for text, img in zip(dataset.captions, dataset.txt_to_img.tolist(), strict=True):
        out[img].append(text)
    return out


def build_run_loss(config: RunConfig, train_set: RetrievalDataset | None) -> nn.Module:
    """The configured loss; VSL gets a CaptionTfidf fitted on the train captions (keyed by
    image index, the ids the trainer passes); AdaCL's queue gets ``embed_dim`` from the model."""
    from ..losses import build_loss

    params = dict(config.loss.params)
    if config.loss.name == "vsl":
        if train_set is None:
            raise ValueError("the VSL loss needs the training captions to fit its CaptionTfidf")
        from ..semantic import CaptionTfidf

        params["semantic"] = CaptionTfidf().fit(train_captions_by_image(train_set))
    if config.loss.name == "adacl" and params.get("queue_size") and "embed_dim" not in params:
        embed_dim = config.model.get("embed_dim")
        if not isinstance(embed_dim, int):
            raise ConfigError(
                config.source,
                "loss.embed_dim",
                "needed by the memory queue (or set model.embed_dim)",
            )
        params["embed_dim"] = embed_dim
    try:
        return build_loss(config.loss.name, **params)
    except ValueError as err:
        raise ConfigError(config.source, "loss", str(err)) from None
