"""Noise-index files as numpy writes them, read by vlret and compared with ``numpy.load``.

The released loaders (XLearning-SCU/2021-NeurIPS-NCR ``NCR/data.py``, QinYang79/DECL
``data.py``) keep the pairing as a plain numpy integer array and ``np.save`` / ``np.load`` it:

* NCR: ``t2i_index = np.arange(captions) // 5`` (numpy's default integer: int64 on Linux and in
  numpy 2, int32 on Windows under numpy 1.x), a fraction of it shuffled among itself, then
  ``np.save(noise_file, t2i_index)``: one entry per training caption, caption ``k`` served with
  image ``t2i_index[k]``;
* DECL: ``noisy_inx = np.arange(images)``, a fraction of it shuffled among itself: one entry per
  training image, caption ``k`` served with image ``noisy_inx[k // 5]``.

Every file here is written by numpy itself (``numpy.save``, ``numpy.lib.format.write_array`` in
each header version, ``open_memmap``, numpy's header writers for a Fortran-order header) and
the independent reading is ``numpy.load`` plus the released loaders' serving rule.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from vlret.data import DataFormatError, PrecompDataset
from vlret.data.noisy import apply_noise_index, read_noise_index

N_IMG, CPI = 12, 5
N_CAP = N_IMG * CPI


def write_precomp(root: Path) -> Path:
    """A train split written with numpy and plain text: ``train_ims.npy``, ``train_caps.txt``."""
    root.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(3)
    np.save(root / "train_ims.npy", rng.standard_normal((N_IMG, 4)).astype(np.float32))
    lines = [f"caption {k} of image {k // CPI}" for k in range(N_CAP)]
    (root / "train_caps.txt").write_text("\n".join(lines) + "\n")
    return root


def ncr_style(seed: int, ratio: float, dtype=np.int64) -> np.ndarray:
    """NCR's per-caption pairing with a fraction re-paired, built as its loader describes it
    (caption positions shuffled, the first ``int(ratio * n)`` have their images shuffled)."""
    state = np.random.RandomState(seed)
    t2i = (np.arange(N_CAP) // CPI).astype(dtype)
    chosen = state.permutation(N_CAP)[: int(ratio * N_CAP)]
    moved = t2i[chosen].copy()
    state.shuffle(moved)
    t2i[chosen] = moved
    return t2i


def decl_style(seed: int, ratio: float) -> np.ndarray:
    """DECL's per-image pairing: image positions shuffled, the first ``int(ratio * n)`` shuffled
    among themselves."""
    state = np.random.RandomState(seed)
    index = np.arange(N_IMG)
    chosen = state.permutation(N_IMG)[: int(ratio * N_IMG)]
    moved = chosen.copy()
    state.shuffle(moved)
    index[chosen] = moved
    return index


def served_images(root: Path, path: Path) -> torch.Tensor:
    """The image each training caption is served with after vlret applies ``path``."""
    ds = PrecompDataset(root, "train")
    noise = read_noise_index(path, num_captions=ds.num_captions, num_images=ds.num_images)
    return apply_noise_index(ds, noise).txt_to_img


@pytest.mark.parametrize("dtype", [np.int64, np.int32], ids=["linux-int64", "windows-np1-int32"])
def test_an_ncr_file_is_served_as_ncrs_loader_serves_it(tmp_path, dtype):
    root = write_precomp(tmp_path / "f30k_precomp")
    path = tmp_path / "f30k_precomp_0.4.npy"
    np.save(path, ncr_style(seed=1, ratio=0.4, dtype=dtype))
    released = np.load(path)  # what NCR's loader holds as t2i_index
    noise = read_noise_index(path, num_captions=N_CAP, num_images=N_IMG)
    assert noise.format == "ncr" and noise.index.dtype == np.int64
    np.testing.assert_array_equal(noise.index, released)
    # NCR serves caption k with images[t2i_index[k]]
    assert served_images(root, path).tolist() == [int(released[k]) for k in range(N_CAP)]
    assert (released != np.arange(N_CAP) // CPI).any()  # the file does re-pair captions


def test_a_decl_file_is_served_as_decls_loader_serves_it(tmp_path):
    root = write_precomp(tmp_path / "f30k_precomp")
    path = tmp_path / "noise_inx_0.5.npy"
    np.save(path, decl_style(seed=2, ratio=0.5))
    released = np.load(path)
    noise = read_noise_index(path, num_captions=N_CAP, num_images=N_IMG)
    assert noise.format == "decl"
    np.testing.assert_array_equal(noise.index, released)
    # DECL serves caption k with images[noisy_inx[int(k / 5)]]
    assert served_images(root, path).tolist() == [int(released[int(k / CPI)]) for k in range(N_CAP)]
    assert (released != np.arange(N_IMG)).any()


WRITE_DTYPES = ["<i8", ">i8", "<i4", ">i4", "<u2", ">u8", "i1"]


@pytest.mark.parametrize("version", [(1, 0), (2, 0), (3, 0)])
@pytest.mark.parametrize("dtype", WRITE_DTYPES)
def test_every_header_version_and_byte_order_reads_as_numpy_load(tmp_path, version, dtype):
    path = tmp_path / "index.npy"
    with path.open("wb") as fh:
        np.lib.format.write_array(fh, ncr_style(seed=4, ratio=0.6).astype(dtype), version=version)
    assert np.lib.format.read_magic(path.open("rb")) == version
    loaded = np.load(path)
    assert loaded.dtype == np.dtype(dtype)  # the file keeps its byte order
    noise = read_noise_index(path, num_captions=N_CAP, num_images=N_IMG)
    assert noise.index.dtype == np.int64 and noise.index.dtype.isnative
    np.testing.assert_array_equal(noise.index, loaded.astype(np.int64))


@pytest.mark.parametrize("version", [(1, 0), (2, 0)])
def test_open_memmap_files_read_as_numpy_load(tmp_path, version):
    path = tmp_path / "memmap.npy"
    out = np.lib.format.open_memmap(path, mode="w+", dtype=">i8", shape=(N_IMG,), version=version)
    out[:] = decl_style(seed=5, ratio=1.0)
    out.flush()
    del out
    noise = read_noise_index(path, num_captions=N_CAP, num_images=N_IMG)
    np.testing.assert_array_equal(noise.index, np.load(path))


@pytest.mark.parametrize("version", [(1, 0), (2, 0)])
def test_a_fortran_order_header_reads_as_numpy_load(tmp_path, version):
    # numpy writes fortran_order False for any 1-D array; other writers may say True, which is
    # the same bytes for one dimension: written here with numpy's own header writers
    entries = ncr_style(seed=6, ratio=0.5)
    header = {"descr": "<i8", "fortran_order": True, "shape": (N_CAP,)}
    path = tmp_path / "fortran.npy"
    with path.open("wb") as fh:
        write = {(1, 0): np.lib.format.write_array_header_1_0}.get(
            version, np.lib.format.write_array_header_2_0
        )
        write(fh, header)
        fh.write(entries.astype("<i8").tobytes())
    loaded = np.load(path)
    noise = read_noise_index(path, num_captions=N_CAP, num_images=N_IMG)
    np.testing.assert_array_equal(noise.index, loaded)
    np.testing.assert_array_equal(noise.index, entries)


def test_a_two_dimensional_fortran_array_is_refused_like_any_2d_array(tmp_path):
    path = tmp_path / "2d.npy"
    np.save(path, np.asfortranarray(ncr_style(seed=7, ratio=0.5).reshape(N_IMG, CPI)))
    assert np.load(path).flags.f_contiguous  # numpy wrote fortran_order True
    with pytest.raises(DataFormatError, match=r"2d\.npy: .*1-D array .*shape \(12, 5\)"):
        read_noise_index(path, num_captions=N_CAP, num_images=N_IMG)


def test_an_object_array_saved_with_pickles_is_refused_unread(tmp_path):
    path = tmp_path / "objects.npy"
    np.save(path, np.array(list(range(N_CAP)), dtype=object), allow_pickle=True)
    with pytest.raises(DataFormatError, match=r"objects\.npy: .*integers .*dtype object"):
        read_noise_index(path, num_captions=N_CAP, num_images=N_IMG)


def test_a_file_cut_short_is_refused_before_reading(tmp_path):
    path = tmp_path / "cut.npy"
    np.save(path, ncr_style(seed=8, ratio=0.5))
    data = path.read_bytes()
    path.write_bytes(data[:-8])  # one entry short
    with pytest.raises(ValueError, match="Failed to read all data"):
        np.load(path)  # numpy refuses it too, after allocating what the header promises
    with pytest.raises(DataFormatError, match=r"cut\.npy: truncated .*480 bytes\) but 472 bytes"):
        read_noise_index(path, num_captions=N_CAP, num_images=N_IMG)
