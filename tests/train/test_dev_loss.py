"""``dev_loss``: the training loss on the dev split every epoch (vlret.train.dev_loss), checked
against a naive recomputation: the trained float64 model scoring each dev block as a training
batch, the loss written out by hand."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from train_helpers import tiny_config, tiny_raw
from vlret.data.writers import make_tiny_precomp
from vlret.losses import build_loss
from vlret.run.config import apply_overrides, config_from_dict
from vlret.train import Trainer
from vlret.train.dev_loss import (
    dev_blocks,
    dev_loss_skipped,
    dev_pair_order,
    embedding_dev_loss,
    score_dev_loss,
)
from vlret.train.hooks.core import TrainHook
from vlret.train.loss_step import LossStep

#: 5 dev images x 5 captions: blocks of 7 pairs are 7, 7, 7, 4 (drop_last off).
SIZES = {"train": 8, "dev": 5, "test": 2}
K = 5
MARGIN = 0.2


@pytest.fixture(autouse=True)
def float64_one_thread():
    """Float64 models (the truth is float64); the 2-core machine is shared."""
    dtype, threads = torch.get_default_dtype(), torch.get_num_threads()
    torch.set_default_dtype(torch.float64)
    torch.set_num_threads(1)
    yield
    torch.set_default_dtype(dtype)
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("data")
    make_tiny_precomp(root, sizes=SIZES, feature_shape=(4, 16), seed=0)
    return root


class KeepModels(TrainHook):
    """The model's and the loss's state at the end of each epoch and after each step."""

    def __init__(self) -> None:
        self.models: list[dict] = []
        self.loss_after_step: dict = {}
        self.loss_after_epoch: list[dict] = []

    def after_step(self, ctx, step) -> None:
        self.loss_after_step = copy.deepcopy(ctx.loss_fn.state_dict())

    def after_epoch(self, ctx, record) -> None:
        self.models.append(copy.deepcopy(ctx.model.state_dict()))
        self.loss_after_epoch.append(copy.deepcopy(ctx.loss_fn.state_dict()))


def epoch_records(out: Path) -> list[dict]:
    lines = (out / "metrics.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r["kind"] == "epoch"]


def naive_order(t2i: list[int]) -> list[int]:
    """Round order by hand: each image's first caption, then each image's second, ..."""
    captions: dict[int, list[int]] = {}
    for j, i in enumerate(t2i):
        captions.setdefault(i, []).append(j)
    rounds = max(len(c) for c in captions.values())
    return [c[r] for r in range(rounds) for i, c in sorted(captions.items()) if r < len(c)]


def naive_triplet(sim: torch.Tensor, ids: list[int], *, hardest: bool = True) -> float:
    """VSE++'s summed bidirectional hinge, loops over the block (pairs of one id: positives)."""
    n, total = len(ids), 0.0
    for a in range(n):
        for direction in (0, 1):
            hinges = []
            for b in range(n):
                if ids[b] == ids[a]:
                    continue
                other = sim[a, b] if direction == 0 else sim[b, a]
                hinges.append(max(0.0, MARGIN + float(other) - float(sim[a, a])))
            if hinges:
                total += max(hinges) if hardest else sum(hinges)
    return total


def naive_dev_loss(model, dev_set, batch_size: int, *, hardest: bool = True) -> float:
    """Each block collated from the dev items and scored as a training batch by the float64
    model in eval mode; the loss by hand; the mean weighted by block size."""
    model.eval()
    t2i = [int(i) for i in dev_set.txt_to_img]
    order = naive_order(t2i)
    total, count = 0.0, 0
    for start in range(0, len(order), batch_size):
        block = order[start : start + batch_size]
        if len(block) == 1:  # a last block of one pair has no negatives: dropped
            continue
        batch = dev_set.collate([dev_set[j] for j in block])
        with torch.no_grad():
            out = model(batch)
        if isinstance(out, tuple):  # two-tower: cosines of the embeddings
            sim = F.normalize(out[0], dim=1) @ F.normalize(out[1], dim=1).t()
        else:  # a pair scorer's (B, B) scores
            sim = out
        total += naive_triplet(sim, [t2i[j] for j in block], hardest=hardest) * len(block)
        count += len(block)
    return total / count


