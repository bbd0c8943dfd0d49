"""CE and MMT through the harness (issue 16): ``vlret train`` on multi-expert MSR-VTT features
with any loss on the score matrix, ``vlret eval`` under both MSR-VTT protocols equal to a score
matrix built pair by pair, exact resume, ``vlret convert-experts``, and two gloo ranks equal to
one process on the concatenated batch."""

from __future__ import annotations

import json
import os
import pickle
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from test_train_distributed import free_port

from train_helpers import (
    assert_same_params,
    assert_steps_equal,
    model_params,
    rank_env,
    steps_state,
    tiny_raw,
)
from vlret.cli import main
from vlret.data import MSRVTTDataset
from vlret.data.formats.experts.features import ExpertFeatures, write_expert_features
from vlret.data.writers import make_tiny_msrvtt
from vlret.metrics import retrieval_metrics_from_similarity
from vlret.run.builders import load_trained_model
from vlret.run.config import apply_overrides, config_from_dict
from vlret.train import Trainer

EXPERTS = {"rgb": 12, "audio": 6, "scene": 10}
SIZES = {"train": 8, "validate": 3, "test": 4}
CAPTIONS = 3


@pytest.fixture(autouse=True)
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def write_experts(root: Path, seed: int = 0) -> Path:
    """MSR-VTT annotations plus three experts: ``rgb`` pooled (every video), ``audio`` temporal
    with 1-4 frames (every other video), ``scene`` pooled (all but the first video)."""
    ids = make_tiny_msrvtt(
        root, sizes=SIZES, captions_per_video=CAPTIONS, n_test_1ka=3, feature_shape=(4,)
    )
    videos = [v for split in ("train", "validate", "test") for v in ids[split]]
    rng = np.random.default_rng(seed)
    rgb = [rng.standard_normal(EXPERTS["rgb"]).astype(np.float32) for _ in videos]
    audio = [
        rng.standard_normal((1 + k % 4, EXPERTS["audio"])).astype(np.float32) if k % 2 else None
        for k in range(len(videos))
    ]
    scene = [None] + [rng.standard_normal(EXPERTS["scene"]).astype(np.float32) for _ in videos[1:]]
    (root / "experts").mkdir()
    return write_expert_features(
        root / "experts", videos, {"rgb": rgb, "audio": audio, "scene": scene}
    )


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("msrvtt_experts")
    write_experts(root)
    return root


@pytest.fixture(scope="module")
def bert_dir(tmp_path_factory, data):
    pytest.importorskip("transformers")
    from vlret.data.formats.msrvtt import DATA_JSON, read_msrvtt_json
    from vlret.worlds.bert import write_random_bert

    captions = read_msrvtt_json(data / DATA_JSON).captions.values()
    out = tmp_path_factory.mktemp("bert") / "random-bert"
    return write_random_bert(out, (c for cs in captions for c in cs), hidden=16, heads=2)


MODELS = {
    "ce": {"kind": "ce", "embed_dim": 16, "vlad_clusters": {"audio": 2}, "text": {"word_dim": 8}},
    "mmt": {"kind": "mmt", "embed_dim": 16, "num_layers": 1, "num_heads": 2, "ff_dim": 16},
}


def expert_raw(data: Path, out: Path, kind: str, bert: Path | None = None) -> dict:
    raw = tiny_raw(data, out)
    raw["data"].update(
        format="msrvtt", captions_per_video=CAPTIONS, features_dir=str(data / "experts")
    )
    raw["model"] = {**MODELS[kind], "experts": dict(EXPERTS)}
    if kind == "mmt":
        raw["model"]["text"] = {"kind": "bert", "path": str(bert)}
    raw["train"].update(batch_size=6, epochs=2)
    return raw


def expert_config(data, out, kind, overrides=(), bert=None):
    return config_from_dict(apply_overrides(expert_raw(data, out, kind, bert), list(overrides)))


@pytest.mark.parametrize(
    "loss",
    [[], ["loss.name=unified", "loss.gamma=50"], ["loss.name=infonce"], ["loss.name=vsl"]],
    ids=["triplet", "unified", "infonce", "vsl"],
)
def test_ce_trains_with_any_loss_on_its_score_matrix(tmp_path, data, loss):
    trainer = Trainer(expert_config(data, tmp_path / "run", "ce", loss))
    assert trainer.scores_pairs and trainer.train_set.features.names == ("rgb", "audio", "scene")
    before = model_params(trainer.model)
    result = trainer.fit()
    assert result.epochs_done == 2
    records = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in records if "loss" in r and "step" in r]
    assert steps and all(np.isfinite(r["loss"]) for r in steps)
    assert any(not torch.equal(before[k], v) for k, v in model_params(trainer.model).items())
    assert any("dev" in json.dumps(r) for r in records)  # validation ran on the dev videos


