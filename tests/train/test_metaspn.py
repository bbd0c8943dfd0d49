"""Meta-SPN (``train.procedure = "metaspn"``, vlret.train.procedures.metaspn): the weighted triplet
loss against a naive loop, the virtual step against SGD on a deep copy, the meta gradient against
finite differences, an exact resume, a pair-scoring model, the shipped configs, bad options."""

from __future__ import annotations

import copy
import json
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from torch.func import functional_call

from train_helpers import assert_same_params, model_params, tiny_config
from vlret.data.formats import open_dataset
from vlret.data.writers import make_tiny_precomp
from vlret.losses import build_loss
from vlret.losses.triplet import triplet_loss
from vlret.models import build_model
from vlret.run.builders import build_encoder, vocab_size
from vlret.run.config import load_config
from vlret.train.hooks.core import TrainHook
from vlret.train.procedures.metaspn import (
    DevBatches,
    MetaSPNStep,
    WeightingNetwork,
    batch_similarity,
    metaspn_options,
    pair_weights,
    virtual_step,
    weighted_triplet_loss,
)
from vlret.train.procedures.registry import build_procedure

CONFIGS = Path(__file__).resolve().parents[2] / "src" / "vlret" / "configs"


@pytest.fixture
def float64():
    threads, dtype = torch.get_num_threads(), torch.get_default_dtype()
    torch.set_num_threads(1)
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_num_threads(threads)
    torch.set_default_dtype(dtype)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("metaspn_data")
    make_tiny_precomp(root, sizes={"train": 8, "dev": 4, "test": 2}, feature_shape=(4, 16))
    return root


def naive_weighted_triplet(sim, w_i2t, w_t2i, ids, margin, hardest):
    """Per-anchor loop in float64: each anchor's negatives (other ids), the hinge times its
    weight; hardest: the first most similar negative only."""
    s = sim.tolist()
    n = len(s)
    terms = []
    for i in range(n):
        img_negs = [j for j in range(n) if ids[j] != ids[i]]
        txt_negs = [j for j in range(n) if ids[j] != ids[i]]  # images of other ids
        if hardest:
            img_negs = img_negs and [max(img_negs, key=lambda j: (s[i][j], -j))]
            txt_negs = txt_negs and [max(txt_negs, key=lambda j: (s[j][i], -j))]
        term = sum(w_i2t[i][j] * max(0.0, margin + s[i][j] - s[i][i]) for j in img_negs)
        term += sum(w_t2i[j][i] * max(0.0, margin + s[j][i] - s[i][i]) for j in txt_negs)
        terms.append(term)
    return terms


@pytest.mark.parametrize("hardest", [False, True])
def test_weighted_triplet_loss_matches_a_naive_loop(hardest):
    gen = torch.Generator().manual_seed(3)
    ids = [0, 0, 1, 2, 3, 3, 4]
    sim = torch.rand(7, 7, generator=gen, dtype=torch.float64) * 2 - 1
    sim[2, 4] = sim[2, 3] = 0.9  # a tie of image 2's hardest negative: the first (3) wins
    w_i2t = torch.rand(7, 7, generator=gen, dtype=torch.float64)
    w_t2i = torch.rand(7, 7, generator=gen, dtype=torch.float64)
    pos = torch.tensor(ids)[:, None] == torch.tensor(ids)[None, :]
    expected = naive_weighted_triplet(sim, w_i2t.tolist(), w_t2i.tolist(), ids, 0.2, hardest)
    got = weighted_triplet_loss(
        sim, w_i2t, w_t2i, margin=0.2, hardest=hardest, pos_mask=pos, reduction="none"
    )
    torch.testing.assert_close(
        got, torch.tensor(expected, dtype=torch.float64), rtol=1e-13, atol=1e-14
    )
    for reduction, value in (("sum", sum(expected)), ("mean", sum(expected) / 7)):
        out = weighted_triplet_loss(
            sim, w_i2t, w_t2i, hardest=hardest, pos_mask=pos, reduction=reduction
        )
        assert float(out) == pytest.approx(value, rel=1e-13)
    # weighted by ones it is the triplet loss; a batch of one image gives a graph-attached 0
    ones = torch.ones_like(sim)
    plain = weighted_triplet_loss(sim, ones, ones, hardest=hardest, pos_mask=pos)
    assert float(plain) == pytest.approx(float(triplet_loss(sim, hardest=hardest, pos_mask=pos)))
    leaf = sim.clone().requires_grad_(True)
    same = torch.ones(7, 7, dtype=torch.bool)
    zero = weighted_triplet_loss(leaf, w_i2t, w_t2i, hardest=hardest, pos_mask=same)
    zero.backward()
    assert float(zero.detach()) == 0.0 and leaf.grad is not None and not leaf.grad.any()
    with pytest.raises(ValueError, match=r"w_t2i must be a \(7, 7\) tensor like sim, got \(7,\)"):
        weighted_triplet_loss(sim, w_i2t, w_t2i[0])


