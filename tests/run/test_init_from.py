"""``train.init_from``: a run starts from another run's model weights (vlret.run.init_weights),
and ``{seed}`` in a compare variant's overrides names a first-round run per seed."""

from __future__ import annotations

import json

import pytest
import torch

from train_helpers import assert_same_params, model_params, tiny_config, tiny_data
from vlret.run.init_weights import InitFromError
from vlret.train import Trainer


@pytest.fixture()
def first_round(tmp_path):
    data = tiny_data(tmp_path / "data")
    trainer = Trainer(tiny_config(data, tmp_path / "first", ["train.epochs=1"]), print_fn=None)
    trainer.fit()
    return data, tmp_path / "first" / "last.pt"


def _saved_model(path):
    return torch.load(path, weights_only=False)["model"]


def test_the_run_starts_from_the_checkpoints_weights_with_a_fresh_optimiser(tmp_path, first_round):
    data, ckpt = first_round
    fresh = Trainer(tiny_config(data, tmp_path / "fresh"), print_fn=None)
    second = Trainer(
        tiny_config(data, tmp_path / "second", [f"train.init_from={ckpt}"]), print_fn=None
    )
    saved = _saved_model(ckpt)
    assert_same_params(model_params(second.model), {k: v for k, v in saved.items()})
    # not the model's own initialisation (which the same seed would give without init_from)
    own = fresh.model.state_dict()
    assert any(not torch.equal(own[k], v) for k, v in second.model.state_dict().items())
    assert second.step == 0 and second.epoch == 0 and not second.optimizer.state
    fresh.release_lock()
    second.fit()
    records = [
        json.loads(x) for x in (tmp_path / "second" / "metrics.jsonl").read_text().split("\n") if x
    ]
    start = [r for r in records if r["kind"] == "init_from"]
    assert len(start) == 1 and start[0]["path"] == str(ckpt) and start[0]["epoch"] == 1


def test_a_resumed_run_keeps_its_own_weights_and_does_not_read_init_from_again(
    tmp_path, first_round
):
    data, ckpt = first_round
    copy = tmp_path / "copy.pt"
    copy.write_bytes(ckpt.read_bytes())
    config = tiny_config(data, tmp_path / "second", [f"train.init_from={copy}", "train.epochs=1"])
    Trainer(config, print_fn=None).fit()
    copy.unlink()  # a resumed run never reads it again
    resumed = Trainer(config, resume=tmp_path / "second" / "last.pt", print_fn=None)
    assert_same_params(model_params(resumed.model), _saved_model(tmp_path / "second" / "last.pt"))
    resumed.release_lock()


def test_another_vocabulary_is_refused_naming_the_first_word_that_differs(tmp_path, first_round):
    data, ckpt = first_round
    state = torch.load(ckpt, weights_only=False)
    words = state["encoder"]["idx2word"]
    words[4], words[5] = words[5], words[4]
    other = tmp_path / "other.pt"
    torch.save(state, other)
    config = tiny_config(data, tmp_path / "second", [f"train.init_from={other}"])
    with pytest.raises(
        InitFromError,
        match=r"train\.init_from: .*other\.pt: its vocabulary "
        r"differs at index 4",
    ):
        Trainer(config, print_fn=None)


def test_another_model_is_refused_naming_the_weight(tmp_path, first_round):
    data, ckpt = first_round
    config = tiny_config(data, tmp_path / "wide", [f"train.init_from={ckpt}", "model.embed_dim=24"])
    with pytest.raises(InitFromError, match=r"weight '.*' has shape \(16, .*\) there, \(24, "):
        Trainer(config, print_fn=None)
    state = torch.load(ckpt, weights_only=False)
    state["model"]["extra.weight"] = torch.zeros(2)
    extra = tmp_path / "extra.pt"
    torch.save(state, extra)
    config = tiny_config(data, tmp_path / "x", [f"train.init_from={extra}"])
    with pytest.raises(
        InitFromError, match=r"1 weights this model lacks \(first 'extra\.weight'\)"
    ):
        Trainer(config, print_fn=None)


def test_a_missing_checkpoint_names_the_file(tmp_path):
    data = tiny_data(tmp_path / "data")
    config = tiny_config(data, tmp_path / "run", [f"train.init_from={tmp_path / 'nope.pt'}"])
    with pytest.raises(FileNotFoundError, match=r"nope\.pt: missing"):
        Trainer(config, print_fn=None)


def test_seed_in_a_compare_variants_overrides_is_the_runs_seed(tmp_path):
    from train_helpers import tiny_raw
    from vlret.analysis.compare.spec import Variant, run_config

    raw = tiny_raw(tmp_path / "data", tmp_path / "out")
    variant = Variant("ssp", "triplet", {}, ("train.init_from=first/seed{seed}/last.pt",))
    assert run_config(raw, variant, 7, tmp_path / "r").train.init_from == "first/seed7/last.pt"


def test_out_in_a_compare_variants_overrides_is_the_comparisons_folder(tmp_path):
    from train_helpers import tiny_raw
    from vlret.analysis.compare.spec import CompareError, Variant, plan_runs, run_config

    raw = tiny_raw(tmp_path / "data", tmp_path / "out")
    variant = Variant(
        "ssp", "triplet", {}, ("train.init_from={out}/runs/warmup/seed{seed}/last.pt",)
    )
    specs = plan_runs(raw, [variant], 2, tmp_path / "cmp")
    assert [s.config.train.init_from for s in specs] == [
        f"{tmp_path / 'cmp'}/runs/warmup/seed{k}/last.pt" for k in (0, 1)
    ]
    with pytest.raises(CompareError, match=r"\[compare\.losses\.ssp\] set: \{out\} needs"):
        run_config(raw, variant, 0, tmp_path / "r")