def pair_by_pair(model, dataset) -> torch.Tensor:
    """The test score matrix from ``model.forward``'s pieces, one video x one caption at a time
    (each video collated alone, each caption encoded alone)."""
    model.eval()
    with torch.no_grad():
        videos = [
            model.encode_images(dataset.images().collate([dataset.images()[i]])[0])
            for i in range(dataset.num_images)
        ]
        texts = []
        for j in range(dataset.num_captions):
            ids, lengths, _ = dataset.texts().collate([dataset.texts()[j]])
            texts.append(model.encode_texts(ids, lengths))
        sim = torch.empty(len(videos), len(texts), dtype=torch.float64)
        for i, v in enumerate(videos):
            for j, t in enumerate(texts):
                sim[i, j] = model.score(v, t, model.token_lengths(torch.ones(1, dtype=torch.long)))
    return sim


@pytest.mark.parametrize(("protocol", "split"), [("msrvtt-full", "test"), ("msrvtt-1ka", "test")])
def test_eval_equals_the_pair_by_pair_matrix(tmp_path, data, protocol, split):
    out = tmp_path / "run"
    config = expert_config(data, out, "ce", ["train.epochs=1"])
    Trainer(config).fit()
    ckpt = out / "last.pt"
    args = ["eval", str(ckpt), "--data", str(data), "--split", split, "--protocol", protocol]
    assert main([*args, "--json", str(tmp_path / "m.json"), "--no-progress"]) == 0
    got = json.loads((tmp_path / "m.json").read_text())["metrics"]
    model, _, encoder = load_trained_model(ckpt, device="cpu")
    proto = "full" if protocol == "msrvtt-full" else "1k-A"
    test = MSRVTTDataset(
        data,
        "test",
        protocol=proto,
        encoder=encoder,
        captions_per_video=CAPTIONS,
        features_dir=data / "experts",
        experts=list(EXPERTS),
    )
    sim = pair_by_pair(model, test)
    want = retrieval_metrics_from_similarity(sim.float(), test.txt_to_img).as_dict()
    assert got == pytest.approx(want, abs=1e-9)


def test_an_expert_the_features_lack_is_refused_before_training(tmp_path, data):
    raw = expert_raw(data, tmp_path / "run", "ce")
    raw["model"]["experts"] = {**EXPERTS, "ocr": 4}
    raw["data"]["experts"] = "all"
    with pytest.raises(ValueError, match="ocr"):
        Trainer(config_from_dict(raw))


def test_a_wrong_expert_size_is_refused_naming_the_expert(tmp_path, data):
    raw = expert_raw(data, tmp_path / "run", "ce")
    raw["model"]["experts"] = {**EXPERTS, "audio": 7}
    with pytest.raises(ValueError, match="audio"):
        Trainer(config_from_dict(raw))


def test_mmt_trains_with_a_local_bert(tmp_path, data, bert_dir):
    config = expert_config(data, tmp_path / "run", "mmt", ["train.epochs=1"], bert=bert_dir)
    trainer = Trainer(config)
    assert type(trainer.encoder).__name__ != "Vocabulary"  # BERT's own tokenizer
    assert trainer.fit().epochs_done == 1
    model, _, _ = load_trained_model(tmp_path / "run" / "last.pt", device="cpu")
    assert type(model).__name__ == "MultiModalTransformer"


def test_resume_after_an_epoch_equals_the_uninterrupted_run(tmp_path, data):
    full = Trainer(expert_config(data, tmp_path / "full", "ce", ["loss.name=unified"]))
    full.fit()
    part = expert_config(data, tmp_path / "part", "ce", ["loss.name=unified", "train.epochs=1"])
    Trainer(part).fit()
    config = expert_config(data, tmp_path / "part", "ce", ["loss.name=unified"])
    resumed = Trainer(config, resume=tmp_path / "part" / "last.pt")
    resumed.fit()
    assert_same_params(model_params(resumed.model), model_params(full.model))


# -- vlret convert-experts ---------------------------------------------------------------------


