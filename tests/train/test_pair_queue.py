"""AdaCL's memory bank for pair scorers (vlret.train.procedures.pair_memory, and the "pair_bank"
procedure of vlret.train.procedures.pair_bank): the loss with the bank equals the loss of the
queued items concatenated to the batch by hand, FIFO order and wrap-around, exact resume, the
stated memory, the procedure resolved from the loss and the model and refused where it does not
fit, and bad sizes refused naming the key."""

from __future__ import annotations

import copy
import json
import signal
from pathlib import Path

import pytest
import torch

from train_helpers import assert_same_params, model_params, tiny_data, tiny_raw
from vlret.losses import build_loss
from vlret.models import build_model
from vlret.run.checkpoint import load_checkpoint
from vlret.run.config import ConfigError, apply_overrides, config_from_dict
from vlret.train import Trainer, TrainingInterrupted
from vlret.train.procedures.pair_bank import PairBankStep
from vlret.train.procedures.pair_memory import (
    PairMemoryBank,
    bank_loss,
    bank_scores,
    buffers_kept,
)
from vlret.train.run_check import check_run

#: Tiny scorers on 4 regions of 16 features.
MODELS = {
    "scan": {"kind": "scan", "aggregation": "lse"},
    "sgr": {"kind": "sgraf", "sim_dim": 8, "sgr_steps": 2, "num_regions": 4},
    "saf": {"kind": "sgraf", "module": "saf", "sim_dim": 8, "num_regions": 4},
}


@pytest.fixture(autouse=True)
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return tiny_data(tmp_path_factory.mktemp("data"))


def _encoded(gen: torch.Generator, n: int, regions: int, dim: int, lengths: list[int]):
    """Random l2-normalised regions and words (zero past each caption's length), float64."""
    r = torch.nn.functional.normalize(torch.randn(n, regions, dim, generator=gen), dim=-1)
    width = max(lengths)
    w = torch.nn.functional.normalize(torch.randn(n, width, dim, generator=gen), dim=-1)
    for i, length in enumerate(lengths):
        w[i, length:] = 0.0
    return r.double(), w.double(), torch.tensor(lengths)


def _pad(words: torch.Tensor, width: int) -> torch.Tensor:
    out = words.new_zeros(words.shape[0], width, words.shape[2])
    out[:, : words.shape[1]] = words
    return out