def test_round_order_and_blocks():
    t2i = [0, 0, 1, 2, 2, 2, 3]
    assert dev_pair_order(t2i).tolist() == naive_order(t2i) == [0, 2, 3, 6, 1, 4, 5]
    assert dev_pair_order(t2i, order="split").tolist() == list(range(7))
    assert dev_blocks(10, 4, drop_last=False) == [(0, 4), (4, 8), (8, 10)]
    assert dev_blocks(10, 4, drop_last=True) == [(0, 4), (4, 8)]
    assert dev_blocks(3, 4, drop_last=True) == [(0, 3)]  # the only block is kept
    assert dev_blocks(9, 4, drop_last=False) == [(0, 4), (4, 8)]  # one pair: no negatives
    with pytest.raises(ValueError, match=r"^order: expected one of round, split, got 'x'$"):
        dev_pair_order(t2i, order="x")
    with pytest.raises(ValueError, match=r"^batch_size: expected a positive integer, got 0$"):
        dev_blocks(3, 0, drop_last=False)


def test_dev_loss_of_a_two_tower_run_equals_the_naive_blocks(data, tmp_path, capsys):
    hook = KeepModels()
    overrides = ["train.epochs=2", "train.batch_size=7", "train.drop_last=false"]
    trainer = Trainer(tiny_config(data, tmp_path / "run", overrides), hooks=[hook])
    trainer.fit()
    records = epoch_records(tmp_path / "run")
    assert [list(r)[:5] for r in records] == [
        ["kind", "epoch", "step", "train_loss", "dev_loss"]
    ] * 2
    model = copy.deepcopy(trainer.model)
    for record, state in zip(records, hook.models, strict=True):
        model.load_state_dict(state)
        want = naive_dev_loss(model, trainer.dev_set, 7)
        # The trainer's embeddings are float32 (the validation's encoding): each cosine is off
        # by <= ~20 ulp(1) (rounding plus a float32 normalisation and 16-term dot product), a
        # hinge by two cosines, and a block's loss sums 2 x 7 hinges.
        assert record["dev_loss"] == pytest.approx(want, rel=0, abs=2 * 7 * 2 * 20 * 2.0**-24)
        assert want > 0.1  # not a block of positives only: the blocks hold distinct images
    out = capsys.readouterr().out
    assert f"dev loss {records[1]['dev_loss']:.4g}" in out.splitlines()[-1]


def test_dev_loss_drops_the_last_partial_block_as_training_does(data, tmp_path):
    trainer = Trainer(tiny_config(data, tmp_path / "run", ["train.epochs=1"]), print_fn=None)
    trainer.fit()
    (record,) = epoch_records(tmp_path / "run")
    # batch 8 over 25 pairs: blocks of 8, 8, 8; the last pair is dropped
    model = trainer.model
    t2i = [int(i) for i in trainer.dev_set.txt_to_img]
    order = naive_order(t2i)[:24]
    sub = trainer.dev_set
    want = 0.0
    for start in range(0, 24, 8):
        block = order[start : start + 8]
        with torch.no_grad():
            img, txt = model.eval()(sub.collate([sub[j] for j in block]))
        sim = F.normalize(img, dim=1) @ F.normalize(txt, dim=1).t()
        want += naive_triplet(sim, [t2i[j] for j in block]) / 3
    assert record["dev_loss"] == pytest.approx(want, rel=0, abs=2 * 8 * 2 * 20 * 2.0**-24)


def test_dev_loss_of_a_pair_scoring_run_equals_the_naive_blocks(data, tmp_path):
    raw = tiny_raw(data, tmp_path / "run", hardest=False)
    raw["model"] = {
        "kind": "scan",
        "embed_dim": 16,
        "image": {"in_dim": 16},
        "text": {"word_dim": 8},
    }
    overrides = ["train.epochs=1", "train.batch_size=6", "train.max_steps_per_epoch=2"]
    overrides.append("train.drop_last=false")
    hook = KeepModels()
    trainer = Trainer(
        config_from_dict(apply_overrides(raw, overrides)), hooks=[hook], print_fn=None
    )
    assert trainer.scores_pairs
    trainer.fit()
    (record,) = epoch_records(tmp_path / "run")
    want = naive_dev_loss(trainer.model, trainer.dev_set, 6, hardest=False)
    # float32 score matrix (the validation's), rounding ~20 ulp per score; VSE0 sums up to
    # 2 x 6 x 5 hinges per block
    assert record["dev_loss"] == pytest.approx(want, rel=0, abs=2 * 6 * 5 * 2 * 20 * 2.0**-24)
    assert want > 0.1


