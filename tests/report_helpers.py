"""The tiny worlds and checkpoints the report tests build, and the page read back: a
precomputed folder with region boxes and four checkpoints, a Karpathy folder of JPEGs with a
pixel two-tower checkpoint, a synthetic persons world with a SCAN checkpoint
(:func:`persons_world`), and :class:`QueryParser` over ``index.html``."""

from __future__ import annotations

import json
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import numpy as np
import torch

from train_helpers import tiny_raw
from vlret.data.formats.precomp import build_precomp_vocab
from vlret.data.vocab import build_vocab
from vlret.data.writers import make_tiny_karpathy, make_tiny_precomp
from vlret.models import build_model
from vlret.run.builders import encoder_state
from vlret.run.checkpoint import save_checkpoint
from vlret.run.config import config_from_dict

SMALL = {"embed_dim": 16, "image": {"in_dim": 16}, "text": {"word_dim": 8}}
MODELS = {
    "scan": {"kind": "scan", **SMALL},
    "bfan": {"kind": "bfan", **SMALL},
    "sgraf": {"kind": "sgraf", "sim_dim": 8, "sgr_steps": 1, "num_regions": 4, **SMALL},
}
TINY_RESNET = {"depths": [1, 1], "hidden_sizes": [8, 16], "embedding_size": 8}


def write_checkpoint(path: Path, raw: dict[str, Any], vocab, *, seed: int) -> Path:
    """A checkpoint as the trainer writes it, for an untrained model with seeded weights."""
    config = config_from_dict(raw)
    torch.manual_seed(seed)
    model = build_model(config.model, vocab_size=len(vocab))
    state = {"config": config.to_dict(), "encoder": encoder_state(vocab, config)}
    save_checkpoint({**state, "vocab_size": len(vocab), "model": model.state_dict()}, path)
    return path


def precomp_world(root: Path) -> tuple[Path, dict[str, Path]]:
    """A precomputed folder (test: 6 images x 5 captions, 4 regions of 16 features, with BUTD
    style pixel boxes) and a two-tower, a SCAN, a BFAN and an SGRAF checkpoint."""
    data = root / "data"
    make_tiny_precomp(
        data, sizes={"train": 6, "dev": 2, "test": 6, "testall": 10}, feature_shape=(4, 16)
    )
    rng = np.random.default_rng(0)
    xy = rng.uniform(0, 300, size=(6, 4, 2))
    wh = rng.uniform(20, 200, size=(6, 4, 2))
    np.save(data / "test_boxes.npy", np.concatenate([xy, xy + wh], axis=2).astype(np.float32))
    vocab = build_precomp_vocab(data, min_count=1)
    ckpts = {
        "tower": write_checkpoint(root / "tower.pt", tiny_raw(data, root / "u"), vocab, seed=1)
    }
    for seed, (name, model) in enumerate(MODELS.items()):
        raw = tiny_raw(data, root / "u")
        raw["model"] = model
        ckpts[name] = write_checkpoint(root / f"{name}.pt", raw, vocab, seed=2 + seed)
    return data, ckpts


def karpathy_world(root: Path) -> tuple[Path, Path]:
    """A Karpathy folder (dataset_coco.json and JPEGs under images/; test: 4 images x 5
    captions) and a two-tower checkpoint with a tiny random ResNet on pixels."""
    data = root / "kdata"
    data.mkdir()
    entries = make_tiny_karpathy(
        data / "dataset_coco.json",
        splits={"train": 3, "val": 2, "test": 4},
        image_root=data / "images",
    )
    captions = [s.raw for e in entries for s in e.sentences]
    vocab = build_vocab(captions, min_count=1)
    raw = tiny_raw(data, root / "u")
    raw["data"] = {
        "root": str(data),
        "format": "karpathy",
        "karpathy_json": str(data / "dataset_coco.json"),
        "image_root": "images",
        "min_count": 1,
    }
    raw["model"] = {
        "embed_dim": 16,
        "image": {
            "kind": "resnet",
            "preset": "resnet-152",
            "config": TINY_RESNET,
            "image_size": 32,
        },
        "text": {"kind": "gru", "word_dim": 8},
    }
    return data, write_checkpoint(root / "pixels.pt", raw, vocab, seed=5)


class QueryParser(HTMLParser):
    """The report's query sections read back: ``(direction, group, query) -> rank`` from the
    ``data-*`` attributes, the heading text of each, its top-K cards ``(index, relevant)`` and
    its cards of the ground truths below the top K ``(index, position)``, in page order."""

    def __init__(self) -> None:
        super().__init__()
        self.queries: dict[tuple[str, str, int], int] = {}
        self.headings: dict[tuple[str, str, int], str] = {}
        self.items: dict[tuple[str, str, int], list[tuple[int, bool]]] = {}
        self.truths: dict[tuple[str, str, int], list[tuple[int, int]]] = {}
        self._current: tuple[str, str, int] | None = None
        self._in_h4 = False
        self.text: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        if tag == "section" and a.get("class") == "query":
            key = (str(a["data-direction"]), str(a["data-group"]), int(str(a["data-query"])))
            self.queries[key] = int(str(a["data-rank"]))
            self.items[key] = []
            self._current = key
        elif tag == "h4" and self._current is not None:
            self._in_h4 = True
            self.headings[self._current] = ""
        elif tag == "li" and self._current is not None and "truth" in str(a.get("class")).split():
            where = self.truths.setdefault(self._current, [])
            where.append((int(str(a["data-index"])), int(str(a["data-position"]))))
        elif tag == "li" and self._current is not None and "data-index" in a:
            self.items[self._current].append(
                (int(str(a["data-index"])), a.get("data-relevant") == "1")
            )

    def handle_endtag(self, tag: str) -> None:
        if tag == "h4":
            self._in_h4 = False
        elif tag == "section":
            self._current = None

    def handle_data(self, data: str) -> None:
        self.text.append(data)
        if self._in_h4 and self._current is not None:
            self.headings[self._current] += data


def parse_report(folder: Path) -> tuple[QueryParser, dict[str, Any]]:
    parser = QueryParser()
    parser.feed((folder / "index.html").read_text(encoding="utf-8"))
    return parser, json.loads((folder / "report.json").read_text(encoding="utf-8"))


def persons_world(root: Path) -> tuple[Path, Path]:
    """A synthetic persons world (CUHK-PEDES layout with region features; test: 3 people x 2
    pictures) and a SCAN checkpoint with seeded weights."""
    from vlret.worlds.persons import write_persons

    world = root / "world"
    write_persons(
        world, sizes={"train": 6, "val": 3, "test": 3}, images_per_id=2, height=32, width=16,
        features=True, image_format="png",
    )  # fmt: skip
    records = json.loads((world / "reid_raw.json").read_text(encoding="utf-8"))
    vocab = build_vocab([c for r in records for c in r["captions"]], min_count=1)
    raw = tiny_raw(world, root / "u")
    raw["data"] = {
        "root": str(world),
        "format": "cuhk-pedes",
        "features_dir": str(world / "features"),
        "min_count": 1,
    }
    raw["model"] = {
        "kind": "scan",
        "embed_dim": 16,
        "image": {"in_dim": 64},
        "text": {"word_dim": 8},
    }
    return world, write_checkpoint(root / "scan.pt", raw, vocab, seed=9)
