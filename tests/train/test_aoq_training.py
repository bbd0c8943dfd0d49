"""AOQ wired into training: the loader's per-item draws (the released rule, the same with any
number of workers), the step's offline inputs (two-tower and pair-scoring), a tiny end-to-end
run (first round, `vlret mine-negatives`, AOQ epochs, checkpoint and exact resume) and the
config refusals."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from train_helpers import assert_same_params, model_params, tiny_data, tiny_raw
from vlret.cli import main
from vlret.data.formats.precomp import PrecompDataset
from vlret.data.offline_negatives import (
    FINGERPRINT,
    OfflineNegatives,
    load_offline_negatives,
    split_fingerprint,
)
from vlret.losses import aoq_loss
from vlret.run.builders import build_encoder, build_train_dataset
from vlret.run.config import ConfigError, apply_overrides, config_from_dict
from vlret.run.mining import mine_embeddings
from vlret.train import Trainer

CPI = 5  # captions per image of the tiny precomp folder (8 train images, 40 captions)


def mined_file(tmp_path, *, k=4, seed=0, txt_to_img=None, data=None):
    """A mined .npz of the tiny train split from random embeddings (its own positives out);
    with ``data`` (the tiny precomp folder) it records that split's fingerprint, as `vlret
    mine-negatives` does, else it is a file written before fingerprints (accepted, warned)."""
    g = torch.Generator().manual_seed(seed)
    t2i = torch.arange(8).repeat_interleave(CPI) if txt_to_img is None else txt_to_img
    mined = mine_embeddings(
        torch.randn(8, 6, generator=g), torch.randn(40, 6, generator=g), t2i, k=k
    )
    header = {**mined.header, "checkpoint": "first.pt", "split": "train"}
    if data is not None:
        header[FINGERPRINT] = split_fingerprint(PrecompDataset(data, "train"))
    arrays = (mined.i2t, mined.t2i, mined.i2t_scores, mined.t2i_scores, mined.txt_to_img)
    return OfflineNegatives(*arrays, header).save(tmp_path / f"neg{seed}.npz")


def aoq_raw(data, out, negatives, **data_keys):
    raw = tiny_raw(data, out)
    raw["loss"] = {"name": "aoq"}
    raw["data"].update(offline_negatives=str(negatives), offline_candidates=4, **data_keys)
    return raw


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return tiny_data(tmp_path_factory.mktemp("aoq") / "data")


def released_draw(i2t, t2i, index, seed, epoch, candidates):
    """dataAOQ.py's rule (5 captions per image) with the per-item generator of docs/aoq.md."""
    rng = np.random.default_rng([seed % 2**64, epoch, index, 0x414F51])
    n = int(rng.integers(candidates))
    cap = int(i2t[index // 5][n])
    img = int(t2i[index][n // 5])
    cap2 = img * 5 + int(rng.integers(5))
    return cap, img, cap2, cap // 5


def test_loader_draws_are_the_released_rule_and_the_same_with_workers(tmp_path, data):
    negatives = mined_file(tmp_path, k=6, data=data)
    config = config_from_dict(aoq_raw(data, tmp_path / "run", negatives))
    encoder = build_encoder(config.data)
    ds = build_train_dataset(config.data, "train", encoder)
    mined = load_offline_negatives(negatives)
    ds.set_seed(-7)  # a negative train.seed is taken modulo 2**64
    feats = np.load(data / "train_ims.npy")
    caps = (data / "train_caps.txt").read_text().splitlines()
    draws = {}
    for epoch in (0, 3):
        ds.set_epoch(epoch)
        for index in range(40):
            item = ds[index]
            want = released_draw(mined.i2t, mined.t2i, index, -7, epoch, 4)
            assert tuple(item.draw) == want
            draws[epoch, index] = want
            cap, img, cap2, img2 = want
            assert (item.offline.img_index, item.offline.cap_index) == (img, cap)
            assert (item.quintuplet.img_index, item.quintuplet.cap_index) == (img2, cap2)
            assert torch.equal(item.offline.features, torch.from_numpy(feats[img]))
            assert torch.equal(item.quintuplet.features, torch.from_numpy(feats[img2]))
            assert item.offline.caption.tolist() == encoder.encode(caps[cap])
            assert item.quintuplet.caption.tolist() == encoder.encode(caps[cap2])
            assert item.item.cap_index == index and item.item.img_index == index // 5
    assert any(draws[0, i] != draws[3, i] for i in range(40))  # a new draw each epoch
    # the same batches, offline rows included, with 0 and 2 workers; epoch 3's draws
    order = [[int(i) for i in torch.randperm(40, generator=torch.Generator().manual_seed(1))]]
    order = [order[0][:16], order[0][16:]]

    def batches(workers):
        loader = DataLoader(ds, batch_sampler=order, collate_fn=ds.collate, num_workers=workers)
        return list(loader)

    for a, b in zip(batches(0), batches(2), strict=True):
        for x, y in ((a, b), (a.offline, b.offline)):
            for name in ("features", "captions", "lengths", "img_index", "cap_index"):
                assert torch.equal(getattr(x, name), getattr(y, name)), name
    batch = batches(0)[0]
    assert batch.offline.captions.shape[1] == batch.captions.shape[1]  # one width: one forward
    for row, index in enumerate(order[0]):
        cap, img, cap2, img2 = draws[3, index]
        assert batch.offline.img_index[2 * row] == img and batch.offline.cap_index[2 * row] == cap
        assert batch.offline.img_index[2 * row + 1] == img2
        assert batch.offline.cap_index[2 * row + 1] == cap2
    chunk = batch.chunks(5)[1]  # items 5..9 with their offline rows 10..19
    assert torch.equal(chunk.offline.cap_index, batch.offline.cap_index[10:20])
    moved = batch.to("cpu")
    assert moved.offline is not None and torch.equal(moved.offline.features, batch.offline.features)


def test_the_file_is_checked_against_the_training_pairs(tmp_path, data):
    # mined on the clean pairs, trained on noisy ones: refused, naming the file and a caption
    raw = aoq_raw(data, tmp_path / "run", mined_file(tmp_path), noise_ratio=0.5, noise_seed=1)
    config = config_from_dict(raw)
    with pytest.raises(ValueError, match=r"neg0.npz: mined with caption \d+ on image \d+; the "):
        build_train_dataset(config.data, "train", build_encoder(config.data))
    # K smaller than offline_candidates: named
    raw = aoq_raw(data, tmp_path / "run", mined_file(tmp_path, k=3))
    config = config_from_dict(raw)
    with pytest.raises(ValueError, match=r"data.offline_candidates: 4 is more than the 3 "):
        build_train_dataset(config.data, "train", build_encoder(config.data))


def test_a_noisy_pairing_draws_on_its_own_pairs(tmp_path, data):
    raw = aoq_raw(data, tmp_path / "run", "x.npz", noise_ratio=0.5, noise_seed=1)
    raw["data"].pop("offline_negatives")
    raw["loss"] = {"name": "triplet"}
    noisy = build_train_dataset(config_from_dict(raw).data, "train", None).txt_to_img
    raw = aoq_raw(data, tmp_path / "run", mined_file(tmp_path, txt_to_img=noisy, data=data))
    raw["data"].update(noise_ratio=0.5, noise_seed=1)
    config = config_from_dict(raw)
    ds = build_train_dataset(config.data, "train", build_encoder(config.data))
    ds.set_seed(0)
    empty = set(range(8)) - set(noisy.tolist())
    for index in range(40):
        d = ds.draw(index)
        assert d.caption_image == int(noisy[d.caption]) and d.image != int(noisy[index])
        if d.image not in empty:
            assert int(noisy[d.image_caption]) == d.image
        else:  # an image left without captions: the release's image * 5 + n2
            assert d.image_caption // 5 == d.image


def test_the_pair_step_scores_the_offline_pairs_as_the_model_does():
    from vlret.models import build_model
    from vlret.train.procedures.aoq import aligned_scores

    torch.manual_seed(0)
    model = build_model(
        {"kind": "bfan", "embed_dim": 8, "image": {"in_dim": 6}, "text": {"word_dim": 4}},
        vocab_size=20,
    ).double()
    regions = model.encode_images(torch.randn(7, 3, 6, dtype=torch.float64))
    lengths = torch.tensor([4, 2, 5, 1, 3, 5, 2])
    words = model.encode_texts(torch.randint(1, 20, (7, 5)), lengths)
    full = model.score(regions, words, lengths).diagonal()
    one = torch.stack(
        [
            model.score(regions[i : i + 1], words[i : i + 1], lengths[i : i + 1])[0, 0]
            for i in range(7)
        ]
    )
    torch.testing.assert_close(full, one, rtol=0, atol=1e-12)  # each pair alone
    for block in (1, 3, 16):
        torch.testing.assert_close(
            aligned_scores(model, regions, words, lengths, block), one, rtol=0, atol=1e-12
        )


# ------------------------------------------------------------------------- end to end


def _params_moved(before, after):
    return any(
        not torch.equal(before[k], after[k]) for k in before if before[k].is_floating_point()
    )


def test_first_round_mine_then_aoq_trains_checkpoints_and_resumes_exactly(tmp_path, data):
    import yaml

    first = tmp_path / "first"
    cfg = tmp_path / "first.yaml"
    raw = tiny_raw(data, first)
    raw["train"].update(epochs=1, validate=False)
    cfg.write_text(yaml.safe_dump(raw))
    assert main(["train", str(cfg)]) == 0
    negatives = tmp_path / "neg.npz"
    args = ["mine-negatives", str(first / "last.pt"), "--data", str(data), "--out", str(negatives)]
    assert main([*args, "--k", "4", "--no-progress"]) == 0

    def config(out, *overrides):
        raw = aoq_raw(data, out, negatives)
        raw["train"].update(epochs=2, validate=False, log_every=1)
        return config_from_dict(apply_overrides(raw, list(overrides)))

    from vlret.train.procedures.aoq import AOQStep

    whole = Trainer(config(tmp_path / "whole"))
    assert isinstance(whole.loss_step, AOQStep)  # the aoq loss picks the aoq procedure
    seen = []

    class Record:
        def after_step(self, trainer, step):
            seen.append((step.loss, dict(step.context["stats"]())))

    from vlret.train.hooks.core import TrainHook

    class Recorder(Record, TrainHook):
        pass

    before = model_params(whole.model)
    whole.hooks.hooks.append(Recorder())
    whole.fit()
    assert whole.step == 10 and all(np.isfinite(loss) for loss, _ in seen)
    assert set(seen[0][1]) == {"aoq_weight_txt", "aoq_weight_img", "aoq_weight_negative"}
    # and metrics.jsonl's step records carry them, as the step computed them
    logged = [json.loads(line) for line in (tmp_path / "whole" / "metrics.jsonl").open()]
    steps = [r for r in logged if r["kind"] == "step"]
    assert steps and all(
        r["aoq_weight_txt"] == seen[r["step"] - 1][1]["aoq_weight_txt"] for r in steps
    )
    assert _params_moved(before, model_params(whole.model))
    state = torch.load(tmp_path / "whole" / "last.pt", weights_only=False)
    assert state["procedure"] == {} and state["config"]["data"]["offline_negatives"] == str(
        negatives
    )

    # killed mid-epoch 1 after a checkpoint at step 6, then resumed: the same weights
    class Kill(TrainHook):
        def after_step(self, trainer, step):
            if trainer.step == 7:
                raise KeyboardInterrupt

    cut = Trainer(config(tmp_path / "cut", "train.checkpoint_every=3"), hooks=[Kill()])
    with pytest.raises(KeyboardInterrupt):
        cut.fit()
    cut.close()
    resumed = Trainer(
        config(tmp_path / "cut", "train.checkpoint_every=3"), resume=tmp_path / "cut" / "last.pt"
    )
    assert (resumed.epoch, resumed.batch_in_epoch) == (1, 1)
    resumed.fit()
    assert_same_params(model_params(resumed.model), model_params(whole.model))


def test_bfan_trains_one_aoq_epoch_with_its_pair_scores(tmp_path, data):
    raw = aoq_raw(data, tmp_path / "run", mined_file(tmp_path, data=data))
    raw["model"] = {
        "kind": "bfan",
        "embed_dim": 8,
        "image": {"in_dim": 16},
        "text": {"word_dim": 4},
    }
    raw["train"].update(epochs=1, validate=False, max_steps_per_epoch=2)
    raw["train"]["procedure_options"] = {"pair_block": 3}
    trainer = Trainer(config_from_dict(raw))
    trainer.train_set.set_seed(0)
    batch = next(
        iter(
            DataLoader(
                trainer.train_set,
                batch_sampler=[list(range(8))],
                collate_fn=trainer.train_set.collate,
            )
        )
    )
    _, loss, ctx = trainer.compute_loss(batch)
    # the oracle: every score from full score matrices of separately encoded items, float64
    model = trainer.model

    def enc(b):
        return model.encode_images(b.features), model.encode_texts(b.captions, b.lengths), b.lengths

    (r, w, lw), (ro, wo, lo) = enc(batch), enc(batch.offline)
    score = model.score
    want = aoq_loss(
        score(r, w, lw).double(),
        offline_txt_sim=score(r, wo[0::2], lo[0::2]).diagonal().double(),
        offline_img_sim=score(ro[0::2], w, lw).diagonal().double(),
        offline_pair_sim=score(ro[0::2], wo[0::2], lo[0::2]).diagonal().double(),
        quintuplet_sim=score(ro[1::2], wo[1::2], lo[1::2]).diagonal().double(),
        pos_mask=batch.img_index[:, None] == batch.img_index[None, :],
    )
    # float32 scores of unit vectors, summed over 8 items and 6 terms: within 1e-4
    torch.testing.assert_close(loss.double(), want, rtol=0, atol=1e-4)
    assert "aoq_weight_txt" in ctx["stats"]()
    before = model_params(trainer.model)
    trainer.fit()
    assert trainer.step == 2 and _params_moved(before, model_params(trainer.model))


# ------------------------------------------------------------------------- refusals


@pytest.mark.parametrize(
    "change, key, words",
    [
        ({"loss": {"name": "triplet"}}, "data.offline_negatives", 'only read by loss.name = "aoq"'),
        (
            {"data": {"offline_negatives": None}},
            "data.offline_negatives",
            'required by loss.name = "aoq"',
        ),
        ({"data": {"offline_candidates": 0}}, "data.offline_candidates", "positive number"),
        ({"train": {"procedure": "ncr"}}, "train.procedure", 'trains with the "aoq" procedure'),
        ({"train": {"grad_cache_chunk": 2}}, "train.grad_cache_chunk", "one pass"),
        ({"model": {"kind": "sgraf"}}, "model.kind", "BatchNorms"),
        ({"data": {"format": "msrvtt"}}, "data.offline_negatives", "not 'msrvtt'"),
    ],
)
def test_config_refusals_name_the_keys(tmp_path, data, change, key, words):
    raw = aoq_raw(data, tmp_path / "run", tmp_path / "neg.npz")
    for section, values in change.items():
        if section == "loss":
            raw["loss"] = values
        elif section == "model":
            raw["model"] = {**values, "embed_dim": 8}
        else:
            raw[section].update(values)
            if values.get("offline_negatives", 1) is None:
                raw[section].pop("offline_negatives")
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")) as err:
        config_from_dict(raw)
    assert words in str(err.value) and "\n" not in str(err.value)


def test_the_aoq_procedure_needs_the_aoq_loss_and_known_options(tmp_path, data):
    from vlret.train.procedures.registry import build_procedure

    raw = tiny_raw(data, tmp_path / "run")
    raw["train"]["procedure"] = "aoq"
    with pytest.raises(ConfigError, match=r"train\.procedure.*trains loss.name = \"aoq\" only"):
        config_from_dict(raw)
    raw = aoq_raw(data, tmp_path / "run", tmp_path / "neg.npz")
    raw["train"]["procedure_options"] = {"pair_blok": 2}
    with pytest.raises(ValueError, match=r"train.procedure_options.pair_blok: not an option"):
        build_procedure(config_from_dict(raw))
    raw["train"]["procedure_options"] = {"pair_block": 0}
    with pytest.raises(ValueError, match=r"train.procedure_options.pair_block: expected a pos"):
        build_procedure(config_from_dict(raw))