def test_convert_experts_cli_reads_released_pickles_and_refuses_other_objects(tmp_path, capsys):
    src = tmp_path / "released"
    src.mkdir()
    rng = np.random.default_rng(0)
    rgb = {f"video{k}": rng.standard_normal(5).astype(np.float32) for k in range(3)}
    audio = {"video0": rng.standard_normal((2, 3)), "video2": np.full((2, 3), np.nan)}
    for name, table in (("rgb", rgb), ("audio", audio)):
        with open(src / f"{name}.pickle", "wb") as f:
            pickle.dump(table, f)
    out = tmp_path / "experts"
    assert main(["convert-experts", str(src), "--out", str(out), "--max-frames", "audio=1"]) == 0
    feats = ExpertFeatures(out)
    assert sorted(feats.names) == ["audio", "rgb"]
    row = feats.rows_for(["video2"])[0]
    sample = feats.sample(row)
    assert sample.present.tolist() == [name == "rgb" for name in feats.names]
    np.testing.assert_array_equal(sample.features["rgb"].numpy(), rgb["video2"])
    assert sample.features["audio"].shape == (1, 3)  # truncated to --max-frames
    with open(src / "evil.pickle", "wb") as f:
        pickle.dump({"video0": os.system}, f)
    capsys.readouterr()
    assert main(["convert-experts", str(src), "--out", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("vlret convert-experts: ") and "evil.pickle" in err and "system" in err
    assert not (tmp_path / "x" / "experts.json").exists()
    assert main(["convert-experts", str(src), "--out", str(out), "--experts", "rgb"]) == 2
    assert "experts.json" in capsys.readouterr().err  # the existing layout is not replaced
    with pytest.raises(SystemExit) as bad:  # argparse names the flag
        main(["convert-experts", str(src), "--out", str(out), "--max-frames", "audio=0"])
    assert bad.value.code == 2 and "--max-frames" in capsys.readouterr().err


# -- two gloo ranks against one process ------------------------------------------------------

DDP_COMMON = [
    "optim.name=sgd",
    "optim.lr=0.1",
    "optim.warmup_steps=0",
    "optim.grad_clip=0",
    "train.validate=false",
    "train.batch_size=8",
]
DDP_SETTINGS = {"ce_unified": ["loss.name=unified", "loss.gamma=50"], "ce_triplet": []}
DDP_STEPS = 2


def ddp_steps(data: Path, out: Path, name: str) -> dict[str, torch.Tensor]:
    trainer = Trainer(expert_config(data, out / name, "ce", DDP_COMMON + DDP_SETTINGS[name]))
    return steps_state(trainer, DDP_STEPS, every_grad=False)


def ddp_worker(rank: int, world: int, port: int, data: str, out: str) -> None:
    rank_env(rank, world, port)
    try:
        for name in DDP_SETTINGS:
            torch.save(ddp_steps(Path(data), Path(out), name), Path(out) / f"{name}.rank{rank}.pt")
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


@pytest.fixture(scope="module")
def ddp_run(tmp_path_factory, data):
    out = tmp_path_factory.mktemp("ddp_experts")
    args = (2, free_port(), str(data), str(out))
    mp.start_processes(ddp_worker, args=args, nprocs=2, start_method="fork")
    return out


@pytest.mark.parametrize("name", list(DDP_SETTINGS))
def test_two_ranks_equal_one_process_on_the_concatenated_batch(ddp_run, data, tmp_path, name):
    """Each rank scores its 4 videos (their ExpertBatch) against the 8 gathered captions; after
    2 SGD steps the weights, gradients and loss equal one process on the 8-video batch.

    Tolerance: float64 both sides, differing in summation order only; the Unified loss
    magnifies a score's rounding by gamma = 50 (as tests/test_train_cross.py's ddp_tolerance).
    """
    ranks = [torch.load(ddp_run / f"{name}.rank{r}.pt", weights_only=True) for r in range(2)]
    assert [int(s["local_batch"]) for s in ranks] == [4, 4]
    torch.set_default_dtype(torch.float64)
    try:
        single = ddp_steps(data, tmp_path, name)
    finally:
        torch.set_default_dtype(torch.float32)
    assert int(single["local_batch"]) == 8
    tol = DDP_STEPS * 16 * (64 + 50) * torch.finfo(torch.float64).eps
    for state in ranks:
        assert_steps_equal(state, single, tol)
