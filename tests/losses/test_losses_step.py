"""StepInputs: a loss takes exactly the fields it declared."""

import pytest
import torch

from vlret.losses import StepInputs, build_loss
from vlret.semantic import CaptionTfidf


def test_forward_step_equals_forward_with_ids():
    gen = torch.Generator().manual_seed(0)
    img, txt = torch.randn(6, 8, generator=gen), torch.randn(6, 8, generator=gen)
    ids = torch.tensor([0, 0, 1, 2, 3, 4])
    for name in ("triplet", "infonce", "unified"):
        loss = build_loss(name)
        assert loss.step_inputs() == frozenset()
        step = loss.forward_step(img, txt, StepInputs(img_ids=ids, txt_ids=ids, epoch=3))
        torch.testing.assert_close(step, loss(img, txt, ids, ids), rtol=0, atol=0)


def test_declared_fields_follow_the_configuration():
    assert "shard" in build_loss("infonce", chunk_size=4).step_inputs()
    assert "shard" not in build_loss("infonce").step_inputs()
    assert "captions" not in build_loss("triplet").step_inputs()


def test_undeclarable_field_is_named():
    with pytest.raises(ValueError, match="epoch"):
        StepInputs().keywords(frozenset({"epoch"}))


def test_similarity_step_is_from_similarity_with_the_ids_mask():
    gen = torch.Generator().manual_seed(1)
    sim = torch.randn(5, 5, generator=gen, dtype=torch.float64)
    ids = torch.tensor([0, 1, 1, 2, 3])
    mask = ids[:, None] == ids[None, :]  # written out: the ids' further positives
    for name in ("triplet", "infonce"):
        loss = build_loss(name)
        got = loss.similarity_step(sim, StepInputs(img_ids=ids, txt_ids=ids))
        torch.testing.assert_close(got, loss.from_similarity(sim, mask), rtol=0, atol=0)


def test_similarity_step_hands_vsl_its_captions_and_names_them_when_missing():
    semantic = CaptionTfidf().fit({0: ["a red box"], 1: ["a blue ball"], 2: ["green tree"]})
    loss = build_loss("vsl", semantic=semantic, text_side=True)
    sim = torch.tensor([[0.9, 0.1, 0.2], [0.3, 0.8, 0.1], [0.2, 0.4, 0.7]], dtype=torch.float64)
    ids = torch.arange(3)
    captions = ["a red box", "a blue ball", "green tree"]
    got = loss.similarity_step(sim, StepInputs(img_ids=ids, captions=captions))
    want = loss.from_similarity(sim, None, img_ids=ids, txt_ids=ids, captions=captions)
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    with pytest.raises(ValueError, match="captions"):
        loss.similarity_step(sim, StepInputs(img_ids=ids, txt_ids=ids))