@pytest.mark.parametrize("name", ["scan", "sgr", "saf"])
def test_bank_loss_equals_the_queued_items_concatenated_to_the_batch_by_hand(name):
    """Float64. The bank (wrapped once, scored in blocks of 2-3 entries under activation
    checkpointing) against the naive route: the queued items appended to the batch, every pair
    of the (B + K) x (B + K) matrix scored in one call, its blocks cut out by hand and the
    masks written with loops. Loss, AdaCL's margins after the step and the gradients of the
    batch's encodings and of the scorer's weights agree. SGRAF in evaluation mode: in training
    mode its BatchNorms normalise over the images of each call, so one call over B + K images
    is not what the bank computes by design (module doc)."""
    torch.manual_seed(0)
    model = build_model(
        {**MODELS[name], "embed_dim": 8, "image": {"in_dim": 6}, "text": {"word_dim": 4}},
        vocab_size=20,
    ).double()
    if name != "scan":
        model.eval()
    gen = torch.Generator().manual_seed(1)
    bank = PairMemoryBank(5, 4, 8, 6, dtype=torch.float64)
    history = []  # every enqueued entry, oldest first
    for lengths, ids in (([3, 6, 2], [7, 8, 9]), ([4, 1, 5], [2, 10, 11])):
        r, w, n = _encoded(gen, 3, 4, 8, lengths)
        bank.enqueue(r, w, n, ids)
        history += [(r[i], w[i], n[i], ids[i]) for i in range(3)]
    kept = history[-5:]  # the FIFO keeps the newest 5
    regions, words, rows = _encoded(gen, 3, 4, 8, [5, 2, 4])
    ids = torch.tensor([2, 10, 3])  # images 2 and 10 have an entry in the bank
    regions.requires_grad_(True)
    words.requires_grad_(True)
    loss_fn = build_loss("adacl", m1_init=5.0, m2_init=0.1)
    naive_loss_fn = copy.deepcopy(loss_fn)

    sim = model.score(regions, words, rows)
    to_txt, to_img = bank_scores(model, regions, words, rows, bank, block_pairs=4)
    loss = bank_loss(loss_fn, sim, ids, to_txt, to_img, bank)
    grads = torch.autograd.grad(loss, [regions, words, *model.parameters()], allow_unused=True)

    width = 6
    all_regions = torch.cat([regions, torch.stack([e[0] for e in kept])])
    all_words = torch.cat([_pad(words, width), *(_pad(e[1][None], width) for e in kept)])
    all_rows = torch.cat([rows, torch.stack([e[2] for e in kept])])
    full = model.score(all_regions, all_words, all_rows)
    b = 3
    txt_mask = torch.zeros(b, 5, dtype=torch.bool)
    pos = torch.zeros(b, b, dtype=torch.bool)
    for i in range(b):
        for k, entry in enumerate(kept):
            txt_mask[i, k] = entry[3] != int(ids[i])
        for j in range(b):
            pos[i, j] = bool(ids[i] == ids[j])
    naive = naive_loss_fn.from_similarity(
        full[:b, :b],
        pos,
        extra_neg_txt=full[:b, b:],
        extra_neg_txt_mask=txt_mask,
        extra_neg_img=full[b:, :b],
        extra_neg_img_mask=txt_mask.t(),
    )
    naive_grads = torch.autograd.grad(
        naive, [regions, words, *model.parameters()], allow_unused=True
    )
    assert to_txt.shape == (3, 5) and to_img.shape == (5, 3)
    assert not bool(txt_mask.all())  # the bank holds entries of the batch's own images
    torch.testing.assert_close(loss, naive, rtol=1e-10, atol=1e-12)
    assert float(loss_fn.m1) == pytest.approx(float(naive_loss_fn.m1), rel=1e-10)
    assert float(loss_fn.m2) == pytest.approx(float(naive_loss_fn.m2), rel=1e-10)
    for got, want in zip(grads, naive_grads, strict=True):
        if want is None:
            assert got is None or not bool(got.any())
        else:
            assert got is not None
            torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-12)


def test_the_bank_leaves_sgraf_batchnorm_statistics_to_the_batch():
    """Training mode: scoring the bank (and backward through its recomputed blocks) leaves
    every running statistic as the batch's own call left it."""
    torch.manual_seed(0)
    model = build_model(
        {**MODELS["saf"], "embed_dim": 8, "image": {"in_dim": 6}, "text": {"word_dim": 4}},
        vocab_size=20,
    ).double()
    gen = torch.Generator().manual_seed(2)
    bank = PairMemoryBank(6, 4, 8, 5, dtype=torch.float64)
    bank.enqueue(*_encoded(gen, 6, 4, 8, [5, 2, 3, 1, 4, 2]), list(range(6)))
    regions, words, rows = _encoded(gen, 3, 4, 8, [3, 4, 2])
    regions.requires_grad_(True)
    sim = model.score(regions, words, rows)
    before = {k: v.clone() for k, v in model.named_buffers()}
    to_txt, to_img = bank_scores(model, regions, words, rows, bank, block_pairs=6)
    (sim.sum() + to_txt.sum() + to_img.sum()).backward()
    assert regions.grad is not None and bool(regions.grad.any())
    assert int(before["scorer.saf.bn.num_batches_tracked"]) == 3  # the batch's call moved them
    for key, value in model.named_buffers():
        assert torch.equal(value, before[key]), key
    with buffers_kept(model):
        model.scorer.saf.bn.running_mean.fill_(7.0)
    assert torch.equal(model.scorer.saf.bn.running_mean, before["scorer.saf.bn.running_mean"])


