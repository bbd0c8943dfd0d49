"""AOQ's offline negatives: block-wise mining against a full stable sort, the .npz round trip and
its checks, the loader's released draw, and `vlret mine-negatives` end to end."""

from __future__ import annotations

import sys
import warnings
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import torch.nn.functional as F
import yaml

from train_helpers import tiny_data, tiny_raw
from vlret.cli import main
from vlret.data.offline_negatives import (
    OfflineNegatives,
    load_offline_negatives,
    split_fingerprint,
)
from vlret.run import mining
from vlret.run.mining import mine_blocks, mine_embeddings, top_k


def naive_mine(sim: np.ndarray, t2img: list[int], k: int):
    """Full sort of every row and column (score descending, index ascending), own excluded."""
    n_img, n_txt = sim.shape
    i2t = [
        sorted((j for j in range(n_txt) if t2img[j] != i), key=lambda j: (-sim[i, j], j))[:k]
        for i in range(n_img)
    ]
    t2i = [
        sorted((i for i in range(n_img) if t2img[j] != i), key=lambda i: (-sim[i, j], i))[:k]
        for j in range(n_txt)
    ]
    return np.array(i2t), np.array(t2i)


@pytest.mark.parametrize("block_size", [1, 4, 7, 1000])
@pytest.mark.parametrize("seed", range(3))
def test_mining_equals_a_full_sort_with_ties_lower_index_first(seed, block_size):
    g = torch.Generator().manual_seed(seed)
    # small integer embeddings: integer scores, so many exact ties at every rank
    img = torch.randint(-2, 3, (11, 3), generator=g).float()
    txt = torch.randint(-2, 3, (33, 3), generator=g).float()
    t2img = torch.arange(11).repeat_interleave(3)[torch.randperm(33, generator=g)]
    k = 5
    mined = mine_embeddings(img, txt, t2img, k=k, block_size=block_size)
    sim = (img @ txt.T).numpy()
    want_i2t, want_t2i = naive_mine(sim, t2img.tolist(), k)
    np.testing.assert_array_equal(mined.i2t, want_i2t)
    np.testing.assert_array_equal(mined.t2i, want_t2i)
    np.testing.assert_array_equal(mined.i2t_scores, np.take_along_axis(sim, want_i2t, 1))
    np.testing.assert_array_equal(mined.t2i_scores, np.take_along_axis(sim.T, want_t2i, 1))
    assert not (t2img.numpy()[mined.i2t] == np.arange(11)[:, None]).any()
    assert not (mined.t2i == t2img.numpy()[:, None]).any()
    mined.check()  # its own consistency checks pass


def test_top_k_orders_ties_by_id_and_ignores_padding():
    values = torch.tensor([[1.0, 3.0, 3.0, 2.0, 3.0], [0.0, float("-inf"), 5.0, 5.0, 1.0]])
    ids = torch.tensor([[9, 8, 7, 6, 5], [4, 3, 2, 1, 0]])
    v, got = top_k(values, 3, ids)
    assert got.tolist() == [[5, 7, 8], [1, 2, 0]]
    assert v.tolist() == [[3.0, 3.0, 3.0], [5.0, 5.0, 1.0]]
    with pytest.raises(ValueError, match="NaN"):
        top_k(torch.tensor([[0.0, float("nan"), 1.0]]), 1)


def test_k_larger_than_the_gallery_minus_the_positives_is_one_line():
    img, txt = torch.randn(4, 3), torch.randn(12, 3)
    t2img = torch.arange(4).repeat_interleave(3)
    with pytest.raises(ValueError, match=r"k: 4 is larger .* 3 images per caption \(4 images"):
        mine_embeddings(img, txt, t2img, k=4)
    mine_embeddings(img, txt, t2img, k=3)
    t2img = torch.tensor([0] * 10 + [1, 2])  # image 0 owns 10 of 12 captions
    with pytest.raises(ValueError, match=r"2 captions per image \(12 captions, up to 10 its"):
        mine_embeddings(img, txt, t2img, k=3)