def test_pair_weights_read_self_and_relative_similarity(float64):
    torch.manual_seed(0)
    net = WeightingNetwork([5, 3])
    sim = torch.rand(4, 4) * 2 - 1
    with torch.no_grad():
        w_i2t, w_t2i = pair_weights(net, sim)
        for i in range(4):
            for j in range(4):
                row = net.mlp(torch.tensor([sim[i, i], sim[i, j] - sim[i, i]])).sigmoid()
                col = net.mlp(torch.tensor([sim[j, j], sim[i, j] - sim[j, j]])).sigmoid()
                assert float(w_i2t[i, j]) == pytest.approx(float(row), rel=1e-14)
                assert float(w_t2i[i, j]) == pytest.approx(float(col), rel=1e-14)
    assert ((w_i2t > 0) & (w_i2t < 1)).all()


def _tiny(data):
    """A tiny two-tower model, its triplet loss and two batches."""
    cfg = tiny_config(data, data.parent / "unused")
    encoder = build_encoder(cfg.data, model=cfg.model)
    torch.manual_seed(0)
    model = build_model(cfg.model, vocab_size=vocab_size(encoder))
    train = open_dataset(cfg.data, "train", encoder=encoder)
    dev = open_dataset(cfg.data, "dev", encoder=encoder)
    batch = train.collate([train[i] for i in (0, 1, 5, 9, 13, 22)])  # 0 and 1: one image
    dev_batch = dev.collate([dev[i] for i in (0, 6, 11, 17)])
    return model, build_loss("triplet", margin=0.2, hardest=False), batch, dev_batch


def test_the_virtual_step_equals_sgd_on_a_deep_copy(data, float64):
    model, loss_fn, batch, dev_batch = _tiny(data)
    net = WeightingNetwork([4])
    sim, mask = batch_similarity(loss_fn, model(batch), batch.img_index)
    w_i2t, w_t2i = pair_weights(net, sim)
    loss = weighted_triplet_loss(sim, w_i2t, w_t2i, pos_mask=mask)
    params = dict(model.named_parameters())
    lrs = {n: 0.1 if "image" in n else 0.05 for n in params}  # per-group rates
    virtual = virtual_step(loss, params, lrs)

    twin = copy.deepcopy(model)
    twin_sim, _ = batch_similarity(loss_fn, twin(batch), batch.img_index)
    w_i2t, w_t2i = (w.detach() for w in pair_weights(net, twin_sim))
    weighted_triplet_loss(twin_sim, w_i2t, w_t2i, pos_mask=mask).backward()
    with torch.no_grad():
        for name, p in twin.named_parameters():
            p -= lrs[name] * p.grad
    moved = 0
    for name, p in twin.named_parameters():
        torch.testing.assert_close(virtual[name].detach(), p.detach(), rtol=1e-12, atol=1e-13)
        moved += int(not torch.equal(p, params[name]))
    assert moved > 0
    # the functional call scores the dev batch as the stepped copy does
    img, txt = functional_call(model, virtual, (dev_batch,))
    twin_img, twin_txt = twin(dev_batch)
    torch.testing.assert_close(img.detach(), twin_img.detach(), rtol=1e-12, atol=1e-13)
    torch.testing.assert_close(txt.detach(), twin_txt.detach(), rtol=1e-12, atol=1e-13)
    # the learning rates of the optimiser's groups, or virtual_lr
    step = MetaSPNStep(metaspn_options({}))
    image = [p for n, p in model.named_parameters() if n.startswith("image")]
    rest = [p for n, p in model.named_parameters() if not n.startswith("image")]
    opt = torch.optim.SGD([{"params": image, "lr": 0.3}, {"params": rest, "lr": 0.02}])
    rates = step.learning_rates(model, opt)
    assert rates == {n: 0.3 if n.startswith("image") else 0.02 for n, _ in model.named_parameters()}
    fixed = MetaSPNStep(metaspn_options({"virtual_lr": 0.5})).learning_rates(model, opt)
    assert set(fixed.values()) == {0.5}