def test_fifo_order_and_wrap_around():
    """Slot ``g mod size`` holds the newest entry ``g`` of the whole history; the pointer is
    the count modulo the size; a batch longer than the bank keeps its last rows; words are
    zero past each length; the filled entries are views in slot order."""
    gen = torch.Generator().manual_seed(3)
    bank = PairMemoryBank(5, 2, 3, 4, dtype=torch.float64)
    history: list[tuple[torch.Tensor, torch.Tensor, int, int]] = []
    next_id = 0
    for n in (2, 2, 3, 7, 1):
        lengths = torch.randint(1, 5, (n,), generator=gen).tolist()
        r, w, rows = _encoded(gen, n, 2, 3, lengths)
        ids = list(range(next_id, next_id + n))
        next_id += n
        bank.enqueue(r, w, rows, ids)
        history += [(r[i], w[i], lengths[i], ids[i]) for i in range(n)]
        expected: dict[int, tuple] = {}
        for g, entry in enumerate(history):
            expected[g % 5] = entry  # later entries overwrite earlier ones
        assert int(bank.ptr) == len(history) % 5
        assert len(bank) == min(len(history), 5)
        for slot, (r_e, w_e, length, id_e) in expected.items():
            assert torch.equal(bank.regions[slot], r_e)
            assert torch.equal(bank.words[slot, : w_e.shape[0]], w_e)
            assert not bool(bank.words[slot, length:].any())
            assert (int(bank.lengths[slot]), int(bank.ids[slot])) == (length, id_e)
    regions, words, lengths, ids = bank.entries()
    assert regions.data_ptr() == bank.regions.data_ptr() and ids.shape == (5,)
    assert bank.negative_mask(torch.tensor([int(bank.ids[0])]))[0].tolist() == [
        False,
        True,
        True,
        True,
        True,
    ]
    bank.reset()
    assert len(bank) == 0 and int(bank.ptr) == 0 and int(bank.ids.max()) == -1


def test_bad_inputs_name_the_argument():
    for size in (0, -3, 2.5, True):
        with pytest.raises(ValueError, match="size must be a positive integer"):
            PairMemoryBank(size, 2, 3, 4)
    with pytest.raises(ValueError, match="words_max"):
        PairMemoryBank(4, 2, 3, 0)
    bank = PairMemoryBank(4, 2, 3, 4)
    r, w, _ = _encoded(torch.Generator().manual_seed(0), 2, 2, 3, [5, 1])
    with pytest.raises(ValueError, match=r"lengths must lie in 1..words_max=4, got 1..5"):
        bank.enqueue(r, w, torch.tensor([5, 1]))
    with pytest.raises(ValueError, match=r"regions must have shape \(n, 2, 3\)"):
        bank.enqueue(r[:, :1], w, torch.tensor([4, 1]))
    assert len(bank) == 0


def test_memory_stated_equals_the_tensors_nbytes():
    for dtype, per in ((torch.float32, 4), (torch.float16, 2), (torch.float64, 8)):
        bank = PairMemoryBank(7, 36, 16, 12, word_dim=16, dtype=dtype)
        assert bank.feature_bytes == 7 * (36 * 16 + 12 * 16) * per
        assert bank.feature_bytes == bank.regions.nbytes + bank.words.nbytes
        assert bank.nbytes == sum(b.nbytes for b in bank.state_dict().values())
        assert f"({bank.feature_bytes} bytes)" in bank.describe()
    # AdaCL Table 12 with SCAN on F30K: 4096 x (36 x 256 + W x 256) floats
    assert PairMemoryBank.bytes_for(4096, 36, 256, 60, 256, torch.float32) == 4096 * 96 * 256 * 4


def bank_config(data: Path, out: Path, model: str, overrides: list[str] = ()):
    raw = tiny_raw(data, out)
    raw["model"] = {**MODELS[model], "embed_dim": 16, "image": {"in_dim": 16}}
    raw["model"]["text"] = {"word_dim": 8}
    base = ["loss.name=adacl", "loss.queue_size=12", "train.momentum_encoder=0.99"]
    return config_from_dict(apply_overrides(raw, [*base, *overrides]))