def fast_naive(sim: np.ndarray, t2img: np.ndarray, k: int):
    """naive_mine by np.lexsort (score descending, index ascending), own excluded, float64."""
    own = t2img[None, :] == np.arange(sim.shape[0])[:, None]

    def rank(s, excluded):  # keys: excluded last, then score descending, then index
        ids = np.broadcast_to(np.arange(s.shape[1]), s.shape)
        return np.lexsort((ids, -s.astype(np.float64), excluded), axis=-1)[:, :k]

    return rank(sim, own), rank(sim.T, own.T)


def integer_world(seed, n_img, cpi, dim=4, lo=-2, hi=3):
    """Integer embeddings: exact float32 scores with many ties, whatever the GEMM's blocking."""
    g = torch.Generator().manual_seed(seed)
    img = torch.randint(lo, hi, (n_img, dim), generator=g).float()
    txt = torch.randint(lo, hi, (n_img * cpi, dim), generator=g).float()
    t2img = torch.arange(n_img).repeat_interleave(cpi)[torch.randperm(n_img * cpi, generator=g)]
    return img, txt, t2img


def assert_exact(mined, img, txt, t2img, k):
    sim = (img.double() @ txt.double().T).numpy()
    want_i2t, want_t2i = fast_naive(sim, t2img.numpy(), k)
    np.testing.assert_array_equal(mined.i2t, want_i2t)
    np.testing.assert_array_equal(mined.t2i, want_t2i)
    np.testing.assert_array_equal(mined.i2t_scores, np.take_along_axis(sim, want_i2t, 1))
    np.testing.assert_array_equal(mined.t2i_scores, np.take_along_axis(sim.T, want_t2i, 1))


@pytest.mark.parametrize("workers", [1, 2, 3])
def test_sampled_thresholds_and_guessed_floors_are_exact(workers):
    # k = 70 of 400 images: rows are thresholded from a strided sample (step 2); the first of
    # 10 blocks gives each image a guessed floor; heavy ties at every threshold
    img, txt, t2img = integer_world(0, 400, 3, dim=5)
    mined = mine_embeddings(img, txt, t2img, k=70, block_size=128, workers=workers)
    assert_exact(mined, img, txt, t2img, 70)
    mined.check()


NO_BAR = SimpleNamespace(update=lambda n: None)


def test_large_galleries_get_smaller_blocks(monkeypatch):
    # at most 200 scores per block: 4 captions of 50 images, no guess (too few per block)
    monkeypatch.setattr(mining, "_BLOCK_ENTRIES", 200)
    img, txt, t2img = integer_world(5, 50, 2)
    assert_exact(mine_embeddings(img, txt, t2img, k=6, workers=2), img, txt, t2img, 6)


def spy(monkeypatch, name):
    calls = []
    real = getattr(mining, name)

    def wrapped(*args, **kwargs):
        calls.append(args[0].shape)
        return real(*args, **kwargs)

    monkeypatch.setattr(mining, name, wrapped)
    return calls


def test_a_too_high_row_threshold_or_image_guess_is_redone_exactly(monkeypatch):
    img, txt, t2img = integer_world(1, 300, 4, dim=6, lo=-5, hi=6)
    # thresholds that leave about 0.4 k per row and 0.2 k per image: most must be redone
    monkeypatch.setattr(mining, "_ROW_SLACK", 0.4)
    monkeypatch.setattr(mining, "_IMAGE_SLACK", 0.2)
    calls = spy(monkeypatch, "_exact_rows")
    mined = mine_embeddings(img, txt, t2img, k=100, block_size=100, workers=2)
    assert_exact(mined, img, txt, t2img, 100)
    assert any(shape[1] == 300 for shape in calls)  # caption rows redone
    assert any(shape[1] == 1200 for shape in calls)  # images rescored over every caption


def test_blocks_whose_entries_all_fall_below_the_image_floors():
    # captions 0:8 score 100 + j with every image, the rest score below 10: once the lists hold
    # the first block's captions, no later entry reaches an image's floor
    n_img, n_txt, k = 5, 40, 3
    t2img = torch.arange(n_txt) % n_img
    sim = torch.randint(0, 10, (n_img, n_txt), generator=torch.Generator().manual_seed(0))
    sim = sim.float()
    sim[:, :8] = 100 + torch.arange(8.0)
    mined = mine_blocks(
        lambda t0, t1: sim[:, t0:t1].T.clone(), n_images=n_img, txt_to_img=t2img, k=k, block_size=8
    )
    want_i2t, want_t2i = fast_naive(sim.numpy(), t2img.numpy(), k)
    np.testing.assert_array_equal(mined.i2t, want_i2t)
    np.testing.assert_array_equal(mined.t2i, want_t2i)
    assert (mined.i2t < 8).all()