@pytest.mark.parametrize("meta_loss", ["hardest", "all"])
def test_the_meta_gradient_matches_finite_differences(data, float64, meta_loss):
    model, loss_fn, batch, dev_batch = _tiny(data)
    step = MetaSPNStep(metaspn_options({"hidden": [3], "meta_loss": meta_loss}), seed=1)
    lrs = {n: 0.5 for n, _ in model.named_parameters()}  # large: a visible second order
    sim, mask = batch_similarity(loss_fn, model(batch), batch.img_index)
    meta, grads = step.meta_gradients(model, loss_fn, sim, mask, dev_batch, lrs)

    def meta_value() -> float:  # the meta loss recomputed from scratch, no create_graph
        s, m = batch_similarity(loss_fn, model(batch), batch.img_index)
        w_i2t, w_t2i = pair_weights(step.net, s)
        loss = weighted_triplet_loss(s, w_i2t, w_t2i, pos_mask=m)
        params = dict(model.named_parameters())
        virtual = virtual_step(loss, params, lrs, create_graph=False)
        dev_sim, dev_mask = batch_similarity(
            loss_fn, functional_call(model, virtual, (dev_batch,)), dev_batch.img_index
        )
        hardest = meta_loss == "hardest"
        return float(triplet_loss(dev_sim, hardest=hardest, pos_mask=dev_mask).detach())

    assert float(meta) == pytest.approx(meta_value(), rel=1e-12)
    eps = 1e-5
    for p, g in zip(step.net.parameters(), grads, strict=True):
        numeric = torch.zeros_like(p)
        for k in range(p.numel()):
            with torch.no_grad():
                p.view(-1)[k] += eps
            up = meta_value()
            with torch.no_grad():
                p.view(-1)[k] -= 2 * eps
            down = meta_value()
            with torch.no_grad():
                p.view(-1)[k] += eps
            numeric.view(-1)[k] = (up - down) / (2 * eps)
        # central differences: O(eps^2) truncation, O(1e-16 / eps) rounding of O(1) values
        torch.testing.assert_close(g, numeric, rtol=1e-5, atol=1e-8)
    assert any(g.abs().max() > 1e-6 for g in grads)  # the meta loss reaches the network


class CopyAfterEpoch(TrainHook):
    """Keeps ``last.pt`` as written at the end of epoch ``epoch``."""

    def __init__(self, out: Path, epoch: int = 1) -> None:
        self.out, self.epoch = out, epoch

    def after_epoch(self, ctx, record):
        if ctx.epoch == self.epoch:
            shutil.copy(ctx.output_dir / "last.pt", self.out)


