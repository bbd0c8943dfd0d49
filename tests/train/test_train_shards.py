"""The trainer on webdataset shards (tests/test_data_shards.py tests the reading side): a run
interrupted mid-epoch and resumed trains on exactly the uninterrupted run's samples and ends
bit-identical (one process with 0 or 2 workers, and two gloo ranks); two gloo ranks read
disjoint shards whose union is the epoch and, where the global order is fixed, equal one
process on the union; a resume that changes the readers
(``data.num_workers``, the world size) or the stream is refused.

The model is the shipped ``synth_clip_pretrain`` CLIP (preset ViT-B-32, byte tokenizer),
shrunk by ``model.config`` to 16 px images and one layer of width 16."""

from __future__ import annotations

import io
import json
import signal
import socket
import tarfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import torch.multiprocessing as mp

pytest.importorskip("webdataset")
pytest.importorskip("transformers")
Image = pytest.importorskip("PIL.Image")

from train_helpers import assert_same_params, model_params, rank_env  # noqa: E402
from vlret.cli import main  # noqa: E402
from vlret.run.checkpoint import load_checkpoint  # noqa: E402
from vlret.run.config import apply_overrides, config_from_dict  # noqa: E402
from vlret.run.folder import RunFolderError, check_stream_resume  # noqa: E402
from vlret.train import Trainer, TrainingInterrupted  # noqa: E402
from vlret.train.hooks.core import TrainHook  # noqa: E402

