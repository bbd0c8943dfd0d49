"""Weighted combinations of losses ("sdm+id", ["cmpm", "id"], "adacl+id"): the value is the
weighted sum of the parts called alone, the capabilities the parts' union, the config forms and
their errors name the part and key."""

from __future__ import annotations

import pytest
import torch

from vlret._checks import ParamError
from vlret.losses import (
    CombinedLoss,
    StepInputs,
    build_loss,
    check_loss_params,
    loss_capabilities,
    loss_class,
)
from vlret.run.config import config_from_dict
from vlret.run.config_files import ConfigError

ID = {"num_classes": 4, "dim": 5}


def _batch(n=6, d=5, seed=0):
    gen = torch.Generator().manual_seed(seed)
    img = torch.randn(n, d, generator=gen, dtype=torch.float64)
    txt = img + 0.5 * torch.randn(n, d, generator=gen, dtype=torch.float64)
    return img, txt


def test_value_is_the_weighted_sum_of_the_parts_called_alone():
    torch.manual_seed(0)
    combo = build_loss("sdm+id", weights={"sdm": 1.5, "id": 0.25}, sdm={"scale": 20.0}, id=ID)
    assert isinstance(combo, CombinedLoss) and list(combo.parts) == ["sdm", "id"]
    sdm = build_loss("sdm", scale=20.0)
    ident = build_loss("id", **ID)
    ident.load_state_dict(combo.parts["id"].state_dict())
    img, txt = (t.requires_grad_(True) for t in _batch())
    pids = torch.tensor([0, 0, 1, 2, 3, 3])
    got = combo(img, txt, pids, pids)
    want = 1.5 * sdm(img, txt, pids, pids) + 0.25 * ident(img, txt, pids, pids)
    torch.testing.assert_close(got, want, rtol=1e-14, atol=0)
    g_got = torch.autograd.grad(got, (img, txt))
    g_want = torch.autograd.grad(want, (img, txt))
    for a, b in zip(g_got, g_want, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-14)
    step = combo.forward_step(img, txt, StepInputs(img_ids=pids, txt_ids=pids))
    torch.testing.assert_close(step, got, rtol=0, atol=0)


def test_default_weights_are_one_and_cmpm_id_is_cmpm_plus_cmpc():
    torch.manual_seed(1)
    combo = build_loss("cmpm+id", id=ID)
    assert combo.weights == {"cmpm": 1.0, "id": 1.0}
    img, txt = _batch(seed=2)
    ids = [0, 1, 2, 3, 0, 1]
    want = build_loss("cmpm")(img, txt, ids, ids) + combo.parts["id"](img, txt, ids, ids)
    torch.testing.assert_close(combo(img, txt, ids, ids), want, rtol=1e-14, atol=0)


def test_names_and_classes():
    assert loss_class("sdm + id") is loss_class("sdm+id")
    assert loss_class("sdm+id").registry_name == "sdm+id"
    assert loss_class("id+sdm") is not loss_class("sdm+id")
    with pytest.raises(ValueError, match="unknown part 'nope'"):
        loss_class("sdm+nope")
    with pytest.raises(ValueError, match="'sdm' appears twice"):
        loss_class("sdm+sdm")
    with pytest.raises(ValueError, match="two or more"):
        loss_class("sdm+")


def test_capabilities_are_the_union_of_the_parts():
    assert loss_capabilities("sdm+id").local_shards  # both take local shards
    assert not loss_capabilities("triplet+id", {}).owns_queue
    adacl = loss_capabilities("adacl+id", {"adacl": {"queue_size": 8}})
    assert adacl.owns_queue and adacl.needs_embed_dim and adacl.momentum_keys
    assert loss_capabilities("triplet+id").all_negatives_warmup  # the triplet part warms up
    assert not loss_capabilities("circle+id").local_shards  # circle has no tiled form
    combo = build_loss("sdm+id", sdm={"chunk_size": 2}, id=ID)
    assert combo.chunk_size == 2
    assert build_loss("sdm+id", id=ID).chunk_size is None  # the dense sdm: no local shards