def test_a_run_trains_checkpoints_and_resumes_exactly(data, tmp_path):
    from vlret.train import Trainer

    settings = [
        "train.procedure=metaspn",
        "train.epochs=2",
        "train.max_steps_per_epoch=3",
        "train.log_every=1",
        "loss.hardest=false",
        "train.procedure_options={hidden = [6], meta_lr = 0.01, meta_batch_size = 8}",
    ]
    full = Trainer(
        tiny_config(data, tmp_path / "full", settings),
        print_fn=None,
        hooks=[CopyAfterEpoch(tmp_path / "epoch1.pt")],
    )
    start = {k: v.clone() for k, v in full.loss_step.net.state_dict().items()}
    model_start = model_params(full.model)
    full.fit()
    step = full.loss_step
    assert isinstance(step, MetaSPNStep) and full.step == 6
    assert step.last_meta_loss is not None and 0 < step.last_mean_weight < 1
    logged = [json.loads(line) for line in (tmp_path / "full" / "metrics.jsonl").open()]
    last = [r for r in logged if r["kind"] == "step"][-1]
    assert last["step"] == 6 and 0 < last["metaspn_mean_weight"] < 1
    assert last["metaspn_meta_loss"] >= 0
    for name, value in step.net.state_dict().items():  # the weighting network learned
        assert not torch.equal(value, start[name]), name
    assert any(not torch.equal(v, model_start[k]) for k, v in model_params(full.model).items())
    # 20 dev captions, batches of 8: two per pass, so 6 meta steps end in pass 2
    assert step.dev.state_dict() == {"cycle": 2, "offset": 16}
    saved = torch.load(tmp_path / "epoch1.pt", weights_only=True)
    assert set(saved["procedure"]) == {"net", "optimizer", "dev"}
    assert saved["procedure"]["dev"] == {"cycle": 1, "offset": 8}

    resumed = Trainer(
        tiny_config(data, tmp_path / "resumed", settings),
        print_fn=None,
        resume=tmp_path / "epoch1.pt",
    )
    assert resumed.epoch == 1 and resumed.loss_step.dev.state_dict() == {"cycle": 1, "offset": 8}
    resumed.fit()
    assert_same_params(model_params(resumed.model), model_params(full.model))
    assert_same_params(resumed.loss_step.net.state_dict(), step.net.state_dict())
    a, b = resumed.loss_step.meta_optimizer.state_dict(), step.meta_optimizer.state_dict()
    for k in a["state"]:
        assert_same_params(a["state"][k], b["state"][k])
    assert resumed.loss_step.dev.state_dict() == step.dev.state_dict()
    with pytest.raises(ValueError, match=r"another training procedure \(calls\)"):
        resumed.loss_step.load_state_dict({"calls": torch.tensor(1)})


def test_a_pair_scoring_model_trains_through_its_own_forward(data, tmp_path):
    from train_helpers import tiny_raw
    from vlret.run.config import apply_overrides, config_from_dict
    from vlret.train import Trainer

    raw = tiny_raw(data, tmp_path / "scan")
    raw["model"] = {
        "kind": "scan",
        "embed_dim": 8,
        "image": {"in_dim": 16},
        "text": {"word_dim": 4},
    }
    raw["train"].update(epochs=1, max_steps_per_epoch=2, procedure="metaspn")
    raw["train"]["procedure_options"] = {"hidden": [4], "meta_lr": 0.01}
    trainer = Trainer(config_from_dict(apply_overrides(raw, [])), print_fn=None)
    assert trainer.scores_pairs
    start = {k: v.clone() for k, v in trainer.loss_step.net.state_dict().items()}
    trainer.fit()
    assert trainer.step == 2 and trainer.loss_step.last_meta_loss is not None
    moved = [not torch.equal(v, start[k]) for k, v in trainer.loss_step.net.state_dict().items()]
    assert all(moved)


class Rows(list):
    """A dataset of row numbers whose batches are the rows themselves."""

    def collate(self, got):
        return got