@pytest.mark.parametrize("workers", [1, 2])
def test_k_equal_to_the_gallery_minus_the_positives_with_every_score_tied(workers):
    # every score equal: the lists are the other images / captions in index order
    n_img, cpi = 9, 2
    t2img = torch.arange(n_img).repeat_interleave(cpi)
    img, txt = torch.ones(n_img, 3), torch.ones(n_img * cpi, 3)
    mined = mine_embeddings(img, txt, t2img, k=n_img - 1, block_size=4, workers=workers)
    for j, row in enumerate(mined.t2i):
        assert row.tolist() == [i for i in range(n_img) if i != t2img[j]]
    # 20 images, 10 captions on images 0-4: k = 8 leaves images 0-4 exactly their other captions
    t2img = torch.arange(5).repeat_interleave(2)
    img, txt = torch.ones(20, 3), torch.ones(10, 3)
    mined = mine_embeddings(img, txt, t2img, k=8, block_size=3, workers=workers)
    for i, row in enumerate(mined.i2t):
        assert row.tolist() == [j for j in range(10) if t2img[j] != i][:8]
    assert (mined.i2t_scores == 3.0).all()


def test_negative_zero_ties_with_zero_and_infinities_are_ordered():
    # the keys must order -0.0 as 0.0 (ties by index) and keep +-inf in place
    t2img = torch.tensor([0, 1, 2, 3])
    sim = torch.tensor(
        [
            [9.0, 0.0, -0.0, float("inf")],
            [-0.0, 7.0, float("-inf"), 0.0],
            [0.0, -0.0, 5.0, -1.0],
            [float("-inf"), 2.0, -0.0, 1.0],
        ]
    )
    for device_path in (False, True):
        if device_path:
            mined = mining._mine_on_device(
                lambda t0, t1: sim[:, t0:t1].T, 4, t2img, 3, 2, torch.device("cpu"), NO_BAR
            )
        else:
            mined = mine_blocks(
                lambda t0, t1: sim[:, t0:t1].T.clone(),
                n_images=4,
                txt_to_img=t2img,
                k=3,
                block_size=2,
            )
        want_i2t, want_t2i = fast_naive(sim.numpy(), t2img.numpy(), 3)
        np.testing.assert_array_equal(mined.i2t, want_i2t)
        np.testing.assert_array_equal(mined.t2i, want_t2i)
        assert mined.i2t[1].tolist() == [0, 3, 2] and mined.t2i[1].tolist() == [3, 0, 2]


def test_the_accelerator_path_equals_the_cpu_path(capsys, monkeypatch):
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)  # bars draw on a terminal only
    img, txt, t2img = integer_world(2, 50, 3)
    cpu = mine_embeddings(img, txt, t2img, k=7, block_size=16, progress=True)
    assert "150/150" in capsys.readouterr().err  # the bar counts captions
    dev = mining._mine_on_device(
        lambda t0, t1: txt[t0:t1] @ img.T, 50, t2img, 7, 16, torch.device("cpu"), NO_BAR
    )
    for name in ("i2t", "t2i", "i2t_scores", "t2i_scores"):
        np.testing.assert_array_equal(getattr(dev, name), getattr(cpu, name))


def test_nan_scores_and_bad_workers_are_refused():
    img, txt, t2img = integer_world(3, 6, 2)
    img[2, 1] = float("nan")
    with pytest.raises(ValueError, match="NaN"):
        mine_embeddings(img, txt, t2img, k=2)
    with pytest.raises(ValueError, match="NaN"):
        mine_blocks(lambda t0, t1: txt[t0:t1] @ img.T, n_images=6, txt_to_img=t2img, k=2)
    with pytest.raises(ValueError, match="workers: expected a positive integer, got 0"):
        mine_embeddings(img, txt, t2img, k=2, workers=0)


