"""The ID loss (IRRA's identity classification), the training step's person identities and the
harness around a loss that owns parameters: the trainer's optimiser and checkpoints."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch
from torch import nn

from train_helpers import tiny_config, tiny_data
from vlret._checks import ParamError
from vlret.data.dataset import RetrievalBatch
from vlret.losses import IdentityLoss, build_loss, loss_capabilities
from vlret.run.checkpoint import load_checkpoint
from vlret.run.loss_builder import build_run_loss
from vlret.train import Trainer
from vlret.train.loss_step import LossStep, pair_ids


def _batch(n=6, d=5, seed=0):
    gen = torch.Generator().manual_seed(seed)
    img = torch.randn(n, d, generator=gen, dtype=torch.float64)
    txt = torch.randn(n, d, generator=gen, dtype=torch.float64)
    return img, txt


def _ce(logits, label):
    top = max(logits)
    return top + math.log(sum(math.exp(v - top) for v in logits)) - logits[label]


def _oracle(loss, img, txt, labels):
    """IRRA's compute_id in plain floats: (mean CE of the images + mean CE of the texts) / 2
    with one classifier W x + b for both."""
    w = loss.classifier.weight.detach().double().tolist()
    b = loss.classifier.bias.detach().double().tolist()

    def logits(x):
        return [
            sum(wi * xi for wi, xi in zip(row, x, strict=True)) + bj
            for row, bj in zip(w, b, strict=True)
        ]

    n = len(labels)
    img_ce = sum(_ce(logits(img[i]), labels[i]) for i in range(n)) / n
    txt_ce = sum(_ce(logits(txt[i]), labels[i]) for i in range(n)) / n
    return (img_ce + txt_ce) / 2


def test_id_loss_equals_irra_compute_id():
    torch.manual_seed(0)
    loss = IdentityLoss(num_classes=4, dim=5, init_std=0.5)  # large weights: CE far from log 4
    nn.init.normal_(loss.classifier.bias, std=0.3)
    img, txt = _batch()
    labels = [0, 3, 3, 1, 2, 0]
    want = _oracle(loss, img.tolist(), txt.tolist(), labels)
    assert abs(want - math.log(4)) > 0.05
    got = loss(img, txt, img_ids=torch.tensor(labels))
    # float64 embeddings, float32 weights cast to float64: the sums of 5 products agree to ~1e-15
    assert got.dtype == torch.float64
    assert got.item() == pytest.approx(want, rel=1e-12)
    per_index = build_loss("id", num_classes=4, dim=5, reduction="none")
    per_index.load_state_dict(loss.state_dict())
    terms = per_index(img, txt, labels, labels)
    assert terms.shape == (6,) and terms.mean().item() == pytest.approx(want, rel=1e-12)


def test_irra_classifier_layout_and_initialisation():
    torch.manual_seed(1)
    loss = build_loss("id", num_classes=300, dim=64)
    assert [n for n, _ in loss.named_parameters()] == ["classifier.weight", "classifier.bias"]
    assert loss.classifier.weight.shape == (300, 64)
    assert torch.equal(loss.classifier.bias, torch.zeros(300))
    std = loss.classifier.weight.std().item()
    assert 0.0009 < std < 0.0011  # N(0, 0.001^2) over 19200 draws
    assert not loss.normalize
    no_bias = build_loss("id", num_classes=3, dim=2, bias=False)
    assert no_bias.classifier.bias is None


def test_normalize_classifies_unit_embeddings():
    loss = IdentityLoss(num_classes=3, dim=5, normalize=True, init_std=1.0)
    img, txt = _batch()
    labels = [0, 1, 2, 0, 1, 2]
    scaled = loss(7.0 * img, 0.5 * txt, labels)
    torch.testing.assert_close(scaled, loss(img, txt, labels), rtol=1e-12, atol=0)


def test_shards_add_up_and_capabilities():
    loss = IdentityLoss(num_classes=4, dim=5, init_std=0.5)
    img, txt = _batch()
    labels = [0, 3, 3, 1, 2, 0]
    whole = loss(img, txt, labels)
    parts = [loss(img, txt, labels, shard=s) for s in ((0, 2), (2, 6))]
    torch.testing.assert_close(parts[0] + parts[1], whole, rtol=1e-12, atol=0)
    assert not loss_capabilities("id").local_shards  # no tiled form of its own
    assert loss_capabilities("sdm+id").local_shards  # but it takes a combination's shard


def test_gradients_reach_the_classifier_and_both_embeddings():
    loss = IdentityLoss(num_classes=4, dim=5, init_std=0.5)
    img, txt = (t.requires_grad_(True) for t in _batch())
    loss(img, txt, [0, 1, 2, 3, 0, 1]).backward()
    for g in (img.grad, txt.grad, loss.classifier.weight.grad, loss.classifier.bias.grad):
        assert g is not None and g.abs().sum() > 0


def test_bad_input_is_named():
    img, txt = _batch()
    with pytest.raises(ValueError, match="built without num_classes and dim"):
        build_loss("id")(img, txt, [0] * 6)
    with pytest.raises(ValueError, match="built without dim"):
        build_loss("id", num_classes=3)(img, txt, [0] * 6)
    with pytest.raises(ParamError, match="num_classes must be"):
        build_loss("id", num_classes=0, dim=4)
    loss = IdentityLoss(num_classes=3, dim=5)
    with pytest.raises(ValueError, match=r"img_ids must be training identities in \[0, 3\).*got 3"):
        loss(img, txt, [0, 1, 2, 3, 0, 1])
    with pytest.raises(ValueError, match="needs img_ids"):
        loss(img, txt)
    with pytest.raises(ValueError, match="dim=5 columns, got 4"):
        loss(img[:, :4], txt[:, :4], [0] * 6)
    with pytest.raises(ValueError, match="classifies embeddings"):
        loss.from_similarity(torch.eye(3))


# -- the training step's ids --------------------------------------------------------------


class _FixedModel(nn.Module):
    def __init__(self, img, txt):
        super().__init__()
        self.img, self.txt = img, txt

    def forward(self, batch):
        return self.img, self.txt


def _step_trainer(loss_fn, img, txt):
    """The TrainContext a step receives, over the few trainer values a standard step reads."""
    from vlret.run.devices import DistEnv
    from vlret.train.context import TrainContext

    return TrainContext(
        SimpleNamespace(
            ddp_model=_FixedModel(img, txt),
            loss_fn=loss_fn,
            train_set=None,
            scores_pairs=False,
            gather=False,
            local_shards=False,
            exchange="gather",
            env=DistEnv(rank=0, world_size=1, local_rank=0),
            epoch=0,
            step=0,
            config=None,
            grad_cache=None,
            momentum_encoder=None,
            amp_dtype=None,
            device=torch.device("cpu"),
        )
    )


def _irra_sdm(img, txt, pid, logit_scale=50.0, epsilon=1e-8):
    """IRRA's compute_sdm as written (float64 tensors)."""
    pid = pid.reshape(-1, 1)
    labels = (pid - pid.t() == 0).double()
    image_norm = img / img.norm(dim=1, keepdim=True)
    text_norm = txt / txt.norm(dim=1, keepdim=True)
    t2i = text_norm @ image_norm.t()
    i2t = t2i.t()
    text_proj_image, image_proj_text = logit_scale * t2i, logit_scale * i2t
    labels_distribute = labels / labels.sum(dim=1)
    i2t_pred = torch.softmax(image_proj_text, dim=1)
    i2t_loss = i2t_pred * (
        torch.log_softmax(image_proj_text, dim=1) - torch.log(labels_distribute + epsilon)
    )
    t2i_pred = torch.softmax(text_proj_image, dim=1)
    t2i_loss = t2i_pred * (
        torch.log_softmax(text_proj_image, dim=1) - torch.log(labels_distribute + epsilon)
    )
    return torch.mean(i2t_loss.sum(1)) + torch.mean(t2i_loss.sum(1))


