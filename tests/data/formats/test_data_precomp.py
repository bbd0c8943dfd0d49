"""SCAN / VSE-infinity precomputed format: round trips, the two id layouts, errors, collate."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from vlret.data import (
    DataFormatError,
    PrecompDataset,
    RetrievalBatch,
    collate_retrieval,
    pad_captions,
)
from vlret.data.writers import make_tiny_precomp, tiny_captions, write_precomp
from vlret.metrics import retrieval_metrics


def _caps(n: int, seed: int = 0) -> list[str]:
    return tiny_captions(n, np.random.default_rng(seed))


def _feats(n: int, *shape: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((n, *shape)).astype(np.float32)


# ----------------------------------------------------------------------------- round trips


def test_tiny_folder_round_trip(tmp_path):
    paths = make_tiny_precomp(tmp_path, feature_shape=(3, 5))
    assert set(paths) == {"train", "dev", "test", "testall"}
    for split, n_img in {"train": 6, "dev": 2, "test": 2, "testall": 4}.items():
        ds = PrecompDataset(tmp_path, split)
        written = np.load(paths[split]["ims"])
        lines = paths[split]["caps"].read_text(encoding="utf-8").splitlines()
        assert ds.num_images == n_img and len(ds) == ds.num_captions == 5 * n_img
        assert ds.captions == lines
        assert ds.feature_shape == (3, 5)
        assert isinstance(ds.array, np.memmap)  # opened with mmap_mode="r", never read whole
        assert torch.equal(ds.txt_to_img, torch.arange(5 * n_img) // 5)
        for j in (0, 4, 5, len(ds) - 1):
            feats, cap, img, idx = ds[j]
            assert (img, idx, cap) == (j // 5, j, lines[j])
            assert feats.dtype == torch.float32
            np.testing.assert_array_equal(feats.numpy(), written[j // 5])


def test_plain_vectors_and_no_mmap(tmp_path):
    feats = _feats(3, 7)
    write_precomp(tmp_path, "test", feats, _caps(15))
    ds = PrecompDataset(tmp_path, "test", mmap=False)
    assert not isinstance(ds.array, np.memmap)
    assert ds.image(2).shape == (7,)
    np.testing.assert_array_equal(ds.image(2).numpy(), feats[2])
    assert ds.image_ids == [0, 1, 2]  # no ids file: positions


def test_region_features_keep_their_shape(tmp_path):
    feats = _feats(2, 36, 2048)  # the real bottom-up-attention shape, two images
    write_precomp(tmp_path, "dev", feats, _caps(10))
    item = PrecompDataset(tmp_path, "dev")[7]
    assert item.features.shape == (36, 2048) and item.img_index == 1


def test_max_images_keeps_first_images_and_their_captions(tmp_path):
    # The analogue of "rsum on the first 5000 dev captions" (1000 images).
    write_precomp(tmp_path, "dev", _feats(4, 3), _caps(20), ids=[7, 8, 9, 10])
    ds = PrecompDataset(tmp_path, "dev", max_images=2)
    assert (ds.num_images, len(ds), ds.image_ids) == (2, 10, [7, 8])
    assert int(ds.txt_to_img.max()) == 1


# ----------------------------------------------------------------------------- the two id layouts


def test_ids_one_per_image_and_one_per_caption_agree(tmp_path):
    image_ids = [391895, 522418, 184613]
    feats, caps = _feats(3, 4), _caps(15)
    write_precomp(tmp_path / "a", "train", feats, caps, ids=image_ids)  # COCO/F30K train layout
    per_caption = [i for i in image_ids for _ in range(5)]  # COCO testall, F30K test/dev layout
    write_precomp(tmp_path / "b", "testall", feats, caps, ids=per_caption)
    a = PrecompDataset(tmp_path / "a", "train")
    b = PrecompDataset(tmp_path / "b", "testall")
    assert a.image_ids == b.image_ids == image_ids
    assert torch.equal(a.txt_to_img, b.txt_to_img)
    assert a.has_ids_file and b.has_ids_file


def test_ids_per_caption_must_agree_within_an_image(tmp_path):
    ids = [5] * 5 + [6, 6, 6, 9, 6]
    write_precomp(tmp_path, "test", _feats(2, 4), _caps(10), ids=ids)
    with pytest.raises(DataFormatError, match=r"test_ids\.txt, line 9: id 9 differs from 6") as e:
        PrecompDataset(tmp_path, "test")
    assert e.value.line == 9 and e.value.path.name == "test_ids.txt"


def test_ids_count_must_match_a_layout(tmp_path):
    write_precomp(tmp_path, "dev", _feats(2, 4), _caps(10), ids=[1, 2, 3])
    with pytest.raises(
        DataFormatError, match=r"dev_ids\.txt: has 3 ids; expected one per caption \(10\) or one "
    ):
        PrecompDataset(tmp_path, "dev")


def test_ids_must_be_integers(tmp_path):
    write_precomp(tmp_path, "dev", _feats(2, 4), _caps(10), ids=[1, 2])
    (tmp_path / "dev_ids.txt").write_text("1\nabc\n")
    with pytest.raises(DataFormatError, match=r"dev_ids\.txt, line 2: 'abc' is not an integer"):
        PrecompDataset(tmp_path, "dev")


# ----------------------------------------------------------------------------- errors


def test_missing_files_are_named(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"train_ims\.npy: missing; expected a float32"):
        PrecompDataset(tmp_path, "train")
    np.save(tmp_path / "train_ims.npy", _feats(1, 4))
    with pytest.raises(FileNotFoundError, match=r"train_caps\.txt: missing; expected one caption"):
        PrecompDataset(tmp_path, "train")


@pytest.mark.parametrize("shape", [(6,), (2, 3, 4, 5), (0, 4)])
def test_wrong_feature_shapes(tmp_path, shape):
    np.save(tmp_path / "test_ims.npy", np.zeros(shape, dtype=np.float32))
    with pytest.raises(DataFormatError, match=r"test_ims\.npy: has shape .*expected \(N, D\)"):
        PrecompDataset(tmp_path, "test")


def test_integer_features_and_garbage_files(tmp_path):
    np.save(tmp_path / "test_ims.npy", np.zeros((2, 4), dtype=np.int64))
    with pytest.raises(DataFormatError, match=r"dtype int64; expected float32"):
        PrecompDataset(tmp_path, "test")
    (tmp_path / "test_ims.npy").write_bytes(b"not numpy at all")
    with pytest.raises(DataFormatError, match=r"test_ims\.npy: not a readable \.npy array"):
        PrecompDataset(tmp_path, "test")


def test_caption_count_that_does_not_divide(tmp_path):
    write_precomp(tmp_path, "train", _feats(3, 4), _caps(12))
    with pytest.raises(
        DataFormatError, match=r"train_caps\.txt: has 12 captions, which do not divide into .* 5"
    ):
        PrecompDataset(tmp_path, "train")


def test_caption_count_that_does_not_match_the_images(tmp_path):
    write_precomp(tmp_path, "train", _feats(3, 4), _caps(10))
    with pytest.raises(DataFormatError, match=r"10 captions for 3 images .* expected 15"):
        PrecompDataset(tmp_path, "train")


def test_empty_and_non_utf8_caption_lines(tmp_path):
    caps = _caps(10)
    caps[6] = "   "
    write_precomp(tmp_path, "dev", _feats(2, 4), caps)
    with pytest.raises(DataFormatError, match=r"dev_caps\.txt, line 7: empty caption"):
        PrecompDataset(tmp_path, "dev")
    good = "\n".join(_caps(10)).encode()
    (tmp_path / "dev_caps.txt").write_bytes(good.replace(b"\n", b"\n\xff", 1))
    with pytest.raises(DataFormatError, match=r"dev_caps\.txt, line 2: not UTF-8"):
        PrecompDataset(tmp_path, "dev")


def test_bad_arguments(tmp_path):
    with pytest.raises(ValueError, match="split must be one of"):
        PrecompDataset(tmp_path, "val")
    write_precomp(tmp_path, "dev", _feats(1, 4), _caps(5))
    with pytest.raises(ValueError, match="max_images must be a positive int"):
        PrecompDataset(tmp_path, "dev", max_images=0)
    with pytest.raises(IndexError):
        PrecompDataset(tmp_path, "dev")[5]


# ----------------------------------------------------------------------------- collate, views


class _CharEncoder:
    """Ids = character codes, pad 99: captions of different lengths."""

    pad_id = 99

    def encode(self, text: str) -> list[int]:
        return [ord(c) % 50 for c in text]


def test_pad_captions():
    ids, lengths = pad_captions([torch.tensor([5, 6, 7]), torch.tensor([8])], pad_id=0)
    assert torch.equal(ids, torch.tensor([[5, 6, 7], [8, 0, 0]]))
    assert torch.equal(lengths, torch.tensor([3, 1]))


def test_collate_pads_with_the_encoder_pad_id_and_keeps_order(tmp_path):
    caps = ["a b c d e f g", "a", "a b c", "x y", "q"]
    write_precomp(tmp_path, "test", _feats(1, 4), caps)
    ds = PrecompDataset(tmp_path, "test", encoder=_CharEncoder())
    loader = DataLoader(ds, batch_size=5, shuffle=False, collate_fn=ds.collate)
    batch = next(iter(loader))
    assert isinstance(batch, RetrievalBatch)
    assert batch.captions.shape == (5, len(caps[0]))
    assert torch.equal(batch.lengths, torch.tensor([len(c) for c in caps]))
    for row, text in enumerate(caps):
        assert batch.captions[row, : len(text)].tolist() == _CharEncoder().encode(text)
        assert (batch.captions[row, len(text) :] == 99).all()
    assert torch.equal(batch.cap_index, torch.arange(5))
    assert torch.equal(batch.img_index, torch.zeros(5, dtype=torch.long))
    assert batch.features.shape == (5, 4)
    moved = batch.to("cpu")
    assert torch.equal(moved.captions, batch.captions)


def test_collate_without_encoder_keeps_texts(tmp_path):
    write_precomp(tmp_path, "test", _feats(1, 4), _caps(5))
    ds = PrecompDataset(tmp_path, "test")
    batch = collate_retrieval([ds[1], ds[3]])
    assert batch.captions == [ds.captions[1], ds.captions[3]] and batch.lengths is None
    with pytest.raises(ValueError, match="at least one item"):
        collate_retrieval([])


def test_views_and_metrics_contract(tmp_path):
    n_img = 4
    feats = np.eye(n_img, 6, dtype=np.float32)  # image i = basis vector i
    write_precomp(tmp_path, "testall", feats, _caps(5 * n_img))
    ds = PrecompDataset(tmp_path, "testall", encoder=_CharEncoder())
    images = ds.images()
    img_feats, img_index = images.collate([images[i] for i in range(len(images))])
    assert torch.equal(img_index, torch.arange(n_img))
    texts = ds.texts()
    ids, lengths, cap_index = texts.collate([texts[j] for j in range(len(texts))])
    assert ids.shape[0] == lengths.shape[0] == 5 * n_img and torch.equal(
        cap_index, torch.arange(20)
    )
    # A perfect text "encoder": the features of the caption's own image.
    txt_emb = img_feats[ds.txt_to_img]
    metrics = retrieval_metrics(img_feats, txt_emb, ds.txt_to_img)
    assert metrics.rsum == 600.0


def test_pickling_sends_the_path_not_the_array(tmp_path):
    write_precomp(tmp_path, "train", _feats(50, 36, 64), _caps(250))
    ds = PrecompDataset(tmp_path, "train")
    ds[0]
    blob = pickle.dumps(ds)
    assert len(blob) < 50 * 36 * 64 * 4 // 10  # far smaller than the features
    clone = pickle.loads(blob)
    assert torch.equal(clone[123].features, ds[123].features)
    assert isinstance(clone.array, np.memmap)