def test_huge_embeddings_are_checked_block_by_block():
    # every product overflows to +inf: allowed, tied, so in index order
    img, txt, t2img = integer_world(4, 8, 2, lo=1, hi=3)
    mined = mine_embeddings(img * 1e20, txt * 1e20, t2img, k=3)
    assert np.isposinf(mined.i2t_scores).all() and np.isposinf(mined.t2i_scores).all()
    assert mined.t2i[0].tolist() == [i for i in range(8) if i != t2img[0]][:3]
    # +inf and -inf partial sums: NaN scores, caught although the embeddings are finite
    img, txt = torch.full((4, 2), 1e20), torch.tensor([[1e20, -1e20]]).repeat(4, 1)
    with pytest.raises(ValueError, match="NaN"):
        mine_embeddings(img, txt, torch.arange(4), k=2)


def small_file(tmp_path, n_img=6, cpi=5, k=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    img, txt = torch.randn(n_img, 8, generator=g), torch.randn(n_img * cpi, 8, generator=g)
    mined = mine_embeddings(img, txt, torch.arange(n_img).repeat_interleave(cpi), k=k)
    mined = OfflineNegatives(
        mined.i2t,
        mined.t2i,
        mined.i2t_scores,
        mined.t2i_scores,
        mined.txt_to_img,
        {**mined.header, "checkpoint": "x.pt", "split": "train"},
    )
    return mined, mined.save(tmp_path / "neg.npz")


def test_file_round_trips_and_is_refused_for_another_split(tmp_path):
    mined, path = small_file(tmp_path)
    back = load_offline_negatives(path, num_images=6, num_captions=30)
    for name in ("i2t", "t2i", "i2t_scores", "t2i_scores", "txt_to_img"):
        np.testing.assert_array_equal(getattr(back, name), getattr(mined, name))
        assert getattr(back, name).dtype == getattr(mined, name).dtype
    assert back.header["k"] == 4 and back.header["n_captions"] == 30
    assert back.header["split"] == "train" and back.header["format"] == "vlret-offline-negatives"
    assert back.i2t.dtype == np.int64 and back.t2i.shape == (30, 4)
    with pytest.raises(
        ValueError,
        match=rf"{path}: mined on 6 images x 30 captions; the train "
        r"split has 7 images x 35 captions",
    ):
        load_offline_negatives(path, num_images=7, num_captions=35)
    shuffled = mined.txt_to_img.copy()
    shuffled[[3, 7]] = shuffled[[7, 3]]
    with pytest.raises(
        ValueError,
        match=r"mined with caption 3 on image 0; the train split "
        r"pairs it with image 1",
    ):
        load_offline_negatives(path, num_images=6, num_captions=30, txt_to_img=shuffled)


def test_broken_files_are_one_line_naming_the_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="missing.npz: missing"):
        load_offline_negatives(tmp_path / "missing.npz")
    (tmp_path / "text.npz").write_text("hello")
    with pytest.raises(ValueError, match="text.npz: not a mined-negatives .npz"):
        load_offline_negatives(tmp_path / "text.npz")
    mined, path = small_file(tmp_path)
    arrays = {n: getattr(mined, n) for n in ("i2t", "t2i", "i2t_scores", "t2i_scores")}
    np.savez(tmp_path / "partial.npz", **arrays)
    with pytest.raises(ValueError, match="partial.npz: missing txt_to_img, header"):
        load_offline_negatives(tmp_path / "partial.npz")
    bad = mined.i2t.copy()
    bad[2, 0] = 11  # caption 11 is image 2's own
    OfflineNegatives(
        bad, mined.t2i, mined.i2t_scores, mined.t2i_scores, mined.txt_to_img, mined.header
    ).save(tmp_path / "own.npz")
    with pytest.raises(ValueError, match="own.npz: i2t: image 2 lists its own caption 11"):
        load_offline_negatives(tmp_path / "own.npz")


