"""Fault cases of issue 39 on the data files vlret reads besides images: AOQ's offline
negatives (item 8), person-search annotation files and noise indices (items 12 and 13).

Each case failed before its fix: a file mined on other data was accepted (silent), a deep JSON
or a forged ``.npy`` header gave a traceback, and four inputs gave messages that named neither
the file's real problem nor the record. Offline-negative files are written by ``vlret
mine-negatives`` from a trained checkpoint; noise indices by ``numpy.save`` / numpy's header
writers; annotation files by ``json``.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import yaml

from pedes_helpers import write_pedes
from train_helpers import tiny_raw
from vlret.cli import main
from vlret.data import DataFormatError
from vlret.data.formats.pedes import CUHKPedesDataset, open_person_search, read_pedes_json
from vlret.data.formats.precomp import PrecompDataset
from vlret.data.noisy import read_noise_index
from vlret.data.offline_negatives import split_fingerprint
from vlret.data.writers import make_tiny_precomp
from vlret.run.builders import build_encoder, build_train_dataset
from vlret.run.config import config_from_dict

#: The test split has the train split's size, so a file mined on it fits the train split's sizes.
SIZES = {"train": 8, "dev": 2, "test": 8, "testall": 5}


def one_line_error(capsys) -> str:
    err = capsys.readouterr().err
    assert err.startswith("vlret train: ") and err.count("\n") == 1, err
    assert "Traceback" not in err
    return err


# -- item 8: offline negatives carry the fingerprint of the data they were mined on -------------


@pytest.fixture(scope="module")
def worlds(tmp_path_factory):
    """Two worlds of the same size (other captions and features, the same ids), a first-round
    checkpoint trained on world A, and `vlret mine-negatives` of its train and test splits."""
    root = tmp_path_factory.mktemp("worlds")
    a, b = root / "world_a", root / "world_b"
    make_tiny_precomp(a, sizes=SIZES, feature_shape=(4, 16), seed=0)
    make_tiny_precomp(b, sizes=SIZES, feature_shape=(4, 16), seed=1)
    raw = tiny_raw(a, root / "first")
    raw["train"].update(epochs=1, validate=False)
    (root / "first.yaml").write_text(yaml.safe_dump(raw))
    assert main(["train", str(root / "first.yaml")]) == 0
    mined = {}
    for split in ("train", "test"):
        mined[split] = root / f"{split}.npz"
        args = ["mine-negatives", str(root / "first" / "last.pt"), "--data", str(a)]
        args += ["--out", str(mined[split]), "--split", split, "--k", "4", "--no-progress"]
        assert main(args) == 0
    return SimpleNamespace(a=a, b=b, root=root, train=mined["train"], test=mined["test"])


def aoq_raw(data: Path, out: Path, negatives: Path) -> dict:
    raw = tiny_raw(data, out)
    raw["loss"] = {"name": "aoq"}
    raw["data"].update(offline_negatives=str(negatives), offline_candidates=4)
    raw["train"].update(epochs=1, validate=False)
    return raw


def train_aoq(data: Path, negatives: Path, tmp_path: Path) -> int:
    (tmp_path / "aoq.yaml").write_text(yaml.safe_dump(aoq_raw(data, tmp_path / "run", negatives)))
    return main(["train", str(tmp_path / "aoq.yaml")])


def forged(src: Path, dst: Path, **header) -> Path:
    """``src`` with its header's keys changed (None: removed), written by ``numpy.savez``."""
    with np.load(src, allow_pickle=False) as npz:
        arrays = {name: npz[name] for name in npz.files}
    fields = json.loads(str(arrays.pop("header")))
    for key, value in header.items():
        if value is None:
            fields.pop(key, None)
        else:
            fields[key] = value
    np.savez(dst, **arrays, header=np.array(json.dumps(fields)))
    return dst


def training_set(data: Path, negatives: Path, tmp_path: Path):
    config = config_from_dict(aoq_raw(data, tmp_path / "run", negatives))
    return build_train_dataset(config.data, "train", build_encoder(config.data))


def test_negatives_mined_on_another_world_of_the_same_size_are_refused(worlds, tmp_path, capsys):
    a, b = PrecompDataset(worlds.a, "train"), PrecompDataset(worlds.b, "train")
    assert (a.num_images, a.num_captions) == (b.num_images, b.num_captions)
    assert a.image_ids == b.image_ids  # only the captions (and features) tell them apart
    assert split_fingerprint(a) != split_fingerprint(b)
    assert train_aoq(worlds.b, worlds.train, tmp_path) == 2
    err = one_line_error(capsys)
    assert f"{worlds.train}: mined on other data than the train split" in err