@pytest.mark.parametrize(
    ("overrides", "key", "message"),
    [
        (["loss.queue_size=-1"], "loss.queue_size", "must be >= 0"),
        (["loss.queue_size=2.5"], "loss.queue_size", "expected an integer"),
        (["train.momentum_encoder=null"], "loss.queue_size", "set train.momentum_encoder"),
    ],
)
def test_bad_bank_settings_are_refused_naming_the_key(tmp_path, overrides, key, message):
    with pytest.raises(ConfigError) as err:
        Trainer(bank_config(tmp_path / "no_data_here", tmp_path / "out", "scan", overrides))
    assert err.value.key == key and message in str(err.value)


def test_the_procedure_is_resolved_from_the_loss_and_the_model_and_named(tmp_path, data):
    """ "standard" (the default) with a pair scorer whose loss holds a queue is the "pair_bank"
    procedure, as naming it is; a two-tower model keeps the loss's own embedding queue."""
    from vlret.train.procedures.registry import resolve_procedure

    lines: list[str] = []
    for procedure in ("standard", "pair_bank"):
        cfg = bank_config(data, tmp_path / procedure, "scan", [f"train.procedure={procedure}"])
        assert resolve_procedure(cfg, scores_pairs=True) == "pair_bank"
        trainer = Trainer(cfg, print_fn=lines.append)
        assert isinstance(trainer.loss_step, PairBankStep)
        assert trainer.loss_step.name == "pair_bank"
        assert len(trainer.loss_step.ready_bank()) == 0
    # the run's summary (vlret train --check prints it, and the run when it starts) names it
    summary = check_run(bank_config(data, tmp_path / "checked", "scan")).splitlines()
    assert summary[-2] == (
        "  procedure: pair_bank (train.procedure 'standard' resolved by what the loss and the "
        "model need)"
    )
    named = check_run(bank_config(data, tmp_path / "named", "scan", ["train.procedure=pair_bank"]))
    assert "  procedure: pair_bank" in named.splitlines()
    cfg = bank_config(data, tmp_path / "two_tower", "scan")
    assert resolve_procedure(cfg, scores_pairs=False) == "standard"
    raw = tiny_raw(data, tmp_path / "two_tower")
    raw["loss"] = {"name": "adacl", "queue_size": 12}
    raw["train"]["momentum_encoder"] = 0.9
    trainer = Trainer(config_from_dict(raw), print_fn=None)
    assert trainer.loss_step.name == "standard" and trainer.loss_fn.img_queue is not None


#: A queue that fills from a momentum encoder (AdaCL's), and a loss without one.
QUEUE = {"name": "adacl", "queue_size": 12}


@pytest.mark.parametrize(
    ("model", "loss", "procedure", "words"),
    [
        (None, QUEUE, "pair_bank", "this run has a two-tower model"),
        ("scan", {"name": "adacl", "queue_size": 0}, "pair_bank", "a loss without a queue"),
        ("scan", {"name": "triplet"}, "pair_bank", "a loss without a queue"),
        ("scan", QUEUE, "ncr", 'trains with the "pair_bank" procedure'),
    ],
)
def test_the_procedure_is_refused_where_it_does_not_fit(
    tmp_path, data, model, loss, procedure, words
):
    """One line naming train.procedure: the bank named for a two-tower model or a loss
    without a queue, another procedure for a pair scorer's bank."""
    raw = tiny_raw(data, tmp_path / "out")
    if model is not None:
        raw["model"] = {**MODELS[model], "embed_dim": 16, "image": {"in_dim": 16}}
        raw["model"]["text"] = {"word_dim": 8}
    raw["loss"] = dict(loss)
    raw["train"]["procedure"] = procedure
    if loss.get("queue_size"):
        raw["train"]["momentum_encoder"] = 0.9
    with pytest.raises(ConfigError) as err:
        Trainer(config_from_dict(raw), print_fn=None)
    assert err.value.key == "train.procedure" and words in str(err.value)
    assert "\n" not in str(err.value)