TOWER = {"hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 1}
TOWER["num_attention_heads"] = 2


def _add(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    tar.addfile(info, io.BytesIO(data))


def write_shard(path: Path, shard_id: int, n: int, bad: int | None = None) -> list[str]:
    """An img2dataset shard of ``n`` samples (KEY.jpg, KEY.txt, KEY.json) and, with ``bad``,
    a sample of index ``bad`` whose JPEG is corrupt; returns the good keys."""
    keys = []
    with tarfile.open(path, "w") as tar:
        for i in range(n):
            key = f"{shard_id * 10_000 + i:09d}"
            rng = np.random.default_rng(shard_id * 100 + i)
            buf = io.BytesIO()
            Image.fromarray(rng.integers(0, 256, (12, 10, 3), dtype=np.uint8)).save(buf, "JPEG")
            _add(tar, f"{key}.jpg", buf.getvalue() if i != bad else b"\xff\xd8 not a jpeg")
            _add(tar, f"{key}.txt", f"a photo number {shard_id} {i}".encode())
            _add(tar, f"{key}.json", json.dumps({"key": key, "status": "success"}).encode())
            if i != bad:
                keys.append(key)
    return keys


def repack(path: Path, sources: list[Path], order: list[str]) -> None:
    """One shard holding the samples ``order`` (keys) of ``sources``, in that order."""
    members: dict[str, list[tuple[str, bytes]]] = {}
    for source in sources:
        with tarfile.open(source) as tar:
            for m in tar.getmembers():
                data = tar.extractfile(m).read()  # type: ignore[union-attr]
                members.setdefault(m.name.split(".")[0], []).append((m.name, data))
    with tarfile.open(path, "w") as tar:
        for key in order:
            for name, data in members[key]:
                _add(tar, name, data)


def shard_config(root: Path, out: Path, overrides: list[str] = ()) -> Any:  # type: ignore[assignment]
    """The run config over the shards in ``root``, named by their paths from the current folder
    (as every path key: vlret.data.paths), not from data.root."""
    raw = {
        "output_dir": str(out),
        "data": {
            "max_bad_fraction": 0.5,
            "root": str(root),
            "format": "webdataset",
            "shards": str(root / "{00000..00003}.tar"),
            "train_num_samples": 16,
            "shuffle_buffer": 5,
            "train_transform": "random_resized_crop",
            "crop_scale": [0.5, 1.0],
            "num_workers": 0,
        },
        "model": {
            "kind": "clip",
            "preset": "ViT-B-32",
            "tokenizer": "bytes",
            "config": {
                "projection_dim": 8,
                "vision_config": {**TOWER, "image_size": 16, "patch_size": 8},
                "text_config": {**TOWER, "max_position_embeddings": 40},
            },
        },
        "loss": {"name": "infonce", "temperature": 0.07, "learnable_temperature": True},
        "optim": {"name": "adamw", "lr": 1e-3, "schedule": "cosine", "warmup_steps": 2},
        "train": {"epochs": 2, "batch_size": 4, "seed": 3, "progress": False, "log_every": 1},
    }
    return config_from_dict(apply_overrides(raw, list(overrides)))


class Record(TrainHook):
    """The samples of every step (shard keys and sample ids), and optionally Ctrl-C after step
    ``stop_after``."""

    def __init__(self, stop_after: int | None = None) -> None:
        self.steps: list[tuple[int, int, list[str], list[int]]] = []
        self.stop_after = stop_after

    def before_step(self, trainer, batch) -> None:
        ids = [int(i) for i in batch.img_index]
        self.steps.append((trainer.epoch, trainer.step, list(batch.keys), ids))

    def after_step(self, trainer, step) -> None:
        if trainer.step == self.stop_after:
            signal.raise_signal(signal.SIGINT)


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    root = tmp_path_factory.mktemp("shards")
    # 6 good samples and first a corrupt JPEG (skipped and counted) in each shard
    keys = [write_shard(root / f"{s:05d}.tar", s, 7, bad=0) for s in range(4)]
    return root, keys


#: (workers, data.train_num_samples, the batch of epoch 1 the run is cut before): 4 and 9 steps
#: per epoch; with 36 samples each worker reads its 12 good samples twice (a second pass,
#: reshuffled), and the cut falls in both workers' second pass.
RESUMES = [(0, 16, 2), (2, 16, 2), (2, 36, 7)]


@pytest.mark.parametrize(("workers", "samples", "cut"), RESUMES)
def test_interrupted_mid_epoch_then_resumed_sees_the_same_samples_and_ends_identical(
    shards, tmp_path, workers, samples, cut
):
    root, keys = shards
    overrides = [f"data.num_workers={workers}", f"data.train_num_samples={samples}"]
    full_log = Record()
    full = Trainer(shard_config(root, tmp_path / "full", overrides), hooks=[full_log])
    full.fit()
    steps = samples // 4  # per epoch, 2 epochs; 4 shards of 6 good samples (and a bad one)
    assert [s[:2] for s in full_log.steps] == [(k // steps, k) for k in range(2 * steps)]
    every_key = {k for shard in keys for k in shard}
    for epoch in (0, 1):
        seen = [k for e, _, batch, _ in full_log.steps if e == epoch for k in batch]
        assert len(seen) == samples and set(seen) <= every_key
        if samples <= 24:  # one pass of each reader over its shards: each sample once at most
            assert len(set(seen)) == samples
        ids = [i for e, _, _, batch in full_log.steps if e == epoch for i in batch]
        assert ids == list(range(samples))
    epochs = [[k for e, _, b, _ in full_log.steps if e == x for k in b] for x in (0, 1)]
    assert epochs[0] != epochs[1]  # the epoch reshuffles (else the test proves little)

    cfg = shard_config(root, tmp_path / "cut", overrides)
    cut_log = Record(stop_after=steps + cut)  # mid-epoch 1
    with pytest.raises(TrainingInterrupted) as err:
        Trainer(cfg, hooks=[cut_log]).fit()
    state = load_checkpoint(err.value.checkpoint)
    assert (state["epoch"], state["batch_in_epoch"], state["step"]) == (1, cut, steps + cut)
    resumed_log = Record()
    resumed = Trainer(cfg, resume=err.value.checkpoint, hooks=[resumed_log])
    resumed.fit()
    assert resumed_log.steps[0][:2] == (1, steps + cut)
    assert cut_log.steps + resumed_log.steps == full_log.steps  # no repeat, no skip, same order
    assert_same_params(model_params(resumed.model), model_params(full.model))
    assert_same_params(resumed.loss_fn.state_dict(), full.loss_fn.state_dict())
    records = [json.loads(x) for x in (tmp_path / "cut/metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if r["kind"] == "step"] == list(range(1, 2 * steps + 1))
    skipped = [r["skipped"] for r in records if r["kind"] == "epoch"]
    full_records = (tmp_path / "full/metrics.jsonl").read_text().splitlines()
    assert skipped == [r["skipped"] for r in map(json.loads, full_records) if r["kind"] == "epoch"]
    assert state["epoch_skipped"] >= 1  # a bad sample before the cut: counted once, not again


# -- a resume must keep the readers -------------------------------------------------------------


def test_a_resume_that_changes_the_readers_or_the_stream_is_refused(shards, tmp_path, capsys):
    root, _ = shards
    cfg = shard_config(root, tmp_path / "run", ["train.epochs=1"])
    Trainer(cfg).fit()
    last = tmp_path / "run/last.pt"
    for change in (
        "data.num_workers=2",
        "data.shuffle_buffer=7",
        "data.train_num_samples=20",
        "data.resampled=true",
    ):
        key, value = change.split("=")
        other = shard_config(root, tmp_path / "run", ["train.epochs=2", change])
        with pytest.raises(RunFolderError, match=key.replace(".", r"\.")) as err:
            Trainer(other, resume=last)
        assert "\n" not in str(err.value) and f"-> {value}" in str(err.value).lower()
    # another world size (the checkpoint's is recorded): refused the same way
    state = load_checkpoint(last)
    state["world_size"] = 2
    torch.save(state, tmp_path / "run/two.pt")
    with pytest.raises(RunFolderError, match="2 ranks.*1") as err:
        Trainer(
            shard_config(root, tmp_path / "run", ["train.epochs=2"]), resume=tmp_path / "run/two.pt"
        )
    assert "\n" not in str(err.value)
    # the command line: one line, exit 2
    (tmp_path / "run.json").write_text(json.dumps(cfg.to_dict()))
    argv = ["train", str(tmp_path / "run.json"), "--set", "data.num_workers=2"]
    assert main([*argv, "--resume", str(last)]) == 2
    err_lines = capsys.readouterr().err.strip().splitlines()
    assert len(err_lines) == 1 and err_lines[0].startswith("vlret train: ")
    assert "data.num_workers: 0 -> 2" in err_lines[0]
    # what does not change the stream is allowed: more epochs, the data's location
    moved = tmp_path / "moved"
    moved.symlink_to(root)
    ok = Trainer(shard_config(moved, tmp_path / "run", ["train.epochs=2"]), resume=last)
    assert ok.epoch == 1


def test_the_readers_of_another_format_may_change_across_a_resume():
    stored = shard_config(Path("."), Path("run")).to_dict()
    current = json.loads(json.dumps(stored))
    current["data"]["num_workers"] = 2
    with pytest.raises(RunFolderError, match=r"data\.num_workers: 0 -> 2; written by a run of 1"):
        check_stream_resume(stored, current, "last.pt", stored_world=1, world=2)
    check_stream_resume(stored, stored, "last.pt", stored_world=None, world=2)  # not recorded
    for raw in (stored, current):
        raw["data"].update(format="csv", csv="pairs.csv", shards=None, train_num_samples=None)
    # the CSV's order is the sampler's, a function of the seed, epoch and ranks only
    check_stream_resume(stored, current, "last.pt", stored_world=1, world=2)


# -- two gloo ranks against one process -----------------------------------------------------


TWO_RANKS = [
    "data.train_num_samples=12",  # one pass: 2 shards of 6, 3 global batches of 4
    "data.shuffle_buffer=1",
    "train.epochs=1",
    "optim.name=sgd",
    "optim.lr=0.1",
    "optim.warmup_steps=0",
    "optim.grad_clip=0",
]


def rank_worker(rank: int, world: int, port: int, root: str, out: str) -> None:
    rank_env(rank, world, port)
    import torch.distributed as dist

    try:
        log = Record()
        two = [*TWO_RANKS, f"data.shards={json.dumps([str(Path(root) / '{00000..00001}.tar')])}"]
        trainer = Trainer(shard_config(Path(root), Path(out) / "ddp", two), hooks=[log])
        init = model_params(trainer.model)
        trainer.fit()
        trainer.close()
        state = {"init": init, "params": model_params(trainer.model), "steps": log.steps}
        state["loss"] = {k: v.clone() for k, v in trainer.loss_fn.state_dict().items()}
        # Ctrl-C on rank 0 after the first step, then both ranks resume
        cfg = shard_config(Path(root), Path(out) / "cut", two)
        cut = Record(stop_after=1 if rank == 0 else None)
        try:
            Trainer(cfg, hooks=[cut]).fit()
        except TrainingInterrupted:
            pass
        dist.barrier()  # rank 0 has written last.pt
        resumed_log = Record()
        resumed = Trainer(cfg, resume=Path(out) / "cut/last.pt", hooks=[resumed_log])
        resumed.fit()
        resumed.close()
        state["resumed"] = {"params": model_params(resumed.model)}
        state["resumed"]["steps"] = cut.steps + resumed_log.steps
        state["resumed"]["cut_at"] = len(cut.steps)
        torch.save(state, Path(out) / f"rank{rank}.pt")
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_gloo_ranks_read_disjoint_shards_and_equal_one_process_on_the_union(shards, tmp_path):
    root, keys = shards
    out = tmp_path / "out"
    out.mkdir()
    mp.start_processes(
        rank_worker, args=(2, free_port(), str(root), str(out)), nprocs=2, start_method="spawn"
    )
    ranks = [torch.load(out / f"rank{r}.pt", weights_only=False) for r in range(2)]
    batches = [[b for _, _, b, _ in state["steps"]] for state in ranks]
    assert [len(b) for b in batches] == [3, 3] and all(len(x) == 2 for b in batches for x in b)
    seen = [{k for batch in b for k in batch} for b in batches]
    assert not seen[0] & seen[1]  # disjoint ...
    assert seen[0] | seen[1] == set(keys[0]) | set(keys[1])  # ... and their union is the epoch
    for r in range(2):  # one shard each, read in order (shuffle_buffer = 1)
        shard = next(s for s in keys[:2] if s[0] in seen[r])
        assert [k for batch in batches[r] for k in batch] == shard
    # The global batches, rank 0's half then rank 1's, packed into one shard in that order:
    # one process reads the same global batches (same sample ids, so the same crops).
    order = [k for b0, b1 in zip(*batches, strict=True) for k in b0 + b1]
    repack(tmp_path / "union.tar", [root / "00000.tar", root / "00001.tar"], order)
    single_overrides = [*TWO_RANKS, f"data.shards={json.dumps(str(tmp_path / 'union.tar'))}"]
    log = Record()
    torch.set_default_dtype(torch.float64)
    try:
        single = Trainer(shard_config(root, tmp_path / "single", single_overrides), hooks=[log])
        init = model_params(single.model)
        single.fit()
    finally:
        torch.set_default_dtype(torch.float32)
    assert [b for _, _, b, _ in log.steps] == [b0 + b1 for b0, b1 in zip(*batches, strict=True)]
    ids = [[i for i in ranks[0]["steps"][s][3] + ranks[1]["steps"][s][3]] for s in range(3)]
    assert [i for _, _, _, i in log.steps] == ids
    want = model_params(single.model)
    assert want["text_encoder.text_projection.weight"].dtype == torch.float32  # CLIP: float32
    # a gradient's rounding also carries the scale of the activations it came from (a key
    # bias's true gradient is 0, its computed one rounding): the model's largest change, once
    largest = max(
        (want[k] - init[k]).abs().max().item() for k in want if want[k].is_floating_point()
    )
    for state in ranks:
        assert_same_params(state["init"], init)  # same seed: the same initial weights
        for name, value in want.items():
            got = state["params"][name]
            assert got.dtype == value.dtype, name
            if not value.is_floating_point():
                assert torch.equal(got, value), name
                continue
            change = (value - init[name]).double()
            own = value.abs().max().item() + (64 + LOGIT_SCALE) * change.abs().max().item()
            scale = own + largest
            tol = STEPS * 16 * torch.finfo(torch.float32).eps * scale
            torch.testing.assert_close(
                (got - init[name]).double(),
                change,
                rtol=0,
                atol=tol,
                msg=lambda m, k=name: f"{k}: {m}",
            )
        assert_same_params(state["loss"], dict(single.loss_fn.state_dict()), atol=1e-6)
    # interrupted after the first step on rank 0 and resumed on both: the same samples on each
    # rank and the same weights, bit for bit, as the uninterrupted 2-rank run
    for state in ranks:
        assert state["resumed"]["cut_at"] == 1 and state["resumed"]["steps"] == state["steps"]
        assert_same_params(state["resumed"]["params"], state["params"])
    # the test can fail: the steps moved the weights far more than the tolerance
    name = "text_encoder.text_projection.weight"
    change = (want[name] - init[name]).abs().max().item()
    assert change > 1e3 * STEPS * 16 * torch.finfo(torch.float32).eps * want[name].abs().max()


#: The steps compared, and InfoNCE's logit scale 1 / 0.07 (how much it magnifies a cosine's
#: rounding). Both sides run in float32 (the CLIP towers are float32 whatever the default
#: dtype) in two summation orders (2-row shards and an all-reduce against 4 rows): a weight
#: carries float32 rounding of its own size each step, its change ~n eps of the change's scale
#: with n <= 64 terms per sum, magnified by the logit scale, plus rounding at the model's
#: largest change (a gradient that is truly 0); 16x headroom per step.
STEPS, LOGIT_SCALE = 3, 15


def test_a_shard_run_resumes_only_under_its_pixel_cap():
    """Which samples are skipped as over data.max_image_pixels decides the replayed stream."""
    stored = shard_config(Path("."), Path("run")).to_dict()
    current = json.loads(json.dumps(stored))
    current["data"]["max_image_pixels"] = 1000
    with pytest.raises(RunFolderError, match=r"data\.max_image_pixels: 25000000 -> 1000"):
        check_stream_resume(stored, current, "last.pt", stored_world=1, world=1)