def test_step_uses_the_batch_identity_two_images_of_one_person_are_positives():
    """Images 0 and 1 are two pictures of person 5 (different image indices): with
    ``identity`` set, SDM sees them as one identity, IRRA's value on the person ids; without
    it, the image indices (a different value)."""
    img, txt = _batch(n=5, seed=4)
    identity = torch.tensor([5, 5, 2, 0, 2])
    batch = RetrievalBatch(
        features=torch.zeros(5, 3),
        captions=torch.zeros(5, 2, dtype=torch.long),
        lengths=torch.full((5,), 2),
        img_index=torch.tensor([10, 11, 12, 13, 14]),
        cap_index=torch.arange(5),
        identity=identity,
    )
    assert torch.equal(pair_ids(batch), identity)
    trainer = _step_trainer(build_loss("sdm"), img, txt)
    loss, logged, ctx = LossStep()(trainer, batch)
    want = _irra_sdm(img, txt, identity)
    # float64 throughout; 2 x 25 terms of size <= log(1/eps) ~ 18
    assert loss.item() == pytest.approx(want.item(), rel=1e-12, abs=1e-12)
    assert torch.equal(ctx["ids"], identity)
    without = RetrievalBatch(**{**batch.__dict__, "identity": None})
    other, _, _ = LossStep()(trainer, without)
    by_image = _irra_sdm(img, txt, without.img_index)
    assert other.item() == pytest.approx(by_image.item(), rel=1e-12, abs=1e-12)
    assert abs(other.item() - loss.item()) > 1e-3