def test_a_header_forged_to_say_test_is_refused_naming_the_split(worlds, tmp_path, capsys):
    path = forged(worlds.train, tmp_path / "says_test.npz", split="test")
    assert train_aoq(worlds.a, path, tmp_path) == 2
    err = one_line_error(capsys)
    assert f"{path}: mined on the 'test' split (its header); it is used for the 'train'" in err


def test_the_test_split_forged_to_say_train_is_refused(worlds, tmp_path, capsys):
    # mined on the test split (the train split's size), its header edited to say train
    path = forged(worlds.test, tmp_path / "test_says_train.npz", split="train")
    assert train_aoq(worlds.a, path, tmp_path) == 2
    assert f"{path}: mined on other data than the train split" in one_line_error(capsys)


def test_the_file_of_the_split_is_accepted_without_a_word(worlds, tmp_path):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ds = training_set(worlds.a, worlds.train, tmp_path)
    assert len(ds) == 40


def test_a_file_written_before_fingerprints_is_accepted_with_a_warning(worlds, tmp_path):
    path = forged(worlds.train, tmp_path / "old.npz", fingerprint=None)
    with pytest.warns(UserWarning, match=rf"{path}: records no fingerprint .* train split"):
        ds = training_set(worlds.a, path, tmp_path)
    assert len(ds) == 40
    # its sizes and pairs are still checked: another world of the same size passes them
    with pytest.warns(UserWarning, match="records no fingerprint"):
        training_set(worlds.b, path, tmp_path)


def test_a_forged_fingerprint_of_another_type_is_refused(worlds, tmp_path):
    path = forged(worlds.train, tmp_path / "number.npz", fingerprint=12)
    with pytest.raises(ValueError, match=r"number\.npz: mined on other data .* \(fingerprint"):
        training_set(worlds.a, path, tmp_path)


# -- item 12: tracebacks --------------------------------------------------------------------


def test_reid_raw_json_nested_100000_deep_is_one_line(tmp_path):
    path = tmp_path / "CUHK-PEDES" / "reid_raw.json"
    path.parent.mkdir()
    path.write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(DataFormatError, match=rf"{path}: JSON nested deeper than") as err:
        open_person_search("cuhk-pedes", path.parent, "train")
    assert "\n" not in str(err.value)
    # deep inside a record too
    path.write_text('[{"id": 1, "captions": ' + "[" * 100_000 + "]" * 100_000 + "}]")
    with pytest.raises(DataFormatError, match="nested deeper than Python's parser"):
        read_pedes_json(path, "cuhk-pedes")


def forged_npy(path: Path, count: int, *, version=(1, 0), data: bytes = b"\0" * 80) -> Path:
    """A ``.npy`` header (numpy's own writer) promising ``count`` int64 entries, then ``data``."""
    header = {"descr": "<i8", "fortran_order": False, "shape": (count,)}
    with path.open("wb") as fh:
        if version == (1, 0):
            np.lib.format.write_array_header_1_0(fh, header)
        else:
            np.lib.format.write_array_header_2_0(fh, header)
        fh.write(data)
    return path


@pytest.mark.parametrize("version", [(1, 0), (2, 0)])
def test_a_noise_index_header_claiming_10_12_entries_allocates_nothing(tmp_path, version):
    path = forged_npy(tmp_path / "huge.npy", 10**12, version=version)
    with pytest.raises(DataFormatError) as err:
        read_noise_index(path, num_captions=40, num_images=8)
    message = str(err.value)
    assert message.startswith(f"{path}: truncated or forged: its header promises ")
    assert "1000000000000 entries of int64 (8000000000000 bytes) but 80 bytes follow" in message
    # a header that the file's bytes honour but the split does not: the length, unread
    path = forged_npy(tmp_path / "long.npy", 41, data=np.arange(41, dtype="<i8").tobytes())
    with pytest.raises(DataFormatError, match=r"long\.npy: data\.noise_index has 41 entries"):
        read_noise_index(path, num_captions=40, num_images=8)


@pytest.mark.parametrize("mmap", [True, False])
def test_a_feature_header_promising_295_gb_allocates_nothing(tmp_path, mmap):
    # the same check guards the feature arrays, which mmap=False reads whole
    make_tiny_precomp(tmp_path, sizes={"train": 2}, feature_shape=(4, 16))
    path = tmp_path / "train_ims.npy"
    header = {"descr": "<f4", "fortran_order": False, "shape": (10**6, 36, 2048)}
    with path.open("wb") as fh:
        np.lib.format.write_array_header_1_0(fh, header)
        fh.write(b"\0" * 800)
    with pytest.raises(DataFormatError) as err:
        PrecompDataset(tmp_path, "train", mmap=mmap)
    assert str(err.value) == (
        f"{path}: truncated or forged: its header promises shape (1000000, 36, 2048) of float32 "
        "(294912000000 bytes) but 800 bytes follow it; expected float32 features"
    )


