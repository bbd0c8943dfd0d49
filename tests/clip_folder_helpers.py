"""Tiny Hugging Face CLIP folders written by the installed ``transformers``' own
``save_pretrained`` (model, tokenizer, image processor or processor), in each processor layout,
for the conformance and fault tests of vlret's CLIP folder reading."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import torch
import transformers
from PIL import Image

MEAN, STD = [0.3, 0.5, 0.7], [0.2, 0.3, 0.25]
#: the image processor's non-default settings (transformers' CLIPImageProcessor keywords)
PROCESSOR = {
    "size": {"shortest_edge": 40},
    "crop_size": {"height": 32, "width": 32},
    "image_mean": MEAN,
    "image_std": STD,
    "resample": 2,  # bilinear
}
#: image sizes (width, height); 54 x 50 and 50 x 54 leave an odd margin of 11 px after the
#: resize, where transformers' crop offset (5) differs from torchvision's round(5.5) = 6
SIZES = [(54, 50), (50, 54), (32, 32), (61, 37), (40, 77)]


def write_vocab(folder: Path) -> tuple[Path, Path]:
    """A small BPE: characters, characters with ``</w>``, a few merges, CLIP's specials."""
    letters = "abcdefghijklmnopqrstuvwxyz0123456789.,'-"
    tokens = [*letters, *(c + "</w>" for c in letters), "at</w>", "th", "the</w>", "ca", "cat</w>"]
    vocab = {tok: i for i, tok in enumerate(tokens)}
    vocab["<|startoftext|>"], vocab["<|endoftext|>"] = len(vocab), len(vocab) + 1
    (folder / "vocab.json").write_text(json.dumps(vocab), encoding="utf-8")
    merges = ["#version: 0.2", "a t</w>", "t h", "th e</w>", "c a", "ca t</w>"]
    (folder / "merges.txt").write_text("\n".join(merges) + "\n", encoding="utf-8")
    return folder / "vocab.json", folder / "merges.txt"


def tiny_clip_parts(root: Path) -> tuple[Any, Any, Any]:
    """The producer objects: a tiny random CLIPModel (32 px images, patch 8, width 32, 2
    layers; seeded), a tokenizer built from a vocabulary written in ``root``, and an image
    processor with :data:`PROCESSOR`'s settings."""
    vocab_file, merges_file = write_vocab(root)
    tokenizer = transformers.CLIPTokenizer(str(vocab_file), str(merges_file), model_max_length=64)
    vocab = json.loads(vocab_file.read_text())
    config = transformers.CLIPConfig(
        text_config=dict(
            vocab_size=len(vocab), hidden_size=32, intermediate_size=37, num_hidden_layers=2,
            num_attention_heads=2, max_position_embeddings=64,
            bos_token_id=vocab["<|startoftext|>"], eos_token_id=vocab["<|endoftext|>"],
            pad_token_id=vocab["<|endoftext|>"],
        ),
        vision_config=dict(
            image_size=32, patch_size=8, hidden_size=32, intermediate_size=37,
            num_hidden_layers=2, num_attention_heads=2,
        ),
        projection_dim=16,
    )  # fmt: skip
    torch.manual_seed(0)
    model = transformers.CLIPModel(config)
    return model, tokenizer, transformers.CLIPImageProcessor(**PROCESSOR)


def write_folder(folder: Path, parts, layout: str, *, tokenizer_files: bool = True) -> Path:
    """A CLIP folder as a user gets it from ``save_pretrained``, in one processor layout.

    ``v5``: ``CLIPProcessor.save_pretrained`` of the installed transformers (5.x writes
    ``processor_config.json`` with the image processor nested). ``v4``: the image processor's
    own ``save_pretrained`` (``preprocessor_config.json``, keys at the top level, as 4.x wrote
    for a processor too) and the tokenizer's. ``hub``: the ``preprocessor_config.json`` of
    ``openai/clip-vit-base-patch32`` on the Hub (``CLIPFeatureExtractor``, sizes as plain
    ints), with this test's values. ``none``: ``CLIPModel`` and tokenizer only (what
    ``CLIPModel.save_pretrained`` alone leaves: no processor file).
    """
    if layout not in ("v5", "v4", "hub", "none"):
        raise ValueError(f"layout: expected v5, v4, hub or none, got {layout!r}")
    model, tokenizer, image_processor = parts
    model.save_pretrained(str(folder))
    if layout == "v5":
        processor = transformers.CLIPProcessor(image_processor=image_processor, tokenizer=tokenizer)
        processor.save_pretrained(str(folder))
    else:
        tokenizer.save_pretrained(str(folder))
    if layout == "v4":
        image_processor.save_pretrained(str(folder))
    if layout == "hub":
        hub = {
            "crop_size": 32, "do_center_crop": True, "do_normalize": True, "do_resize": True,
            "feature_extractor_type": "CLIPFeatureExtractor", "image_mean": MEAN,
            "image_std": STD, "resample": 2, "size": 40,
        }  # fmt: skip
        (folder / "preprocessor_config.json").write_text(json.dumps(hub, indent=2))
    if not tokenizer_files:
        for name in ("tokenizer.json", "tokenizer_config.json", "vocab.json", "merges.txt"):
            (folder / name).unlink(missing_ok=True)
    return folder


def write_images(folder: Path) -> list[Path]:
    """PNGs written by PIL from seeded noise (what a user's images are to the reader)."""
    rng = np.random.default_rng(7)
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for k, (w, h) in enumerate(SIZES):
        path = folder / f"im{k}.png"
        Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)).save(path)
        paths.append(path)
    return paths
