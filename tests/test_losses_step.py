"""StepInputs: a loss takes exactly the fields it declared."""

import pytest
import torch

from vlret.losses import StepInputs, build_loss


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
