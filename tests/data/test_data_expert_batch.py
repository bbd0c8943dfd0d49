"""ExpertSample / ExpertBatch: collate, indexing, device moves, frame masks, and the
RetrievalDataset collate path (dataset.stack_features) that builds them."""

from __future__ import annotations

import pytest
import torch

from vlret.data.dataset import RetrievalBatch, stack_features
from vlret.data.expert_batch import ExpertBatch, ExpertSample


def _sample(seed: int, app: bool, frames: int) -> ExpertSample:
    g = torch.Generator().manual_seed(seed)
    return ExpertSample(
        names=("app", "aud"),
        features={"app": torch.randn(5, generator=g), "aud": torch.randn(4, 3, generator=g)},
        present=torch.tensor([app, frames > 0]),
        frames=torch.tensor([int(app), frames]),
    )


def test_collate_stacks_each_field():
    samples = [_sample(0, True, 2), _sample(1, False, 4), _sample(2, True, 0)]
    batch = ExpertBatch.collate(samples)
    assert batch.names == ("app", "aud") and len(batch) == 3
    for k, s in enumerate(samples):
        assert torch.equal(batch.features["app"][k], s.features["app"])
        assert torch.equal(batch.features["aud"][k], s.features["aud"])
    assert batch.present.tolist() == [[True, True], [False, True], [True, False]]
    assert batch.frames.tolist() == [[1, 2], [0, 4], [1, 0]]
    assert batch.is_temporal("aud") and not batch.is_temporal("app")


def test_frame_mask_matches_a_naive_loop():
    batch = ExpertBatch.collate([_sample(k, True, t) for k, t in enumerate((2, 4, 0, 1))])
    mask = batch.frame_mask("aud")
    want = [[step < t for step in range(4)] for t in (2, 4, 0, 1)]
    assert mask.dtype == torch.bool and mask.tolist() == want
    with pytest.raises(ValueError, match="pooled"):
        batch.frame_mask("app")


def test_index_slice_and_to():
    batch = ExpertBatch.collate([_sample(k, k % 2 == 0, k) for k in range(4)])
    part = batch[1:3]
    assert len(part) == 2 and part.frames[:, 1].tolist() == [1, 2]
    picked = batch[torch.tensor([3, 0])]
    assert torch.equal(picked.features["aud"][1], batch.features["aud"][0])
    assert picked.present.tolist() == [[False, True], [True, False]]
    moved = batch.to("cpu")
    assert moved.names == batch.names and torch.equal(moved.frames, batch.frames)


def test_collate_refuses_mismatched_or_empty():
    a = _sample(0, True, 1)
    b = ExpertSample(("aud", "app"), a.features, a.present, a.frames)
    with pytest.raises(ValueError, match="disagree on the experts"):
        ExpertBatch.collate([a, b])
    with pytest.raises(ValueError, match="at least one"):
        ExpertBatch.collate([])


def test_stack_features_and_retrieval_batch_move():
    samples = [_sample(0, True, 2), _sample(1, False, 3)]
    feats = stack_features(samples)
    assert isinstance(feats, ExpertBatch) and feats.present.shape == (2, 2)
    batch = RetrievalBatch(
        features=feats,
        captions=torch.zeros(2, 3, dtype=torch.long),
        lengths=torch.tensor([3, 2]),
        img_index=torch.tensor([0, 1]),
        cap_index=torch.tensor([0, 1]),
    )
    moved = batch.to("cpu")
    assert isinstance(moved.features, ExpertBatch)
    assert torch.equal(moved.features.features["aud"], feats.features["aud"])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU for pinned memory")
def test_pin_memory_and_cuda_move():
    batch = ExpertBatch.collate([_sample(0, True, 2)]).pin_memory()
    assert batch.present.is_pinned() and batch.features["aud"].is_pinned()
    assert batch.to("cuda", non_blocking=True).frames.device.type == "cuda"