def released_draw(i2t, t2i, index, rng, candidates):
    """dataAOQ.py's rule for 5 captions per image, written as the release does."""
    n = int(rng.integers(candidates))
    capindex = i2t[index // 5][n]
    imgindex = t2i[index][n // 5]
    capindexhn2 = imgindex * 5 + int(rng.integers(5))
    return capindex, imgindex, capindexhn2, capindex // 5


@pytest.mark.parametrize("candidates", [None, 3, 1])
def test_draw_is_the_released_rule(tmp_path, candidates):
    mined, path = small_file(tmp_path, n_img=9, k=7)
    sampler = load_offline_negatives(path).sampler(candidates=candidates)
    ours, theirs = np.random.default_rng(5), np.random.default_rng(5)
    for index in list(range(45)) * 3:
        got = sampler.draw(index, ours)
        want = released_draw(mined.i2t, mined.t2i, index, theirs, candidates or 7)
        assert tuple(got) == tuple(int(w) for w in want)
        assert got.caption // 5 != index // 5 and got.image != index // 5
    with pytest.raises(ValueError, match=r"candidates: expected an integer in \[1, 7\]"):
        mined.sampler(candidates=8)
    with pytest.raises(ValueError, match=r"index: expected a caption in \[0, 45\)"):
        sampler.draw(45, ours)


def test_draw_needs_the_divisor_when_images_have_different_caption_counts(tmp_path):
    img, txt = torch.randn(4, 3), torch.randn(9, 3)
    t2img = torch.tensor([0, 0, 0, 1, 1, 2, 2, 3, 3])
    mined = mine_embeddings(img, txt, t2img, k=2)
    with pytest.raises(ValueError, match="captions_per_image: .* 2 to 3 captions"):
        mined.sampler()
    draw = mined.sampler(captions_per_image=2).draw(4, np.random.default_rng(0))
    assert int(t2img[draw.image_caption]) == draw.image and draw.caption_image == int(
        t2img[draw.caption]
    )


# ----------------------------------------------------------------------------- the command


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    root = tmp_path_factory.mktemp("mine")
    data = tiny_data(root / "data")
    cfg = root / "run.yaml"
    cfg.write_text(yaml.safe_dump(tiny_raw(data, root / "run")))
    assert main(["train", str(cfg), "--set", "train.epochs=1"]) == 0
    return data, root / "run" / "last.pt"


def test_cli_mines_the_checkpoints_own_scores(trained, tmp_path, capsys):
    from vlret.data import PrecompDataset
    from vlret.eval import TwoTowerScorer
    from vlret.run.builders import load_trained_model

    data, ckpt = trained
    out = tmp_path / "sub" / "neg.npz"
    args = ["mine-negatives", str(ckpt), "--data", str(data), "--out", str(out), "--k", "4"]
    assert main([*args, "--no-progress", "--batch-size", "3"]) == 0
    assert str(out) in capsys.readouterr().out
    model, run, encoder = load_trained_model(ckpt)
    ds = PrecompDataset(data, "train", encoder=encoder)
    mined = load_offline_negatives(
        out, num_images=ds.num_images, num_captions=ds.num_captions, txt_to_img=ds.txt_to_img
    )
    assert mined.header["checkpoint"] == str(ckpt) and mined.header["split"] == "train"
    # the data it was mined on: the split's ids, captions and pairs, as training checks it
    assert mined.header["fingerprint"] == split_fingerprint(ds)
    assert split_fingerprint(ds).startswith("sha256:") and len(split_fingerprint(ds)) == 71
    assert mined.header["scoring"] == "cosine" and mined.k == 4
    # the oracle: cosine of the model's embeddings in float64, every pair
    img, txt = TwoTowerScorer(model, batch_size=64).embeddings(ds)
    sim = F.normalize(img.double(), dim=1) @ F.normalize(txt.double(), dim=1).T
    own = torch.zeros_like(sim, dtype=torch.bool)
    own[ds.txt_to_img, torch.arange(ds.num_captions)] = True
    sim = sim.masked_fill(own, float("-inf")).numpy()
    # float32 block products vs float64: unit vectors of width 16, |error| < 1e-6
    tol = 1e-6
    for scores, ids, full in (
        (mined.i2t_scores, mined.i2t, sim),
        (mined.t2i_scores, mined.t2i, sim.T),
    ):
        np.testing.assert_allclose(scores, np.take_along_axis(full, ids, 1), atol=tol, rtol=0)
        assert (np.diff(scores, axis=1) <= 0).all()
        rest = full.copy()
        np.put_along_axis(rest, ids, -np.inf, 1)
        assert (rest.max(1) <= scores[:, -1] + tol).all()  # nothing left out beats the K-th


def test_cli_errors_are_one_line(trained, tmp_path, capsys):
    data, ckpt = trained
    out = str(tmp_path / "n.npz")
    cases = [
        ([str(tmp_path / "no.pt"), "--data", str(data)], "no.pt: missing"),
        ([str(ckpt), "--data", str(tmp_path / "nodata")], "nodata: missing"),
        ([str(ckpt), "--data", str(data), "--k", "8"], "k: 8 is larger than the gallery"),
    ]
    for args, words in cases:
        assert main(["mine-negatives", *args, "--out", out, "--no-progress"]) == 2
        err = capsys.readouterr().err
        assert err.startswith("vlret mine-negatives: ") and words in err, err
        assert err.count("\n") == 1
    assert not (tmp_path / "n.npz").exists()


def test_a_pair_scoring_checkpoint_mines_with_the_evaluations_pair_scores(tmp_path):
    from pathlib import Path

    from vlret.data.formats import open_dataset
    from vlret.eval import PairModelScorer, score_matrix
    from vlret.run.builders import load_trained_model
    from vlret.run.eval_data import eval_data_config
    from vlret.run.mine import mine_checkpoint

    fixtures = Path(__file__).parents[1] / "fixtures" / "prev_release"
    mined = mine_checkpoint(
        fixtures / "scan.pt", data=fixtures / "data", k=3, device="cpu", block_size=7
    )
    model, run, encoder = load_trained_model(fixtures / "scan.pt")
    ds = open_dataset(eval_data_config(run.data, fixtures / "data"), "train", encoder=encoder)
    regions, texts = PairModelScorer(model).tokens(ds)
    sim = score_matrix(model, regions, texts, device="cpu").numpy()
    i2t, t2i = naive_mine(sim, ds.txt_to_img.tolist(), 3)
    np.testing.assert_array_equal(mined.i2t, i2t)
    np.testing.assert_array_equal(mined.t2i, t2i)
    assert mined.header["scoring"] == "pair scores"


def test_a_noisy_runs_training_split_is_mined_on_its_noisy_pairs(tmp_path, capsys):
    """A run trained on noisy pairs (``data.noise_ratio``) mines its training split with the
    same pairing: the file's ``txt_to_img`` is the run's recorded noisy index, an item's own
    (noisy) positives are never listed, and AOQ's loader check accepts it."""
    from vlret.data.noisy import read_noise_index
    from vlret.run.builders import build_train_dataset, load_trained_model

    data = tiny_data(tmp_path / "data")
    cfg = tmp_path / "run.yaml"
    raw = tiny_raw(data, tmp_path / "run")
    raw["data"].update(noise_ratio=0.5, noise_seed=3)
    cfg.write_text(yaml.safe_dump(raw))
    assert main(["train", str(cfg), "--set", "train.epochs=1"]) == 0
    out = tmp_path / "neg.npz"
    args = ["mine-negatives", str(tmp_path / "run" / "last.pt"), "--data", str(data)]
    assert main([*args, "--out", str(out), "--k", "3", "--no-progress"]) == 0
    capsys.readouterr()
    _, run, encoder = load_trained_model(tmp_path / "run" / "last.pt")
    noisy = build_train_dataset(run.data, "train", encoder)
    assert bool(noisy.corrupted.any())  # the run did train on moved pairs
    pairs = noisy.txt_to_img.numpy()
    recorded = read_noise_index(
        tmp_path / "run" / "noise_index.npy",
        num_captions=noisy.num_captions,
        num_images=noisy.num_images,
    )
    mined = load_offline_negatives(
        out, num_images=noisy.num_images, num_captions=noisy.num_captions, txt_to_img=pairs
    )
    np.testing.assert_array_equal(mined.txt_to_img, pairs)
    # the fingerprint is the split's data and clean pairs: the noisy training set has it too
    assert mined.header["fingerprint"] == split_fingerprint(noisy)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        mined.check_data(noisy, split="train")
    assert recorded.format == "ncr"  # one entry per caption: the image it is paired with
    np.testing.assert_array_equal(recorded.index, pairs)
    assert not (mined.t2i == pairs[:, None]).any()
    for image in range(noisy.num_images):
        assert not set(mined.i2t[image].tolist()) & set(np.flatnonzero(pairs == image).tolist())
