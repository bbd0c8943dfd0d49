"""Tiny person-search folders in the released layouts (CUHK-PEDES ``reid_raw.json``, ICFG-PEDES
``ICFG-PEDES.json``, RSTPReid ``data_captions.json``) with JPEGs written by PIL."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

#: (raw id, split, number of captions) per image, in file order: ids start at 1 (CUHK-PEDES);
#: train persons 1, 2, 3 (three images of 1), val 5 and 7, test 9 and 11.
CUHK_IMAGES = [
    (1, "train", 2),
    (3, "train", 1),
    (1, "train", 2),
    (2, "train", 2),
    (1, "train", 1),
    (3, "train", 2),
    (5, "val", 2),
    (7, "val", 2),
    (7, "val", 1),
    (9, "test", 2),
    (11, "test", 2),
    (9, "test", 2),
]
WORDS = ["red", "blue", "green", "black", "white", "grey", "yellow", "pink"]


def caption(person: int, k: int) -> str:
    return f"A person in a {WORDS[person % len(WORDS)]} coat and {WORDS[k % len(WORDS)]} shoes."


def write_jpeg(path: Path, person: int, k: int, size: tuple[int, int] = (20, 48)) -> None:
    from PIL import Image

    path.parent.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(person * 100 + k)
    pixels = rng.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)
    Image.fromarray(pixels).save(path, "JPEG")


def write_pedes(
    root: Path, format: str = "cuhk-pedes", images=CUHK_IMAGES, *, name: str | None = None
) -> Path:
    """Write the annotation file (returned) and ``imgs/`` of ``images`` under ``root``."""
    root.mkdir(parents=True, exist_ok=True)
    records = []
    for k, (person, split, n_caps) in enumerate(images):
        caps = [caption(person, k * 10 + c) for c in range(n_caps)]
        if format == "rstpreid":
            path = f"{person:04d}_c{k % 5}_{k:04d}.jpg"
            records.append({"id": person, "img_path": path, "captions": caps, "split": split})
        else:
            folder = "CUHK01" if format == "cuhk-pedes" else ("test" if k % 2 else "train")
            path = f"{folder}/{person:04d}{k:03d}.jpg"
            records.append(
                {
                    "split": split,
                    "captions": caps,
                    "file_path": path,
                    "processed_tokens": [c.lower().rstrip(".").split() for c in caps],
                    "id": person,
                }
            )
        write_jpeg(root / "imgs" / path, person, k)
    default = {
        "cuhk-pedes": "reid_raw.json",
        "icfg-pedes": "ICFG-PEDES.json",
        "rstpreid": "data_captions.json",
    }[format]
    out = root / (name or default)
    out.write_text(json.dumps(records, indent=1))
    return out


#: The tiny random CLIP the person-search tests train (preset ViT-B-32's shape, 16 px, width 16).
TINY_CLIP = {
    "projection_dim": 16,
    "vision_config": {
        "hidden_size": 16,
        "intermediate_size": 32,
        "num_hidden_layers": 1,
        "num_attention_heads": 2,
        "image_size": 16,
        "patch_size": 8,
    },
    "text_config": {
        "hidden_size": 16,
        "intermediate_size": 32,
        "num_hidden_layers": 1,
        "num_attention_heads": 2,
        "max_position_embeddings": 77,
    },
}


def toml_inline(value) -> str:
    """``value`` (a dict of numbers and dicts) as a TOML inline table."""
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{k} = {toml_inline(v)}" for k, v in value.items()) + " }"
    return repr(value)


#: :data:`TINY_CLIP` as a config file writes it (``config = ...`` of ``[model]``).
TINY_CLIP_TOML = toml_inline(TINY_CLIP)
