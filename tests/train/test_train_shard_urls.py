"""The trainer on shards named by URL (tests/data/formats/test_shard_urls.py tests the reading
side): shards written by ``webdataset.ShardWriter`` and read through ``pipe:cat`` or an HTTP
server on 127.0.0.1 train to the same losses and weights, bit for bit, as the same files named
by their paths; a run on HTTP shards interrupted mid-epoch and resumed trains on the
uninterrupted run's samples; ``vlret train`` on a failing command or URL says so in one line.

The model and run config are those of tests/train/test_train_shards.py."""

from __future__ import annotations

import http.server
import io
import json
import threading
from functools import partial
from pathlib import Path

import numpy as np
import pytest

wds = pytest.importorskip("webdataset")
pytest.importorskip("transformers")
Image = pytest.importorskip("PIL.Image")

from test_train_shards import Record, shard_config  # noqa: E402

from train_helpers import assert_same_params, model_params  # noqa: E402
from vlret.cli import main  # noqa: E402
from vlret.train import Trainer, TrainingInterrupted  # noqa: E402


class Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args) -> None:
        pass


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """Four ShardWriter shards of 7 samples, each first one a corrupt JPEG (skipped and
    counted), and the base URL of an HTTP server serving their folder."""
    root = tmp_path_factory.mktemp("url-shards")
    with wds.ShardWriter(str(root / "%05d.tar"), maxcount=7, verbose=0) as sink:
        for i in range(28):
            shard, index = divmod(i, 7)
            rng = np.random.default_rng(i)
            buf = io.BytesIO()
            Image.fromarray(rng.integers(0, 256, (12, 10, 3), dtype=np.uint8)).save(buf, "JPEG")
            image = buf.getvalue() if index else b"\xff\xd8 not a jpeg"
            key = f"{shard * 10_000 + index:09d}"
            caption = f"a photo number {shard} {index}"
            sink.write({"__key__": key, "jpg": image, "txt": caption, "json": {"key": key}})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), partial(Quiet, directory=root))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield root, f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def config(root: Path, out: Path, shards: str, overrides: list[str] = ()):  # type: ignore[assignment]
    return shard_config(root, out, [f"data.shards={json.dumps(shards)}", *overrides])


def losses(folder: Path) -> list[tuple]:
    """Each step's loss, each epoch's mean loss and skipped count, from ``metrics.jsonl``."""
    records = [json.loads(x) for x in (folder / "metrics.jsonl").read_text().splitlines()]
    steps = [("step", r["step"], r["loss"]) for r in records if r["kind"] == "step"]
    epochs = [("epoch", r["train_loss"], r["skipped"]) for r in records if r["kind"] == "epoch"]
    return steps + epochs


@pytest.mark.parametrize("workers", [0, 2])
def test_url_shards_train_to_the_losses_and_weights_of_the_local_files(served, tmp_path, workers):
    root, base = served
    runs = {}
    for form, shards in [
        ("local", str(root / "{00000..00003}.tar")),
        ("pipe", f"pipe:cat {root}/{{00000..00003}}.tar"),
        ("http", f"{base}/{{00000..00003}}.tar"),
    ]:
        log = Record()
        trainer = Trainer(
            config(root, tmp_path / form, shards, [f"data.num_workers={workers}"]), hooks=[log]
        )
        trainer.fit()
        runs[form] = (losses(tmp_path / form), log.steps, model_params(trainer.model))
    want_losses, want_steps, want_params = runs["local"]
    assert len(want_steps) == 8 and [k for k, *_ in want_losses] == ["step"] * 8 + ["epoch"] * 2
    assert all(s >= 1 for k, _, s in want_losses if k == "epoch")  # corrupt JPEGs counted
    for form in ("pipe", "http"):
        got_losses, got_steps, got_params = runs[form]
        assert got_losses == want_losses and got_steps == want_steps, form
        assert_same_params(got_params, want_params)


def test_a_run_on_http_shards_resumes_exactly(served, tmp_path):
    root, base = served
    shards = f"{base}/{{00000..00003}}.tar"
    overrides = ["data.num_workers=2", "data.train_num_samples=36"]  # 9 steps, a second pass
    full_log = Record()
    full = Trainer(config(root, tmp_path / "full", shards, overrides), hooks=[full_log])
    full.fit()
    cfg = config(root, tmp_path / "cut", shards, overrides)
    cut_log = Record(stop_after=9 + 7)  # mid-epoch 1, in both workers' second pass
    with pytest.raises(TrainingInterrupted) as err:
        Trainer(cfg, hooks=[cut_log]).fit()
    resumed_log = Record()
    resumed = Trainer(cfg, resume=err.value.checkpoint, hooks=[resumed_log])
    resumed.fit()
    assert cut_log.steps + resumed_log.steps == full_log.steps
    assert_same_params(model_params(resumed.model), model_params(full.model))
    assert losses(tmp_path / "cut") == losses(tmp_path / "full")


def test_vlret_train_on_a_failing_command_or_url_is_one_line(served, tmp_path, capsys):
    root, base = served
    for key, shard, what in [
        ("data.shards", "pipe:false", "the command exited with status 1"),
        ("data.shards", f"{base}/missing.tar", "HTTP 404"),
        ("data.dev_shards", f"{base}/missing.tar", "HTTP 404"),
        ("data.shards", "s3://bucket/00000.tar", "'pipe:aws s3 cp s3://bucket/00000.tar -'"),
    ]:
        cfg = config(root, tmp_path / "run", str(root / "{00000..00003}.tar"), ["train.epochs=1"])
        raw = cfg.to_dict()
        raw["data"][key.split(".")[1]] = shard
        (tmp_path / "run.json").write_text(json.dumps(raw))
        assert main(["train", str(tmp_path / "run.json"), "--overwrite"]) == 2
        lines = capsys.readouterr().err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith(f"vlret train: {key}: {shard}: "), lines
        assert what in lines[0]
