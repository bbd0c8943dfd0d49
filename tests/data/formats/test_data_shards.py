"""webdataset shards in the img2dataset layout, written here with tarfile and PIL: patterns and
lists, bad samples skipped and counted, the bad-fraction stop, seeded order, workers, resume,
two gloo ranks."""

from __future__ import annotations

import io
import json
import socket
import tarfile
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

pytest.importorskip("webdataset")
Image = pytest.importorskip("PIL.Image")

from vlret.data.bad_samples import (  # noqa: E402
    TooManyBadSamples,
    check_bad_fraction,
    epoch_skipped,
)
from vlret.data.formats.shards import ShardDevSet, ShardError, ShardStream, expand_shards  # noqa: E402
from vlret.run.config import ConfigError, config_from_dict  # noqa: E402


def image_bytes(seed: int, fmt: str = "JPEG") -> bytes:
    rng = np.random.default_rng(seed)
    pixels = rng.integers(0, 256, (6 + seed % 3, 7, 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, format=fmt)
    return buf.getvalue()


def add(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    tar.addfile(info, io.BytesIO(data))


def write_shard(
    path: Path, shard_id: int, n: int, *, bad: dict[int, str] | None = None, truncate=False
) -> list[str]:
    """An img2dataset shard: KEY (9 digits) .jpg/.png, .txt, .json; returns the good keys.
    ``bad``: index -> "jpeg" (corrupt bytes), "caption" (empty .txt), "noimage"."""
    bad = bad or {}
    good = []
    with tarfile.open(path, "w") as tar:
        for i in range(n):
            key = f"{shard_id * 10_000 + i:09d}"
            kind = bad.get(i)
            ext, fmt = ("png", "PNG") if i % 4 == 3 else ("jpg", "JPEG")
            img = image_bytes(shard_id * 100 + i, fmt)
            if kind == "jpeg":
                img = img[:20] + b"\x00" * 30
            if kind != "noimage":
                add(tar, f"{key}.{ext}", img)
            add(tar, f"{key}.txt", b"  " if kind == "caption" else f"caption {key}".encode())
            meta = {"url": f"http://x/{key}", "key": key, "status": "success", "caption": key}
            add(tar, f"{key}.json", json.dumps(meta).encode())
            if kind is None:
                good.append(key)
    if truncate:  # cut the file inside the last sample's image: a broken tar member
        with tarfile.open(path) as tar:
            member = [m for m in tar.getmembers() if m.name.endswith((".jpg", ".png"))][-1]
        path.write_bytes(path.read_bytes()[: member.offset_data + member.size // 2])
        good.pop()
    return good


@pytest.fixture
def shards(tmp_path):
    keys = []
    for s in range(4):
        keys += write_shard(tmp_path / f"{s:05d}.tar", s, 6)
    return tmp_path, keys


def stream(files, n, batch=4, **kw):
    kw.setdefault("shuffle_buffer", 5)
    return ShardStream(files, num_samples=n, batch_size=batch, seed=3, **kw)


def epoch_keys(st, epoch=0, start=0, workers=0):
    st.set_epoch(epoch, start_batch=start)
    batches = list(st.loader(num_workers=workers, seed=epoch))
    return [k for b in batches for k in b.keys], batches


def test_brace_patterns_lists_and_missing_shards(shards):
    root, _ = shards
    files = expand_shards("{00000..00003}.tar", root=root)
    assert [Path(f).name for f in files] == [f"{i:05d}.tar" for i in range(4)]
    listed = expand_shards(["00002.tar", "0000{0..1}.tar"], root=root)
    assert [Path(f).name for f in listed] == ["00002.tar", "00000.tar", "00001.tar"]
    with pytest.raises(FileNotFoundError, match=r"data.shards: .*00004.tar: missing"):
        expand_shards("{00003..00007}.tar", root=root)


def test_an_epoch_reads_every_sample_once_with_ids_and_tensors(shards):
    root, keys = shards
    files = expand_shards("{00000..00003}.tar", root=root)
    st = stream(files, 24, image_transform=lambda im: torch.tensor(im.size))  # one pass
    got, batches = epoch_keys(st)
    assert sorted(got) == sorted(keys) and len(batches) == st.num_batches() == 6
    assert torch.equal(torch.cat([b.img_index for b in batches]), torch.arange(24))
    assert all(b.captions == [f"caption {k}" for k in b.keys] for b in batches)
    first = batches[0]
    assert first.features.shape == (4, 2) and sum(b.skipped for b in batches) == 0


def test_same_seed_same_order_other_epoch_other_order(shards):
    root, _ = shards
    files = expand_shards("{00000..00003}.tar", root=root)
    a, _ = epoch_keys(stream(files, 24))
    b, _ = epoch_keys(stream(files, 24))
    c, _ = epoch_keys(stream(files, 24), epoch=1)
    assert a == b and sorted(a) == sorted(c) and a != c


def test_workers_split_shards_and_keep_the_order(shards):
    root, keys = shards
    files = expand_shards("{00000..00003}.tar", root=root)
    a, batches = epoch_keys(stream(files, 24, num_workers=2), workers=2)
    b, _ = epoch_keys(stream(files, 24, num_workers=2), workers=2)
    assert a == b and sorted(a) == sorted(keys)
    # a worker reads whole shards of its own: batch b comes from worker b % 2
    shard_of = [{int(k) // 10_000 for k in batch.keys} for batch in batches]
    assert not (set().union(*shard_of[0::2]) & set().union(*shard_of[1::2]))


def test_resume_continues_without_repeating_or_skipping(shards):
    root, _ = shards
    files = expand_shards("{00000..00003}.tar", root=root)
    full, full_batches = epoch_keys(stream(files, 24, num_workers=2), epoch=2, workers=2)
    for start in (1, 4):
        rest, batches = epoch_keys(
            stream(files, 24, num_workers=2), epoch=2, start=start, workers=2
        )
        assert rest == full[start * 4 :]
        for mine, theirs in zip(batches, full_batches[start:], strict=True):
            assert torch.equal(mine.img_index, theirs.img_index)


def test_augmentation_keys_are_the_sample_ids(shards):
    root, _ = shards
    files = expand_shards("{00000..00003}.tar", root=root)
    seen = []
    st = stream(files, 8, augment=lambda im, key: seen.append(tuple(key)) or torch.zeros(1))
    epoch_keys(st, epoch=5)
    assert seen == [(3, 5, i) for i in range(8)]


def test_bad_samples_are_skipped_and_counted(tmp_path):
    good = write_shard(tmp_path / "00000.tar", 0, 8, bad={1: "jpeg", 4: "caption"})
    good += write_shard(tmp_path / "00001.tar", 1, 8, bad={2: "noimage"})
    good += write_shard(tmp_path / "00002.tar", 2, 8, truncate=True)
    files = expand_shards("{00000..00002}.tar", root=tmp_path)
    st = stream(files, 20, max_bad_fraction=0.5, shuffle_buffer=0)
    got, batches = epoch_keys(st)
    skipped = sum(b.skipped for b in batches)
    assert sorted(got) == sorted(good) and len(good) == 20  # every good sample, once
    # a corrupt jpeg, an empty caption, no image; the broken member when read before the end
    assert skipped >= 3 and "000000001" not in got and "000000004" not in got
    dev = ShardDevSet([files[2]], max_bad_fraction=0.5)  # read whole: the broken member counts
    assert dev.image_ids == good[-7:] and dev.skipped >= 1
    assert epoch_skipped(st, skipped) == skipped and epoch_skipped(object(), 3) is None
    check_bad_fraction(skipped, st)  # 4+ of 20+: under one half
    with pytest.raises(TooManyBadSamples, match=r"1 bad sample against 16 used in epoch 0.*0.01"):
        check_bad_fraction(1, stream(files, 16, max_bad_fraction=0.01))


def test_a_broken_data_set_stops_with_one_line_and_never_stalls(tmp_path):
    write_shard(tmp_path / "00000.tar", 0, 10, bad={i: "jpeg" for i in range(10)})
    write_shard(tmp_path / "00001.tar", 1, 10, bad={i: "caption" for i in range(5)})
    files = expand_shards("{00000..00001}.tar", root=tmp_path)
    for workers in (0, 2):
        st = stream(files, 8, num_workers=workers, max_bad_fraction=0.2)
        with pytest.raises(ShardError) as err:
            epoch_keys(st, workers=workers)
        assert "\n" not in str(err.value) and "max_bad_fraction = 0.2" in str(err.value)
    empty = tmp_path / "empty.tar"
    tarfile.open(empty, "w").close()
    with pytest.raises(ShardError, match="read no sample"):
        epoch_keys(stream([str(empty)], 4, max_bad_fraction=1.0))


def test_fewer_shards_than_readers_is_refused_unless_resampled(shards):
    root, keys = shards
    files = expand_shards("{00000..00002}.tar", root=root)
    with pytest.raises(ShardError, match="3 shards for 2 ranks x 2 workers = 4 readers"):
        stream(files, 24, world_size=2, num_workers=2)
    st = stream(files, 24, world_size=2, num_workers=2, resampled=True)
    got, _ = epoch_keys(st, workers=2)
    assert len(got) == 12 and set(got) <= set(keys)  # rank 0's half, shards drawn at random


def test_dev_shards_are_read_whole_in_order(tmp_path):
    keys = write_shard(tmp_path / "00000.tar", 0, 5, bad={2: "caption"})
    dev = ShardDevSet(
        [str(tmp_path / "00000.tar")], image_transform=lambda im: im.size, max_bad_fraction=0.2
    )
    assert dev.image_ids == keys and dev.skipped == 1 and dev.num_captions == 4
    item = dev[1]
    assert item.img_index == 1 and item.caption == f"caption {keys[1]}"


def config(**data):
    return {
        "output_dir": "run",
        "data": {"root": "r", "format": "webdataset", "tokenizer": "tok", **data},
        "loss": {"name": "infonce"},
        "train": {"epochs": 1, "batch_size": 4},
    }


def test_config_keys_and_errors():
    data = config_from_dict(config(shards="{0..3}.tar", train_num_samples=100)).data
    assert (data.shuffle_buffer, data.resampled, data.max_bad_fraction) == (1000, False, 0.01)
    assert data.dev_shards is None
    for bad, key in [
        ({"train_num_samples": 100}, "data.shards"),
        ({"shards": ["a.tar"]}, "data.train_num_samples"),
        ({"shards": "a.tar", "train_num_samples": 9, "max_bad_fraction": 2}, "max_bad_fraction"),
        ({"shards": "a.tar", "train_num_samples": 9, "tokenizer": None}, "data.tokenizer"),
        ({"format": "precomp", "shards": "a.tar"}, "data.shards"),
    ]:
        with pytest.raises(ConfigError, match=key):
            config_from_dict(config(**bad))


# -- two gloo ranks ----------------------------------------------------------------------------


def rank_worker(rank: int, world: int, port: int, root: str, out: str) -> None:
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world
    )
    try:
        files = expand_shards("{00000..00003}.tar", root=root)
        st = stream(files, 24, rank=dist.get_rank(), world_size=dist.get_world_size())
        keys, batches = epoch_keys(st)
        total = epoch_skipped(st, rank + 1)  # all-reduced over the ranks
        ids = torch.cat([b.img_index for b in batches])
        torch.save({"keys": keys, "ids": ids, "skipped": total}, Path(out) / f"rank{rank}.pt")
    finally:
        dist.destroy_process_group()


def test_two_gloo_ranks_read_disjoint_shards_covering_everything(shards, tmp_path):
    root, keys = shards
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.start_processes(
        rank_worker, args=(2, port, str(root), str(tmp_path)), nprocs=2, start_method="spawn"
    )
    got = [torch.load(tmp_path / f"rank{r}.pt") for r in range(2)]
    shards_of = [{int(k) // 10_000 for k in g["keys"]} for g in got]
    assert not shards_of[0] & shards_of[1]
    assert sorted(got[0]["keys"] + got[1]["keys"]) == sorted(keys)
    ids = torch.cat([g["ids"] for g in got])
    assert sorted(ids.tolist()) == list(range(24))  # global ids unique across the ranks
    assert got[0]["skipped"] == got[1]["skipped"] == 3