def test_ctrl_c_then_resume_equals_uninterrupted_with_the_bank(tmp_path, data, monkeypatch):
    """SCAN with AdaCL and a bank of 12 (the 40 training captions wrap it): the bank lives in
    the checkpoint's procedure state, a run interrupted mid-epoch and resumed ends with the
    uninterrupted run's weights, margins, momentum encoder and bank; the start prints the
    bank's bytes and every logged step its filled entries."""
    overrides = ["train.validate=false", "train.log_every=1"]
    lines: list[str] = []
    full = Trainer(bank_config(data, tmp_path / "full", "scan", overrides), print_fn=lines.append)
    bank = full.loss_step.bank
    assert full.loss_fn.img_queue is None and full.loss_fn.txt_queue is None
    assert (bank.size, bank.num_regions, bank.dim) == (12, 4, 16)
    assert any(f"({bank.feature_bytes} bytes)" in line for line in lines)
    full.fit()
    steps = [json.loads(x) for x in (tmp_path / "full" / "metrics.jsonl").read_text().splitlines()]
    entries = [r["bank_entries"] for r in steps if r["kind"] == "step"]
    assert entries[:3] == [0, 8, 12] and int(bank.ptr) == (15 * 8) % 12
    assert 0 <= int(bank.ids.min()) and int(bank.ids.max()) < 8  # the entries' image indices
    original = Trainer.train_step

    def step_then_ctrl_c(self, batch):
        out = original(self, batch)
        if self.step == 7:
            signal.raise_signal(signal.SIGINT)
        return out

    cfg = bank_config(data, tmp_path / "cut", "scan", overrides)
    monkeypatch.setattr(Trainer, "train_step", step_then_ctrl_c)
    with pytest.raises(TrainingInterrupted) as err:
        Trainer(cfg, print_fn=None).fit()
    monkeypatch.setattr(Trainer, "train_step", original)
    state = load_checkpoint(err.value.checkpoint)
    assert int(state["procedure"]["pair_bank"]["ptr"]) == (7 * 8) % 12
    resumed = Trainer(cfg, resume=err.value.checkpoint, print_fn=None)
    resumed.fit()
    assert_same_params(model_params(resumed.model), model_params(full.model))
    assert_same_params(resumed.loss_fn.state_dict(), full.loss_fn.state_dict())
    assert_same_params(resumed.momentum_encoder.state_dict(), full.momentum_encoder.state_dict())
    assert_same_params(resumed.loss_step.bank.state_dict(), bank.state_dict())


@pytest.mark.parametrize("name", ["adacl_sgraf_f30k", "adacl_scan_f30k_bank"])
def test_shipped_bank_configs_train_on_tiny_data(tmp_path, data, name):
    """AdaCL Table 1 (SGRAF) and Table 12 (SCAN): a bank of 4096 from a momentum encoder of
    0.99, batch 64; shrunk to the tiny data, one epoch trains with the bank (SGRAF's
    training-mode BatchNorms included)."""
    from vlret.configs import shipped_configs
    from vlret.run.config import load_config

    path = shipped_configs()[name]
    cfg = load_config(path)
    assert (cfg.loss.params["queue_size"], cfg.train.momentum_encoder) == (4096, 0.99)
    assert (cfg.train.batch_size, cfg.model["embed_dim"]) == (64, 256)
    raw = cfg.to_dict()
    raw["output_dir"] = str(tmp_path / "out")
    raw["data"]["root"] = str(data)
    raw["model"].update(embed_dim=16, image={"in_dim": 16}, text={"word_dim": 8})
    if raw["model"]["kind"] == "sgraf":
        raw["model"].update(num_regions=4, sim_dim=8)
    raw["loss"]["queue_size"] = 12
    raw["train"].update(epochs=1, batch_size=8, progress=False, validate=False)
    raw["data"]["min_count"] = 1
    trainer = Trainer(config_from_dict(raw), print_fn=None)
    assert trainer.fit().steps == 5
    assert len(trainer.loss_step.bank) == 12
