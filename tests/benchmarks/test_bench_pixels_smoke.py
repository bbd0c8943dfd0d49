"""Smoke test of benchmarks/bench_pixels.py: its functions at tiny sizes (no timing is checked).

The shards it writes are in the img2dataset layout, both sides of (1) deliver every image, the
memory worker of (2) takes a gradient-caching step of a tiny CLIP, and (3) is skipped with its
reason where there is no GPU.
"""

from __future__ import annotations

import importlib
import io
import json
import sys
import tarfile
from pathlib import Path

import pytest
import torch

pytest.importorskip("webdataset")
pytest.importorskip("PIL")

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"
TINY_VISION = {
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_attention_heads": 2,
    "image_size": 32,
    "patch_size": 8,
}
TINY_TEXT = {"hidden_size": 32, "intermediate_size": 64, "num_attention_heads": 2}


@pytest.fixture(scope="module")
def bench():
    sys.path.insert(0, str(BENCH))
    try:
        module = importlib.import_module("bench_pixels")  # picklable for the Pool
        yield module
    finally:
        sys.path.remove(str(BENCH))


def test_shards_are_in_the_img2dataset_layout(bench, tmp_path):
    from PIL import Image

    paths = bench.write_shards(tmp_path, 7, 3, 40)
    assert [Path(p).name for p in paths] == ["00000.tar", "00001.tar", "00002.tar"]
    keys = []
    for path in paths:
        with tarfile.open(path) as tar:
            names = tar.getnames()
            stems = [n.split(".", 1)[0] for n in names]
            for stem in dict.fromkeys(stems):
                assert len(stem) == 9 and stem.isdigit()
                own = sorted(n for n in names if n.startswith(stem + "."))
                assert own == [f"{stem}.jpg", f"{stem}.json", f"{stem}.txt"]
                image = Image.open(io.BytesIO(tar.extractfile(f"{stem}.jpg").read()))
                assert image.format == "JPEG" and image.size == (40, 40)
                caption = tar.extractfile(f"{stem}.txt").read().decode()
                record = json.loads(tar.extractfile(f"{stem}.json").read())
                assert record["key"] == stem and record["caption"] == caption and caption
                keys.append(stem)
    assert len(keys) == len(set(keys)) == 7
    assert sum(bench.decode_shard(p) for p in paths) == 7


def test_pipeline_and_bound_deliver_every_image(bench, tmp_path, capsys):
    args = bench.parse(["--images", "24", "--shards", "4", "--batch", "6", "--workers", "2"])
    shards = bench.write_shards(tmp_path, 24, 4, 32)
    n, seconds = bench.run_pipeline(shards, 24, args)
    assert n == 24 and seconds > 0
    n, seconds = bench.run_bound(shards, 2)
    assert n == 24 and seconds > 0
    args.profile, args.rounds = True, 1
    line = bench.part_pipeline(shards, args)
    out = capsys.readouterr().out
    assert line.startswith("(1) pipeline") and ("PASS" in line or "MISS" in line)
    assert "one worker in-process: 12 images" in out  # half of the epoch: 2 workers
    assert "decode" in out and "top 12 by own time" in out


def test_memory_worker_takes_a_grad_cache_step(bench, tmp_path):
    shards = bench.write_shards(tmp_path, 8, 2, 40)
    spec = {
        "shards": shards,
        "layers": 1,
        "chunk": 2,
        "loss_chunk": 2,
        "device": "cpu",
        "vision": TINY_VISION,
        "text": TINY_TEXT,
    }
    plain = bench.worker_memory({**spec, "batch": 2})
    cached = bench.worker_memory({**spec, "batch": 6, "grad_cache": 2})
    for res in (plain, cached):
        assert res["peak"] >= 0 and res["seconds"] > 0 and res["base"] > 0
        assert torch.isfinite(torch.tensor(res["loss"]))
    assert plain["params"] == cached["params"]
    # InfoNCE of 6 pairs from a random model is near log 6, of 2 pairs near log 2
    assert cached["loss"] > plain["loss"]


def test_gpu_part_is_skipped_with_a_reason(bench, capsys):
    if torch.cuda.is_available():
        pytest.skip("a GPU is present: the part runs instead of being skipped")
    line = bench.part_gpu([], bench.parse([]), "cpu")
    assert line.startswith("(3) skipped: torch.cuda.is_available() is False")
    assert line in capsys.readouterr().out


def test_quick_and_full_sizes(bench):
    quick, full = bench.parse([]), bench.parse(["--full"])
    assert (quick.layers, quick.gc_batch, quick.chunk) == (2, 512, 128)
    assert (full.layers, full.gc_batch, full.chunk) == (12, 4096, 128)
    config = bench.run_config(
        {
            "shards": ["/x/0.tar"],
            "layers": 12,
            "chunk": 128,
            "loss_chunk": 128,
            "device": "cpu",
            "batch": 4096,
            "grad_cache": 128,
        },
        Path("/tmp/run"),
    )
    assert config["train"]["grad_cache_chunk"] == 128 and config["train"]["batch_size"] == 4096
    assert config["model"]["preset"] == "ViT-B-32"
    assert config["model"]["config"]["vision_config"] == {"num_hidden_layers": 12}
