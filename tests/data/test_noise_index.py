"""Noisy correspondence (vlret.data.noisy): the released NCR / DECL noise-index layouts applied to
precomputed training captions, their generation, the run folder's record, and clean evaluation.

The data folders are written here in the precomputed format itself ({split}_ims.npy,
{split}_caps.txt); the oracles are naive loops over captions, and the released loaders' draws
are replayed with NumPy's global generator as NCR's and DECL's data.py call it.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from vlret.data import DataFormatError
from vlret.data.config import DataConfig
from vlret.data.formats import open_dataset
from vlret.data.noisy import (
    apply_noise_index,
    generate_noise_index,
    noise_summary,
    read_noise_index,
    save_noise_record,
)
from vlret.eval.encode import encode_dataset
from vlret.metrics import retrieval_metrics
from vlret.run.builders import build_train_dataset, load_trained_model
from vlret.run.config import ConfigError, config_from_dict
from vlret.run.eval_data import eval_data_config
from vlret.run.evaluate import run_evaluation
from vlret.run.folder import RunFolderError, check_resume_config
from vlret.train import Trainer

N_IMG, CPI, REGIONS, DIM = 6, 5, 3, 16
WORDS = ["red", "blue", "dog", "cat", "runs", "sits", "on", "grass", "a", "the"]


def write_precomp_split(root: Path, split: str, n_img: int, cpi: int, *, seed: int) -> np.ndarray:
    """``{split}_ims.npy`` (float32 regions) and ``{split}_caps.txt`` (``cpi`` lines per image,
    caption k naming its index so a served item shows which caption it is)."""
    rng = np.random.default_rng(seed)
    ims = rng.standard_normal((n_img, REGIONS, DIM)).astype(np.float32)
    root.mkdir(parents=True, exist_ok=True)
    np.save(root / f"{split}_ims.npy", ims)
    lines = []
    for k in range(n_img * cpi):
        words = rng.choice(WORDS, 4).tolist()
        lines.append(" ".join(["caption", str(k), *words, "."]))
    (root / f"{split}_caps.txt").write_text("\n".join(lines) + "\n")
    return ims


def write_folder(root: Path, *, n_img: int = N_IMG, cpi: int = CPI) -> Path:
    """train, and dev / test as copies of train (same sizes: a noise index would fit them)."""
    for split in ("train", "dev", "test"):
        write_precomp_split(root, split, n_img, cpi, seed=0)
    return root


def data_config(root: Path, **noise) -> DataConfig:
    return DataConfig(root=str(root), format="precomp", captions_per_image=CPI, **noise)


def save_index(path: Path, index) -> Path:
    np.save(path, np.asarray(index))
    return path


# -- released layouts against a naive loop --------------------------------------------------------


def check_items(ds, ims: np.ndarray, want_image: list[int]) -> None:
    """Each served item pairs caption k (its own text) with the image row ``want_image[k]``."""
    captions = (ds.root / "train_caps.txt").read_text().splitlines()
    for k in range(len(captions)):
        item = ds[k]
        assert item.caption == captions[k] and item.cap_index == k
        assert item.img_index == want_image[k]
        assert torch.equal(item.features, torch.from_numpy(ims[want_image[k]]))


def test_ncr_index_pairs_each_caption_with_its_entry(tmp_path):
    """NCR's layout: one entry per caption, the image it is paired with; clean iff entry ==
    k // captions_per_image."""
    root = write_folder(tmp_path / "data")
    ims = np.load(root / "train_ims.npy")
    entries = np.random.default_rng(1).integers(0, N_IMG, N_IMG * CPI)
    path = save_index(tmp_path / "f30k_precomp_0.2.npy", entries)
    ds = build_train_dataset(data_config(root, noise_index=str(path)), "train", None)
    want, corrupted, original = [], [], []
    for k in range(N_IMG * CPI):
        want.append(int(entries[k]))
        original.append(k // CPI)
        corrupted.append(int(entries[k]) != k // CPI)
    check_items(ds, ims, want)
    assert ds.txt_to_img.tolist() == want
    assert ds.original_txt_to_img.tolist() == original
    assert ds.corrupted.dtype == torch.bool and ds.corrupted.tolist() == corrupted
    assert ds.noise.format == "ncr" and ds.noise.source == str(path)
    assert 0 < sum(corrupted) < N_IMG * CPI  # the draw moved some captions, not all


def test_decl_index_moves_all_captions_of_an_image(tmp_path):
    """DECL's layout: one entry per image, the image used in place of it; all of image i's
    captions go to image entry[i], clean iff entry[i] == i."""
    root = write_folder(tmp_path / "data")
    ims = np.load(root / "train_ims.npy")
    perm = np.array([0, 3, 2, 5, 4, 1])  # images 1, 3, 5 cycle; 0, 2, 4 stay
    path = save_index(tmp_path / "noise_inx_0.5.npy", perm)
    ds = build_train_dataset(data_config(root, noise_index=str(path)), "train", None)
    want, corrupted = [], []
    for k in range(N_IMG * CPI):
        image = k // CPI
        want.append(int(perm[image]))
        corrupted.append(int(perm[image]) != image)
    check_items(ds, ims, want)
    assert ds.corrupted.tolist() == corrupted and sum(corrupted) == 3 * CPI
    assert ds.noise.format == "decl"
    record = noise_summary(ds)
    assert (record["corrupted_captions"], record["corrupted_images"]) == (15, 3)
    assert record["corrupted_fraction"] == 0.5 and record["source"] == str(path)


def test_one_caption_per_image_needs_noise_format(tmp_path):
    """With one caption per image both layouts have the same length: auto refuses, naming
    data.noise_format; each explicit format gives its own pairing."""
    root = tmp_path / "data"
    write_precomp_split(root, "train", 4, 1, seed=0)
    path = save_index(tmp_path / "idx.npy", [1, 2, 3, 0])
    base = DataConfig(root=str(root), captions_per_image=1, noise_index=str(path))
    with pytest.raises(DataFormatError, match=r"idx\.npy: .*4 entries.*data\.noise_format"):
        build_train_dataset(base, "train", None)
    for fmt in ("ncr", "decl"):
        config = DataConfig(**{**base.__dict__, "noise_format": fmt})
        ds = build_train_dataset(config, "train", None)
        assert ds.txt_to_img.tolist() == [1, 2, 3, 0] and ds.noise.format == fmt


def test_karpathy_training_split_takes_the_index_too(tmp_path):
    """The Karpathy JSON's training captions are re-paired on the same code path."""
    images = []
    for i, split in enumerate(["train", "train", "train", "val"]):
        sents = [
            {"tokens": ["a", "dog", str(j)], "raw": f"A dog {j}.", "imgid": i, "sentid": 10 * i + j}
            for j in range(2)
        ]
        images.append(
            {
                "filename": f"{i}.jpg",
                "imgid": i,
                "split": split,
                "sentids": [s["sentid"] for s in sents],
                "sentences": sents,
            }
        )
    path = tmp_path / "dataset_flickr30k.json"
    path.write_text(json.dumps({"images": images, "dataset": "flickr30k"}))
    index = save_index(tmp_path / "noise.npy", [2, 0, 1])  # DECL: 3 training images
    config = DataConfig(
        root=str(tmp_path),
        format="karpathy",
        karpathy_json=str(path),
        captions_per_image=2,
        noise_index=str(index),
    )
    ds = build_train_dataset(config, "train", None)
    assert ds.txt_to_img.tolist() == [2, 2, 0, 0, 1, 1]
    assert ds.original_txt_to_img.tolist() == [0, 0, 1, 1, 2, 2] and bool(ds.corrupted.all())


# -- refusals -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("entries", "pattern"),
    [
        (
            np.zeros(7, dtype=np.int64),
            r"bad\.npy: data\.noise_index has 7 entries; expected 30 \(NCR: one image per "
            r"training caption\) or 6 \(DECL: one image per training image\)",
        ),
        (
            np.r_[np.zeros(12, dtype=np.int64), 6, np.zeros(17, dtype=np.int64)],
            r"bad\.npy: data\.noise_index entry 12 is 6; expected an image index in \[0, 6\)",
        ),
        (np.r_[0, 1, -1, 0, 0, 0], r"bad\.npy: data\.noise_index entry 2 is -1"),
        (np.zeros(30, dtype=np.float32), r"bad\.npy: .*integers .*got dtype float32"),
        (np.zeros(6, dtype=bool), r"bad\.npy: .*integers .*got dtype bool"),
        (np.zeros((6, 5), dtype=np.int64), r"bad\.npy: .*1-D array .*shape \(6, 5\)"),
    ],
    ids=["length", "too-large", "negative", "float", "bool", "2-D"],
)
def test_a_bad_index_is_refused_naming_file_and_value(tmp_path, entries, pattern):
    root = write_folder(tmp_path / "data")
    path = save_index(tmp_path / "bad.npy", entries)
    with pytest.raises(DataFormatError, match=pattern) as err:
        build_train_dataset(data_config(root, noise_index=str(path)), "train", None)
    assert "\n" not in str(err.value)


def test_other_refusals(tmp_path):
    root = write_folder(tmp_path / "data")
    path = save_index(tmp_path / "caps.npy", np.zeros(30, dtype=np.int64))
    with pytest.raises(DataFormatError, match=r"30 entries; data\.noise_format 'decl' expects 6"):
        build_train_dataset(
            data_config(root, noise_index=str(path), noise_format="decl"), "train", None
        )
    with pytest.raises(FileNotFoundError, match=r"nope\.npy: missing.*data\.noise_index"):
        missing = data_config(root, noise_index=str(tmp_path / "nope.npy"))
        build_train_dataset(missing, "train", None)
    (tmp_path / "text.npy").write_text("not numpy")
    with pytest.raises(DataFormatError, match=r"text\.npy: not a \.npy file: it begins with"):
        read_noise_index(tmp_path / "text.npy", num_captions=30, num_images=6)


def raw_config(root: Path, out: Path, **data) -> dict:
    return {
        "output_dir": str(out),
        "data": {"root": str(root), "format": "precomp", "min_count": 1, **data},
        "model": {
            "embed_dim": 16,
            "image": {"kind": "precomp", "in_dim": DIM, "pooling": "max"},
            "text": {"kind": "gru", "word_dim": 8, "bidirectional": True, "pooling": "last"},
        },
        "loss": {"name": "triplet"},
        "optim": {"name": "adam", "lr": 1e-3},
        "train": {"epochs": 1, "batch_size": 10, "seed": 0, "progress": False},
    }


@pytest.mark.parametrize(
    ("data", "pattern"),
    [
        (
            {"format": "msrvtt", "noise_index": "x.npy"},
            r"data\.noise_index: applies to data\.format precomp or karpathy .*not 'msrvtt'",
        ),
        (
            {"format": "webdataset", "shards": "s.tar", "noise_ratio": 0.2},
            r"data\.noise_ratio: applies to .*not 'webdataset'",
        ),
        ({"noise_ratio": 1.5}, r"data\.noise_ratio: expected a fraction in \[0, 1\].*1\.5"),
        ({"noise_ratio": -0.1}, r"data\.noise_ratio: expected a fraction"),
        ({"noise_seed": -1}, r"data\.noise_seed: expected an integer in \[0, 4294967295\]"),
        ({"noise_format": "bicro"}, r"data\.noise_format: expected one of auto, ncr, decl"),
        ({"noise_index": " "}, r"data\.noise_index: empty"),
        ({"noise_index": "a.npy", "noise_ratio": 0.2}, r"data\.noise_index: 'a\.npy' and "),
    ],
)
def test_config_refusals_name_the_key(tmp_path, data, pattern):
    with pytest.raises(ConfigError, match=pattern):
        config_from_dict(raw_config(tmp_path, tmp_path / "run", **data), source="c.toml")


def test_a_resumed_run_keeps_its_noise(tmp_path):
    """The noise keys are frozen across a resume: another seed is another training set."""
    current = config_from_dict(raw_config(tmp_path, tmp_path / "run", noise_ratio=0.2)).to_dict()
    other = copy.deepcopy(current)
    other["data"]["noise_seed"] = 1
    with pytest.raises(RunFolderError, match=r"data\.noise_seed: 0 -> 1"):
        check_resume_config(current, other, "last.pt")


# -- generation -----------------------------------------------------------------------------------


def ncr_released_draw(seed: int, n_captions: int, cpi: int, m: int) -> np.ndarray:
    """NCR's data.py (train split), with its np.random.seed(opt.seed) in run.py."""
    np.random.seed(seed)
    t2i_index = np.arange(0, n_captions) // cpi
    idx = np.arange(n_captions)
    np.random.shuffle(idx)
    shuffle_index = t2i_index[idx[:m]]
    np.random.shuffle(shuffle_index)
    t2i_index[idx[:m]] = shuffle_index
    return t2i_index


def decl_released_draw(seed: int, n_img: int, m: int) -> np.ndarray:
    """DECL's data.py (train split)."""
    np.random.seed(seed)
    noisy_inx = np.arange(n_img)
    inx = np.arange(n_img)
    np.random.shuffle(inx)
    chosen = inx[0:m]
    shuffled = np.array(chosen)
    np.random.shuffle(shuffled)
    noisy_inx[chosen] = shuffled
    return noisy_inx


@pytest.mark.parametrize(
    ("n_img", "cpi", "ratio", "m"),
    [(20, 5, 0.2, 20), (20, 5, 0.29, 29), (40, 5, 0.5, 100), (7, 3, 1.0, 21), (20, 5, 0.0, 0)],
)
def test_ncr_generation_is_the_released_draw_with_an_exact_count(n_img, cpi, ratio, m):
    """floor(ratio * captions) captions are re-drawn (0.29 x 100 = 29: the decimal ratio, where
    float int() gives 28), their images shuffled among them exactly as NCR's loader does; the
    corrupted ones are those the shuffle moved to another image."""
    original = torch.arange(n_img * cpi) // cpi
    noise = generate_noise_index(original, n_img, ratio=ratio, seed=11)
    released = ncr_released_draw(11, n_img * cpi, cpi, m)
    np.testing.assert_array_equal(noise.index, released)
    assert noise.index.dtype == np.int64 and noise.format == "ncr"
    ds = apply_noise_index(_Pairs(original, n_img), noise)
    record = noise_summary(ds)
    moved = int((released != original.numpy()).sum())
    assert record["selected"] == m and record["corrupted_captions"] == moved
    assert record["corrupted_fraction"] == moved / (n_img * cpi)
    # the image multiset is kept (captions swap images), and at most m captions moved
    assert sorted(noise.index.tolist()) == sorted(original.tolist()) and moved <= m
    if m >= 20:
        assert moved >= m - 3  # a few at most draw their own image back


@pytest.mark.parametrize(("n_img", "ratio", "m"), [(20, 0.2, 4), (100, 0.29, 29), (9, 1.0, 9)])
def test_decl_generation_is_the_released_draw(n_img, ratio, m):
    original = torch.arange(n_img * 2) // 2
    noise = generate_noise_index(original, n_img, ratio=ratio, seed=4, noise_format="decl")
    np.testing.assert_array_equal(noise.index, decl_released_draw(4, n_img, m))
    assert sorted(noise.index.tolist()) == list(range(n_img))  # a permutation of the images
    record = noise_summary(apply_noise_index(_Pairs(original, n_img), noise))
    assert record["selected"] == m
    assert record["corrupted_captions"] == 2 * int((noise.index != np.arange(n_img)).sum())


def test_generation_is_seeded():
    original = torch.arange(200) // 5
    draw = [generate_noise_index(original, 40, ratio=0.3, seed=s).index for s in (3, 3, 4)]
    np.testing.assert_array_equal(draw[0], draw[1])
    assert not np.array_equal(draw[0], draw[2])
    for bad in (-1, 2**32, 1.5, True):
        with pytest.raises(ValueError, match="noise seed"):
            generate_noise_index(original, 40, ratio=0.3, seed=bad)
    with pytest.raises(ValueError, match="noise ratio"):
        generate_noise_index(original, 40, ratio=1.2, seed=0)


class _Pairs:
    """The smallest thing apply_noise_index re-pairs: txt_to_img and the image count."""

    def __init__(self, txt_to_img: torch.Tensor, num_images: int) -> None:
        self.txt_to_img = txt_to_img
        self.num_images = num_images


def test_decl_record_round_trips_through_the_run_files(tmp_path):
    """save_noise_record writes the index in its released layout; read back as
    data.noise_index it gives the identical pairing. A clean set writes nothing."""
    root = write_folder(tmp_path / "data")
    noisy = build_train_dataset(
        data_config(root, noise_ratio=0.5, noise_seed=2, noise_format="decl"), "train", None
    )
    assert noisy.noise.format == "decl" and len(noisy.noise.index) == N_IMG
    written = save_noise_record(noisy, tmp_path / "run")
    assert [p.name for p in written] == ["noise_index.npy", "noise.json"]
    again = build_train_dataset(
        data_config(root, noise_index=str(written[0]), noise_format="decl"), "train", None
    )
    assert torch.equal(again.txt_to_img, noisy.txt_to_img)
    assert torch.equal(again.corrupted, noisy.corrupted)
    clean = build_train_dataset(data_config(root), "train", None)
    assert clean.noise is None and not bool(clean.corrupted.any())
    assert save_noise_record(clean, tmp_path / "clean") == []
    assert not (tmp_path / "clean").exists()


# -- a training run: the run folder's record, reuse, clean validation and evaluation --------------


@pytest.fixture(scope="module")
def noisy_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("noisy")
    root = write_folder(tmp / "data")
    config = config_from_dict(raw_config(root, tmp / "run", noise_ratio=0.4, noise_seed=5))
    trainer = Trainer(config)
    trainer.fit()
    return root, tmp / "run", trainer


def test_the_run_folder_records_the_applied_noise(noisy_run):
    root, run, trainer = noisy_run
    train = trainer.train_set
    record = json.loads((run / "noise.json").read_text())
    moved = int(train.corrupted.sum())
    assert record == {
        "format": "ncr",
        "ratio": 0.4,
        "seed": 5,
        "source": None,
        "captions": 30,
        "images": 6,
        "selected": 12,
        "corrupted_captions": moved,
        "corrupted_fraction": moved / 30,
        "corrupted_images": len(set(train.original_txt_to_img[train.corrupted].tolist())),
    }
    assert moved >= 9
    np.testing.assert_array_equal(np.load(run / "noise_index.npy"), train.txt_to_img.numpy())
    np.testing.assert_array_equal(
        np.load(run / "noise_index.npy"), ncr_released_draw(5, 30, CPI, 12)
    )
    # reused as data.noise_index it gives the identical pairing
    reused = build_train_dataset(
        data_config(root, noise_index=str(run / "noise_index.npy")), "train", None
    )
    assert torch.equal(reused.txt_to_img, train.txt_to_img)
    assert torch.equal(reused.corrupted, train.corrupted)
    assert torch.equal(reused.original_txt_to_img, torch.arange(30) // CPI)


def test_validation_and_evaluation_read_the_clean_pairs(noisy_run):
    """The dev split (a copy of train here, so the index would fit it) validates clean, and
    `vlret eval`'s rebuild of the test split (also a copy) scores the clean pairs."""
    root, run, trainer = noisy_run
    clean = torch.arange(30) // CPI
    assert torch.equal(trainer.dev_set.txt_to_img, clean)
    assert getattr(trainer.dev_set, "noise", None) is None
    model, stored, encoder = load_trained_model(run / "last.pt")
    assert stored.data.noise_ratio == 0.4  # the stored config keeps its noise keys
    test = open_dataset(eval_data_config(stored.data, root), "test", encoder=encoder)
    assert torch.equal(test.txt_to_img, clean) and getattr(test, "noise", None) is None
    img, txt = encode_dataset(model, test)
    want = retrieval_metrics(img, txt, clean).as_dict()
    noisy = retrieval_metrics(img, txt, trainer.train_set.txt_to_img).as_dict()
    assert want != noisy  # the two pairings score differently, so the check below can fail
    got = run_evaluation(run / "last.pt", data=root, split="test", protocol="f30k", device="cpu")
    for key, value in want.items():
        assert got.metrics.as_dict()[key] == pytest.approx(value, abs=1e-9), key


def test_a_resume_refuses_a_replaced_index_file(tmp_path):
    """A run resumed in its folder on a data.noise_index file whose content changed would train
    on other pairs than its checkpoint: refused, naming the recorded file."""
    root = write_folder(tmp_path / "data")
    path = save_index(tmp_path / "noise.npy", [0, 2, 1, 3, 4, 5])  # DECL: images 1, 2 swap
    config = config_from_dict(raw_config(root, tmp_path / "run", noise_index=str(path)))
    Trainer(config).fit()
    recorded = np.load(tmp_path / "run" / "noise_index.npy")
    np.testing.assert_array_equal(recorded, [0, 2, 1, 3, 4, 5])
    save_index(path, [0, 1, 2, 4, 3, 5])
    with pytest.raises(RunFolderError, match=r"run/noise_index\.npy: the run was trained with"):
        Trainer(config, resume=tmp_path / "run" / "last.pt")  # with the other checks
    np.testing.assert_array_equal(np.load(tmp_path / "run" / "noise_index.npy"), recorded)
    save_index(path, [0, 2, 1, 3, 4, 5])  # the same pairs again: the resume goes on
    Trainer(config, resume=tmp_path / "run" / "last.pt").fit()
