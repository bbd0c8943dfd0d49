"""The worked example of docs/adding-a-relevance-kind.md: a relevance kind defined here
(``same-scene``: every image of the caption's scene is relevant), registered, and ranked by the
ranking core; its ranks and metrics are checked against values counted by hand."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import pytest
import torch

from vlret.eval import EvalProtocol, get_protocol
from vlret.metrics import (
    Relevance,
    get_relevance,
    matrix_blocks,
    mean_average_precision,
    rank_queries,
    recall_at_k,
    register_relevance,
    relevance_names,
)
from vlret.metrics import relevance_kinds as kinds_module


@dataclass(frozen=True)
class SameScene(Relevance):
    """Every image of the caption's scene is relevant to it, and every caption of the image's
    scene to the image."""

    name: ClassVar[str] = "same-scene"
    directions: ClassVar[tuple[str, ...]] = ("t2i", "i2t")
    needs: ClassVar[tuple[str, ...]] = ("image_scene", "caption_scene")

    def row_column_ids(self, labels: Mapping[str, Any]) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.as_tensor(labels["image_scene"]), torch.as_tensor(labels["caption_scene"])


@pytest.fixture
def registry(monkeypatch):
    """The relevance registry, restored after the test (the kind is the test's own)."""
    monkeypatch.setattr(kinds_module, "_REGISTRY", dict(kinds_module._REGISTRY))


def test_a_new_relevance_kind_is_ranked_by_the_core(registry) -> None:
    register_relevance(SameScene())
    scene = get_relevance("same-scene")
    assert "same-scene" in relevance_names()
    # 3 images (rows) x 4 captions (columns); scenes: images 0, 2 and captions 0, 1 are scene 0
    sim = torch.tensor(
        [
            [0.9, 0.2, 0.4, 0.1],
            [0.3, 0.8, 0.7, 0.6],
            [0.5, 0.5, 0.2, 0.3],
        ]
    )
    labels = {"image_scene": [0, 1, 0], "caption_scene": [0, 0, 1, 1]}
    ranks = rank_queries(
        matrix_blocks(sim.t()), scene, labels, direction="t2i", n_queries=4, every=True
    )
    # caption 0 ranks images 0 (0.9), 2 (0.5), 1: relevant at 1, 2
    # caption 1 ranks 1 (0.8), 2 (0.5), 0 (0.2): relevant at 2, 3
    # captions 2, 3 (scene 1) rank image 1 first
    assert ranks.first.tolist() == [0, 1, 0, 0]
    assert ranks.positions is not None
    assert ranks.positions.tolist() == [[1, 2], [2, 3], [1, 0], [1, 0]]
    assert recall_at_k(ranks.first, 1) == 75.0
    ap = [(1 / 1 + 2 / 2) / 2, (1 / 2 + 2 / 3) / 2, 1.0, 1.0]
    assert mean_average_precision(ranks) == pytest.approx(100 * sum(ap) / 4, abs=1e-12)
    # image 2 (scene 0): captions 0 and 1 tie at 0.5 and both are relevant: positions 1, 2
    by_image = rank_queries(
        matrix_blocks(sim), scene, labels, direction="i2t", n_queries=3, every=True
    )
    assert by_image.first.tolist() == [0, 1, 0]  # image 1: caption 1 (0.8) above 0.7
    assert by_image.positions is not None
    assert by_image.positions[2].tolist() == [1, 2]


def test_a_protocol_names_the_new_kind_by_its_registry_name(registry) -> None:
    register_relevance(SameScene())
    record = EvalProtocol(
        name="scenes",
        title="t",
        paper_set="p",
        paper_splits=("test",),
        paper_images=3,
        paper_texts=4,
        splits={"karpathy": ("test",)},
        summary="s",
        relevance="same-scene",
    )
    assert record.relevance_kind == SameScene()
    assert not record.relevance_kind.captions and record.visual == "image"
    assert get_protocol(record) is record
    with pytest.raises(ValueError, match="registered twice"):
        register_relevance(SameScene())