def test_tiled_parts_and_shards_add_up():
    torch.manual_seed(2)
    combo = build_loss(
        "sdm+tal+id", sdm={"chunk_size": 2}, tal={"chunk_size": 3, "reduction": "mean"}, id=ID
    )
    dense = build_loss("sdm+tal+id", tal={"reduction": "mean"}, id=ID)
    dense.load_state_dict(combo.state_dict())
    img, txt = _batch(n=6, seed=3)
    pids = [0, 0, 1, 2, 3, 3]
    whole = combo(img, txt, pids, pids)
    torch.testing.assert_close(whole, dense(img, txt, pids, pids), rtol=1e-12, atol=1e-13)
    halves = [combo(img, txt, pids, pids, shard=s) for s in ((0, 4), (4, 6))]
    torch.testing.assert_close(halves[0] + halves[1], whole, rtol=1e-12, atol=1e-13)


def test_adacl_is_a_part_and_its_stats_pass_through():
    combo = build_loss("adacl+id", id=ID)
    img, txt = _batch(n=6, seed=5)
    ids = [0, 1, 2, 3, 0, 1]
    value = combo(img, txt, ids, ids)
    assert torch.isfinite(value)
    assert "m1" in combo.last_stats and "m1" in combo.parts["adacl"].last_stats
    assert len(combo.synced_buffers()) == len(combo.parts["adacl"].synced_buffers())


def test_parameter_errors_name_the_part_and_key():
    with pytest.raises(ParamError, match=r"sdm\.scale must be > 0") as err:
        check_loss_params("sdm+id", {"sdm": {"scale": -1.0}})
    assert err.value.param == "sdm.scale"
    with pytest.raises(ParamError, match=r"weights\.tal: 'tal' is not a part"):
        build_loss("sdm+id", weights={"tal": 1.0}, id=ID)
    with pytest.raises(ParamError, match=r"weights\.id must be >= 0"):
        build_loss("sdm+id", weights={"id": -1.0}, id=ID)
    with pytest.raises(ParamError, match="reduction is set per part"):
        build_loss("sdm+id", reduction="sum", id=ID)
    with pytest.raises(ParamError, match="all use reduction='none' or none"):
        build_loss("sdm+id", sdm={"reduction": "none"}, id=ID)
    with pytest.raises(ValueError, match=r"part 'id'.*img_ids must be training identities"):
        build_loss("sdm+id", id=ID)(*_batch(), [0, 1, 2, 3, 4, 5], [0, 1, 2, 3, 4, 5])
    with pytest.raises(ValueError, match=r"part 'id'.*classifies embeddings"):
        build_loss("sdm+id", id=ID).from_similarity(torch.eye(3))


def _raw(loss):
    return {
        "output_dir": "runs/x",
        "data": {"root": "data/x", "format": "precomp"},
        "model": {"embed_dim": 8},
        "loss": loss,
        "optim": {},
        "train": {"epochs": 1, "batch_size": 4},
    }


def test_config_string_and_list_forms_with_part_tables():
    loss = {"name": "sdm+id", "weights": {"sdm": 1.0, "id": 0.5}, "sdm": {"scale": 40.0}}
    by_string = config_from_dict(_raw(loss))
    by_list = config_from_dict(_raw({**loss, "name": ["sdm", "id"]}))
    assert by_string.loss == by_list.loss
    assert by_list.loss.name == "sdm+id"
    assert by_list.to_dict()["loss"] == loss  # the resolved config names it "sdm+id"


@pytest.mark.parametrize(
    ("loss", "key", "message"),
    [
        ({"name": "sdm+id", "sdm": {"scale": 0.0}}, "loss.sdm.scale", "scale must be > 0"),
        ({"name": "sdm+id", "id": {"bias": 1}}, "loss.id.bias", "bias must be a bool"),
        ({"name": "sdm+id", "weights": {"idd": 1.0}}, "loss.weights.idd", "not a part"),
        ({"name": "sdm+id", "margin": 0.2}, "loss.margin", "not a parameter"),
        ({"name": ["sdm", "nope"]}, "loss.name", "unknown part 'nope'"),
        ({"name": ["sdm", 3]}, "loss.name", "expected loss names"),
    ],
)
def test_config_errors_name_the_part_and_key(loss, key, message):
    with pytest.raises(ConfigError, match=message) as err:
        config_from_dict(_raw(loss))
    assert key in str(err.value)