def test_a_stateful_loss_is_left_as_the_last_training_step_left_it(data, tmp_path):
    """AdaCL with a memory queue: validating in training mode would re-estimate the margins and
    enqueue the dev embeddings; the loss's state after validation is the last step's."""
    overrides = ["train.epochs=2", "train.batch_size=8"]
    config = tiny_config(data, tmp_path / "run", overrides, name="adacl", queue_size=16)
    hook = KeepModels()
    trainer = Trainer(config, hooks=[hook], print_fn=None)
    trainer.fit()
    for record in epoch_records(tmp_path / "run"):
        assert record["dev_loss"] is not None and record["dev_loss"] > 0
    after = hook.loss_after_epoch[-1]
    assert set(after) == set(hook.loss_after_step)
    for key, value in hook.loss_after_step.items():
        if isinstance(value, torch.Tensor):
            assert torch.equal(after[key], value), key
        else:  # the extra state: margins' bookkeeping and the random rule's generator
            assert repr(after[key]) == repr(value), key
    assert bool(after["img_queue.valid"].any())  # the queue was in use
    assert trainer.loss_fn.training  # back in training mode


def test_embedding_dev_loss_scores_every_block_with_the_same_state():
    """A unit check of the contract: each block sees the margins and queue as they were (a
    copy in eval mode, block by block), and the module in training mode is given back."""
    torch.manual_seed(0)
    loss = build_loss("adacl", queue_size=6, embed_dim=8)
    for _ in range(3):  # fill the queue, move the margins
        x, y = torch.randn(4, 8), torch.randn(4, 8)
        loss(x, y, torch.arange(4), torch.arange(4))
    img, txt = torch.randn(3, 8), torch.randn(9, 8)
    t2i = torch.arange(3).repeat_interleave(3)
    before = copy.deepcopy(loss.state_dict())
    got = embedding_dev_loss(loss, img, txt, t2i, batch_size=4, drop_last=False)
    frozen = copy.deepcopy(loss).eval()
    order = naive_order(t2i.tolist())
    want, n = 0.0, 0
    for start in range(0, 8, 4):  # 4, 4 and a last block of one pair, dropped
        block = order[start : start + 4]
        ids = t2i[block]
        want += float(frozen(img[ids], txt[block], ids, ids)) * len(block)
        n += len(block)
    assert got == pytest.approx(want / n, rel=1e-12)
    assert loss.training
    for key, value in before.items():
        if isinstance(value, torch.Tensor):
            assert torch.equal(loss.state_dict()[key], value), key


def test_score_dev_loss_blocks_index_the_score_matrix():
    torch.manual_seed(1)
    sim = torch.rand(4, 8) * 2 - 1
    t2i = torch.arange(4).repeat_interleave(2)
    loss = build_loss("triplet", hardest=False)
    got = score_dev_loss(loss, sim, t2i, batch_size=3, drop_last=False)
    order = naive_order(t2i.tolist())
    want = 0.0
    for start in range(0, 8, 3):
        block = order[start : start + 3]
        rows = [int(t2i[j]) for j in block]
        sub = torch.tensor([[float(sim[r, c]) for c in block] for r in rows])
        want += naive_triplet(sub, rows, hardest=False) * len(block)
    assert got == pytest.approx(want / 8, rel=1e-12)


def test_runs_without_a_dev_loss_log_null_and_say_why_once(data, tmp_path, capsys):
    off = tiny_config(data, tmp_path / "off", ["train.epochs=1", "train.dev_loss=false"])
    Trainer(off).fit()
    (record,) = epoch_records(tmp_path / "off")
    assert record["dev_loss"] is None and "dev_rsum" in record
    out = capsys.readouterr().out
    assert "dev loss" not in out and "dev_loss not computed" not in out

    class OwnStep(LossStep):
        name = "mine"

    loss = build_loss("triplet")
    assert dev_loss_skipped(loss, LossStep()) is None
    why = dev_loss_skipped(loss, OwnStep())
    assert (
        why == "train.procedure 'mine' computes its own step's loss, which has no dev counterpart"
    )
    ident = build_loss("id", num_classes=3, dim=4)
    assert "training identities" in dev_loss_skipped(ident, LossStep())
    overrides = ["train.epochs=2"]
    trainer = Trainer(tiny_config(data, tmp_path / "own", overrides), loss_step=OwnStep())
    trainer.fit()
    assert [r["dev_loss"] for r in epoch_records(tmp_path / "own")] == [None, None]
    notes = [x for x in capsys.readouterr().out.splitlines() if "dev_loss not computed" in x]
    assert notes == [f"{trainer.config.source}: dev_loss not computed: {why}"]