# -- the harness: dimensions filled in, optimiser, checkpoint -----------------------------


def test_builders_fill_num_classes_from_identities_and_dim_from_the_model(tmp_path):
    data = tiny_data(tmp_path / "data")
    cfg = tiny_config(data, tmp_path / "run", name="id")
    persons = SimpleNamespace(image_identity=torch.tensor([3, 7, 7, 1, 3]), num_images=5)
    loss = build_run_loss(cfg, persons)
    assert (loss.config.num_classes, loss.config.dim) == (3, 16)  # model.embed_dim = 16
    model = SimpleNamespace(embed_dim=12)
    assert build_run_loss(cfg, persons, model=model).config.dim == 12
    images = SimpleNamespace(image_identity=None, num_images=8)
    assert build_run_loss(cfg, images).config.num_classes == 8
    given = tiny_config(data, tmp_path / "run", name="id", num_classes=20, dim=16)
    assert build_run_loss(given, persons).config.num_classes == 20


def test_trainer_optimises_and_checkpoints_the_classifier(tmp_path):
    """sdm+id trains the classifier with the model (its weights move), saves it in the
    checkpoint's loss state and restores it exactly on resume."""
    data = tiny_data(tmp_path / "data")
    cfg = tiny_config(
        data, tmp_path / "run", ["train.epochs=1"], name="sdm+id", weights={"id": 0.5}
    )
    trainer = Trainer(cfg)
    classifier = trainer.loss_fn.parts["id"].classifier
    assert classifier.out_features == trainer.train_set.num_images and classifier.in_features == 16
    start = classifier.weight.detach().clone()
    optimised = {id(p) for g in trainer.optimizer.param_groups for p in g["params"]}
    assert id(classifier.weight) in optimised and id(classifier.bias) in optimised
    trainer.fit()
    assert not torch.equal(classifier.weight.detach(), start)
    state = load_checkpoint(tmp_path / "run" / "last.pt")
    assert torch.equal(state["loss"]["parts.id.classifier.weight"], classifier.weight.detach())
    assert state["config"]["loss"] == {"name": "sdm+id", "weights": {"id": 0.5}}
    resumed = Trainer(cfg, resume=tmp_path / "run" / "last.pt")
    for k, v in trainer.loss_fn.state_dict().items():
        assert torch.equal(v, resumed.loss_fn.state_dict()[k]), k
    again = resumed.loss_fn.parts["id"].classifier.weight
    assert torch.equal(again, classifier.weight.detach())