def test_dev_batches_cycle_in_a_seeded_order_and_resume():
    dataset = Rows(range(7))
    dev = DevBatches(dataset, 3, seed=5)
    seen = [dev.next() for _ in range(4)]  # passes of two batches (one row left out each)
    assert len(set(seen[0] + seen[1])) == 6 and len(set(seen[2] + seen[3])) == 6
    assert seen[0] + seen[1] != seen[2] + seen[3]  # another order each pass
    again = DevBatches(dataset, 3, seed=5)
    assert [again.next() for _ in range(4)] == seen  # the order is the seed's
    later = DevBatches(dataset, 3, seed=5)
    later.load_state_dict({"cycle": 1, "offset": 3})
    assert later.next() == seen[3]
    assert (
        DevBatches(dataset, 3, seed=6).next() + DevBatches(dataset, 3, seed=6).next() != seen[0] * 2
    )
    assert sorted(DevBatches(Rows(range(2)), 8, seed=0).next()) == [0, 1]  # a smaller split


@pytest.mark.parametrize("focal", ["equal", "prob"])
def test_the_shipped_bfan_rows_keep_bfans_settings(focal):
    meta = load_config(CONFIGS / f"bfan_{focal}_f30k_metaspn.toml")
    base = load_config(CONFIGS / f"bfan_{focal}_f30k_triplet.toml")
    assert meta.model == base.model and meta.optim == base.optim
    assert (meta.train.epochs, meta.train.batch_size) == (base.train.epochs, base.train.batch_size)
    assert meta.loss.params == {"margin": 0.2, "hardest": False}
    step = build_procedure(meta)
    assert isinstance(step, MetaSPNStep) and step.options.hidden == (100,)
    assert step.meta_batch_size == 128


BAD_OPTIONS = [
    ({"hiden": [4]}, "hiden: unknown Meta-SPN option; known: hidden"),
    ({"hidden": [4, 0]}, r"hidden: expected a list of positive hidden sizes, got \[4, 0\]"),
    ({"hidden": 4}, "hidden: expected a list of positive hidden sizes, got 4"),
    ({"meta_lr": 0}, "meta_lr: expected a positive number, got 0"),
    ({"virtual_lr": True}, "virtual_lr: expected a positive number, got True"),
    ({"meta_every": 0}, "meta_every: expected an integer >= 1, got 0"),
    ({"meta_batch_size": 1.5}, "meta_batch_size: expected an integer >= 2, got 1.5"),
    ({"meta_loss": "semi"}, "meta_loss: expected 'hardest' or 'all', got 'semi'"),
]


@pytest.mark.parametrize(("options", "message"), BAD_OPTIONS)
def test_bad_options_name_the_key_and_value(data, tmp_path, options, message):
    cfg = tiny_config(data, tmp_path / "x", ["train.procedure=metaspn"])
    cfg.train.procedure_options = options
    with pytest.raises(ValueError, match=f"train.procedure_options.{message}") as err:
        build_procedure(cfg)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["loss.name=unified"], r"loss.name: Meta-SPN weighs the triplet .* got 'unified'"),
        (["loss.chunk_size=4"], "loss.chunk_size: Meta-SPN weighs every pair"),
        (["data.dev_split=null"], "data.dev_split: Meta-SPN's meta batches come from the dev"),
    ],
)
def test_what_the_procedure_needs_of_the_config(data, tmp_path, overrides, message):
    cfg = tiny_config(data, tmp_path / "x", ["train.procedure=metaspn", *overrides])
    with pytest.raises(ValueError, match=message) as err:
        build_procedure(cfg)
    assert "\n" not in str(err.value)


def test_one_process_and_no_gradient_caching():
    step = MetaSPNStep(metaspn_options({}))
    with pytest.raises(ValueError, match="runs in one process .* world size of 2"):
        step.hooks(SimpleNamespace(world_size=2, grad_cache=None))
    with pytest.raises(ValueError, match="train.grad_cache_chunk: Meta-SPN"):
        step.hooks(SimpleNamespace(world_size=1, grad_cache=4))