def test_a_forged_noise_index_through_vlret_train_is_one_line(worlds, tmp_path, capsys):
    path = forged_npy(tmp_path / "huge.npy", 10**12)
    raw = tiny_raw(worlds.a, tmp_path / "run")
    (tmp_path / "run.yaml").write_text(yaml.safe_dump(raw))
    assert main(["train", str(tmp_path / "run.yaml"), "--set", f"data.noise_index={path}"]) == 2
    assert f"{path}: truncated or forged" in one_line_error(capsys)


def test_a_resumed_runs_forged_noise_index_record_allocates_nothing(tmp_path):
    """The run folder's own noise_index.npy, compared with the index applied on resume: before,
    a forged header there had numpy allocate the 8 TB it promised (a MemoryError traceback)."""
    from vlret.run.folder import RunFolderError, check_noise_record

    forged_npy(tmp_path / "noise_index.npy", 10**12)
    train_set = SimpleNamespace(noise=SimpleNamespace(index=np.zeros(10, np.int64), source="x"))
    with pytest.raises(RunFolderError, match="re-pairs other captions"):
        check_noise_record(train_set, tmp_path)
    np.save(tmp_path / "noise_index.npy", np.zeros(10, np.int64))  # the same index: accepted
    check_noise_record(train_set, tmp_path)


# -- item 13: unclear errors ----------------------------------------------------------------


def _cuhk(tmp_path: Path) -> tuple[Path, list]:
    path = write_pedes(tmp_path / "CUHK-PEDES")
    return path, json.loads(path.read_text())


@pytest.mark.parametrize("person", [10**30, -(2**63) - 1, 2**63])
def test_a_person_id_past_64_bits_names_the_file_and_record(tmp_path, person):
    path, records = _cuhk(tmp_path)
    records[3]["id"] = person
    path.write_text(json.dumps(records, indent=1))
    with pytest.raises(DataFormatError) as err:
        CUHKPedesDataset(path, "train")
    message = str(err.value)
    assert message.startswith(f"{path}, line ") and "record 3 key 'id': is " in message
    assert "expected an integer person id in [-2**63, 2**63 - 1] (64 bits)" in message
    records[3]["id"] = 2**63 - 1  # the largest is read as written
    path.write_text(json.dumps(records, indent=1))
    assert 2**63 - 1 in CUHKPedesDataset(path, "train").image_identity.tolist()


def test_a_person_id_of_5000_digits_names_the_file(tmp_path):
    path, records = _cuhk(tmp_path)
    text = json.dumps(records).replace('"id": 2', '"id": ' + "2" * 5000, 1)
    path.write_text(text)
    with pytest.raises(DataFormatError, match=rf"{path}: not readable as JSON \(Exceeds the limit"):
        read_pedes_json(path, "cuhk-pedes")


def test_a_duplicate_file_path_is_named_with_its_records(tmp_path):
    path, records = _cuhk(tmp_path)
    records[2]["file_path"] = records[0]["file_path"]  # both person 1, train: one image
    path.write_text(json.dumps(records, indent=1))
    feats = tmp_path / "features"
    feats.mkdir()
    np.save(feats / "train_ims.npy", np.zeros((6, 5), np.float32))  # one row per record
    with pytest.raises(DataFormatError) as err:
        CUHKPedesDataset(path, "train", features_dir=feats)
    message = str(err.value)
    assert message.startswith(f"{feats / 'train_ims.npy'}: has 6 rows, one per record (6), but ")
    assert f"records 0 and 2 have the same file_path {records[0]['file_path']!r}" in message
    assert "expected one per image of the train split" in message and "(5, in the" in message
    np.save(feats / "train_ims.npy", np.zeros((5, 5), np.float32))  # one per image: read
    assert CUHKPedesDataset(path, "train", features_dir=feats).num_images == 5


def test_a_text_file_as_a_noise_index_is_not_a_npy_file(tmp_path):
    path = tmp_path / "index.npy"
    path.write_text("\n".join(str(k // 5) for k in range(40)) + "\n")
    with pytest.raises(DataFormatError) as err:
        read_noise_index(path, num_captions=40, num_images=8)
    assert str(err.value).startswith(f"{path}: not a .npy file: it begins with b'0\\n0\\n")
    assert "pickle" not in str(err.value)


def test_an_npz_as_a_noise_index_is_named_with_its_members(tmp_path):
    path = tmp_path / "index.npz"
    np.savez(path, noise=np.arange(40) // 5, ratio=np.array(0.2))
    with pytest.raises(DataFormatError) as err:
        read_noise_index(path, num_captions=40, num_images=8)
    assert str(err.value).startswith(
        f"{path}: is an .npz archive (numpy.savez) holding noise, ratio, not a .npy file"
    )
    assert "shape None" not in str(err.value)
