"""Zero-shot classification sets read from tiny copies of their released layouts.

Every layout is written here in the release's own formats (JPEG/PNG through PIL, CIFAR pickles
of the released dict shape, .mat through scipy.io.savemat, the split text and JSON files), and
the readers' labels, class names, split selection and pixels are checked against what was
written.
"""

from __future__ import annotations

import json
import os
import pickle
import re
from pathlib import Path

import numpy as np
import pytest

from vlret.data.checks import DataFormatError
from vlret.data.classification import (
    DATASETS,
    ClassificationSet,
    default_templates,
    load_caltech101,
    load_cifar,
    load_classification,
    load_templates,
    read_classnames,
)
from vlret.data.classification._shipped import CLASSNAMES_DIR, shipped_classnames
from vlret.data.classification.released import pets_breed

Image = pytest.importorskip("PIL.Image")
sio = pytest.importorskip("scipy.io")

RNG = np.random.default_rng(0)


def _colour(k: int) -> tuple[int, int, int]:
    """A distinct flat colour per image, so a JPEG decodes within a few levels of it."""
    return (40 * k % 256, (90 + 70 * k) % 256, (200 - 30 * k) % 256)


def _jpeg(path: Path, k: int, size: tuple[int, int] = (12, 10)) -> tuple[int, int, int]:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", size, _colour(k)).save(path, "JPEG", quality=100)
    return _colour(k)


def _assert_colour(img, colour) -> None:
    arr = np.asarray(img)
    assert img.mode == "RGB" and arr.ndim == 3
    assert np.abs(arr.astype(int) - np.array(colour)).max() <= 3


# ------------------------------------------------------------------------------------ CIFAR


def _dump(path: Path, obj) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("wb") as f:
        pickle.dump(obj, f, protocol=2)  # the released files are protocol-2 pickles


CIFAR10 = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"]


def _cifar10(root: Path) -> dict[str, tuple[np.ndarray, list[int]]]:
    top = root / "cifar-10-batches-py"
    _dump(top / "batches.meta", {"label_names": CIFAR10, "num_cases_per_batch": 3, "num_vis": 3072})
    written = {}
    for name in ["test_batch"] + [f"data_batch_{i}" for i in range(1, 6)]:
        data = RNG.integers(0, 256, size=(3, 3072), dtype=np.uint8)
        labels = [int(v) for v in RNG.integers(0, 10, size=3)]
        _dump(
            top / name,
            {
                "batch_label": name,
                "labels": labels,
                "data": data,
                "filenames": [f"{name}_{i}.png" for i in range(3)],
            },
        )
        written[name] = (data, labels)
    return written


def _pixels(row: np.ndarray) -> np.ndarray:
    """The naive HWC picture of a CHW row: pixel (y, x) = (R, G, B) planes at y * 32 + x."""
    out = np.zeros((32, 32, 3), dtype=np.uint8)
    for y in range(32):
        for x in range(32):
            out[y, x] = [row[c * 1024 + y * 32 + x] for c in range(3)]
    return out


def test_cifar10_test_batch_labels_names_and_pixels(tmp_path):
    written = _cifar10(tmp_path)
    ds = load_classification("cifar10", tmp_path)
    data, labels = written["test_batch"]
    assert (ds.name, ds.split, ds.root) == ("cifar10", "test", tmp_path / "cifar-10-batches-py")
    assert ds.classnames == CIFAR10 and ds.labels == labels and len(ds) == 3
    for i in range(3):
        assert np.array_equal(np.asarray(ds.image(i)), _pixels(data[i]))
    assert ds.describe(2) == f"{tmp_path / 'cifar-10-batches-py' / 'test_batch'} row 2"


def test_cifar10_train_split_concatenates_the_five_batches(tmp_path):
    written = _cifar10(tmp_path)
    ds = load_classification("cifar10", tmp_path / "cifar-10-batches-py", split="train")
    assert ds.labels == [y for i in range(1, 6) for y in written[f"data_batch_{i}"][1]]
    data4 = written["data_batch_4"][0]
    assert np.array_equal(np.asarray(ds.image(10)), _pixels(data4[1]))  # batch 4, row 1
    assert ds.describe(10).endswith("data_batch_4 row 1")


def test_cifar100_bytes_keys_fine_labels_and_spaced_names(tmp_path):
    top = tmp_path / "cifar-100-python"
    fine = [f"class_{i}" for i in range(99)] + ["aquarium_fish"]
    _dump(
        top / "meta",
        {b"fine_label_names": [n.encode() for n in fine], b"coarse_label_names": [b"x"] * 20},
    )
    data = RNG.integers(0, 256, size=(4, 3072), dtype=np.uint8)
    _dump(
        top / "test",
        {
            b"data": data,
            b"fine_labels": [99, 0, 5, 99],
            b"coarse_labels": [1, 2, 3, 4],
            b"filenames": [b"a"] * 4,
        },
    )
    ds = load_classification("cifar100", tmp_path)
    assert ds.labels == [99, 0, 5, 99]  # the fine labels, not the coarse
    assert ds.classnames[99] == "aquarium fish" and ds.classnames[3] == "class 3"
    assert np.array_equal(np.asarray(ds.image(3)), _pixels(data[3]))
    raw = load_cifar("cifar100", top, keep_underscores=True)  # CLIP_benchmark's prompts
    assert raw.classnames[99] == "aquarium_fish" and raw.labels == ds.labels


class Payload:
    """A custom class: a pickle naming it must be refused, not instantiated."""

    def __init__(self) -> None:
        self.x = 1


class _System:
    def __init__(self, command: str) -> None:
        self.command = command

    def __reduce__(self):
        return (os.system, (self.command,))


@pytest.mark.parametrize("kind", ["os.system", "custom class"])
def test_cifar_reader_refuses_other_globals_without_running_them(tmp_path, kind):
    _cifar10(tmp_path)
    marker = tmp_path / "ran"
    payload = _System(f"touch {marker}") if kind == "os.system" else Payload()
    path = tmp_path / "cifar-10-batches-py" / "test_batch"
    _dump(path, {"data": np.zeros((1, 3072), np.uint8), "labels": [payload]})
    with pytest.raises(DataFormatError) as err:
        load_classification("cifar10", tmp_path)
    message = str(err.value)
    assert str(path) in message and "\n" not in message
    refused = "system" if kind == "os.system" else f"{__name__}.Payload"
    assert re.search(rf"refuses to load \S*{re.escape(refused)}", message), message
    assert not marker.exists()


def test_cifar_wrong_content_is_named(tmp_path):
    _cifar10(tmp_path)
    path = tmp_path / "cifar-10-batches-py" / "test_batch"
    _dump(path, {"data": np.zeros((2, 100), np.uint8), "labels": [0, 1]})
    with pytest.raises(DataFormatError, match="100 columns; expected 3072"):
        load_classification("cifar10", tmp_path)
    _dump(path, {"data": np.zeros((2, 3072), np.uint8), "labels": [0, 10]})
    with pytest.raises(DataFormatError, match=r"'labels'\[1\] = 10"):
        load_classification("cifar10", tmp_path)


# --------------------------------------------------------------------------------- ImageNet


def test_shipped_imagenet_lists():
    wnids = shipped_classnames("imagenet1k_wnids")
    names = shipped_classnames("imagenet1k")
    assert len(wnids) == len(set(wnids)) == 1000 and wnids == sorted(wnids)
    assert all(re.fullmatch(r"n\d{8}", w) for w in wnids)
    assert len(names) == 1000
    named = dict(zip(wnids, names, strict=True))
    # spot checks of CLIP's curated names at their synsets
    assert named["n01440764"] == "tench" and named["n15075141"] == "toilet paper"
    assert named["n02690373"] == "airliner" and named["n03773504"] == named["n04008634"]


def test_imagenet_folder_per_synset(tmp_path):
    wnids = shipped_classnames("imagenet1k_wnids")
    c1 = _jpeg(tmp_path / "val" / "n15075141" / "ILSVRC2012_val_00000007.JPEG", 1)
    c2 = _jpeg(tmp_path / "val" / "n01440764" / "ILSVRC2012_val_00000002.JPEG", 2)
    (tmp_path / "val" / "n01440764" / "notes.txt").write_text("not an image")
    ds = load_classification("imagenet1k", tmp_path)
    assert ds.split == "val" and len(ds.classnames) == 1000
    assert ds.labels == [0, wnids.index("n15075141")] == [0, 999]
    _assert_colour(ds.image(0), c2)
    _assert_colour(ds.image(1), c1)
    (tmp_path / "val" / "n99999999").mkdir()
    with pytest.raises(DataFormatError, match="n99999999: is not one of the 1000"):
        load_classification("imagenet1k", tmp_path)


def _meta_mat(path: Path, rows: list[tuple[int, str, int]]) -> None:
    fields = [
        ("ILSVRC2012_ID", "O"),
        ("WNID", "O"),
        ("words", "O"),
        ("gloss", "O"),
        ("num_children", "O"),
        ("children", "O"),
        ("wordnet_height", "O"),
        ("num_train_images", "O"),
    ]
    synsets = np.zeros((len(rows), 1), dtype=fields)
    for i, (ilsvrc_id, wnid, children) in enumerate(rows):
        synsets[i, 0] = (
            np.array([[ilsvrc_id]], np.uint16),
            wnid,
            "words",
            "gloss",
            np.array([[children]], np.uint16),
            np.zeros((1, 0)),
            0,
            1300,
        )
    path.parent.mkdir(parents=True, exist_ok=True)
    sio.savemat(path, {"synsets": synsets})


def test_imagenet_flat_val_maps_ilsvrc_ids_through_meta_mat(tmp_path):
    wnids = shipped_classnames("imagenet1k_wnids")
    data = tmp_path / "ILSVRC2012_devkit_t12" / "data"
    # ILSVRC2012 ids are not sorted-synset labels: id 1 is the last synset here
    _meta_mat(
        data / "meta.mat",
        [(1, "n15075141", 0), (2, "n01440764", 0), (3, "n02690373", 0), (1001, "n00001740", 5)],
    )
    (data / "ILSVRC2012_validation_ground_truth.txt").write_text("3\n1\n2\n1\n")
    colours = [
        _jpeg(tmp_path / "ILSVRC2012_img_val" / f"ILSVRC2012_val_{n:08d}.JPEG", n)
        for n in range(1, 5)
    ]
    ds = load_classification("imagenet1k", tmp_path, split="test")
    assert ds.labels == [wnids.index("n02690373"), 999, 0, 999]
    assert ds.classnames[ds.labels[0]] == "airliner"
    _assert_colour(ds.image(2), colours[2])
    assert ds.describe(3).endswith("ILSVRC2012_val_00000004.JPEG")
    (tmp_path / "ILSVRC2012_img_val" / "ILSVRC2012_val_00000004.JPEG").unlink()
    with pytest.raises(FileNotFoundError, match="ILSVRC2012_val_00000004.JPEG: missing"):
        load_classification("imagenet1k", tmp_path)
    _jpeg(tmp_path / "ILSVRC2012_img_val" / "ILSVRC2012_val_00000004.JPEG", 4)
    (data / "ILSVRC2012_validation_ground_truth.txt").write_text("3\n1\n7\n1\n")
    with pytest.raises(DataFormatError, match="line 3: ILSVRC2012 id 7"):
        load_classification("imagenet1k", tmp_path)


# ------------------------------------------------------------------------------ Caltech-101


def test_caltech101_both_readings(tmp_path):
    top = tmp_path / "caltech101" / "101_ObjectCategories"
    colours = {}
    for k, folder in enumerate(["BACKGROUND_Google", "Faces", "accordion"]):
        for j in (1, 2):
            colours[folder, j] = _jpeg(top / folder / f"image_{j:04d}.jpg", 2 * k + j)
    ds = load_classification("caltech101", tmp_path)  # CLIP_benchmark's: 102 classes
    assert len(ds.classnames) == 102 and ds.labels == [0, 0, 1, 1, 5, 5]
    assert [ds.classnames[y] for y in (0, 1, 5)] == ["background", "off-center face", "accordion"]
    _assert_colour(ds.image(3), colours["Faces", 2])
    tv = load_caltech101(top, background=False)  # torchvision's: 101 classes
    assert len(tv.classnames) == 101 and tv.labels == [0, 0, 4, 4]
    assert tv.classnames[0] == "off-center face" and "background" not in tv.classnames
    (top / "not_a_class").mkdir()
    with pytest.raises(DataFormatError, match="not_a_class: is not a Caltech-101 class"):
        load_classification("caltech101", top)


def test_shipped_caltech_lists_align():
    folders, names = shipped_classnames("caltech101_folders"), shipped_classnames("caltech101")
    assert len(folders) == len(names) == 102 and folders == sorted(folders)
    pairs = dict(zip(folders, names, strict=True))
    assert pairs["Faces_easy"] == "centered face" and pairs["car_side"] == "side of a car"
    assert pairs["yin_yang"] == "yin and yang symbol" and pairs["BACKGROUND_Google"] == "background"


# -------------------------------------------------------------------------------- Food-101


def test_food101_test_json(tmp_path):
    top = tmp_path / "food-101"
    split = {
        "test": {
            "baby_back_ribs": ["baby_back_ribs/7"],
            "apple_pie": ["apple_pie/3", "apple_pie/9"],
        },
        "train": {"apple_pie": ["apple_pie/1"], "baby_back_ribs": ["baby_back_ribs/2"]},
    }
    colours = {}
    for name, meta in split.items():
        (top / "meta").mkdir(parents=True, exist_ok=True)
        (top / "meta" / f"{name}.json").write_text(json.dumps(meta))
        for entries in meta.values():
            for k, e in enumerate(entries):
                colours[e] = _jpeg(top / "images" / f"{e}.jpg", len(colours) + k)
    ds = load_classification("food101", tmp_path)
    assert ds.classnames == ["apple pie", "baby back ribs"] and ds.labels == [0, 0, 1]
    _assert_colour(ds.image(2), colours["baby_back_ribs/7"])
    assert load_classification("food101", top, split="train").labels == [0, 1]
    (top / "images" / "apple_pie" / "9.jpg").unlink()
    with pytest.raises(FileNotFoundError, match=r"apple_pie/9\.jpg: missing; .*test\.json"):
        load_classification("food101", top)


# ----------------------------------------------------------------------------- Flowers-102


def test_flowers102_setid_tstid(tmp_path):
    top = tmp_path / "flowers-102"
    top.mkdir()
    sio.savemat(top / "imagelabels.mat", {"labels": np.array([[1, 3, 2, 102, 1]], np.uint8)})
    sio.savemat(
        top / "setid.mat",
        {
            "trnid": np.array([[1]], np.uint16),
            "valid": np.array([[3, 5]], np.uint16),
            "tstid": np.array([[4, 2]], np.uint16),
        },
    )
    colours = [_jpeg(top / "jpg" / f"image_{i:05d}.jpg", i) for i in range(1, 6)]
    ds = load_classification("flowers102", tmp_path)
    assert ds.labels == [101, 2] and len(ds.classnames) == 102
    assert ds.classnames[2] == "canterbury bells" and ds.classnames[101] == "blackberry lily"
    _assert_colour(ds.image(0), colours[3])
    assert ds.describe(1).endswith("image_00002.jpg")
    assert load_classification("flowers102", top, split="val").labels == [1, 0]
    assert load_classification("flowers102", top, split="train").labels == [0]
    with pytest.raises(ValueError, match="split 'valid': flowers102 has 'test', 'train', 'val'"):
        load_classification("flowers102", top, split="valid")


# ------------------------------------------------------------------------------------- Pets


def test_pets_test_txt_and_breed_check(tmp_path):
    top = tmp_path / "oxford-iiit-pet"
    (top / "annotations").mkdir(parents=True)
    (top / "annotations" / "test.txt").write_text(
        "Abyssinian_1 1 1 1\namerican_pit_bull_terrier_12 3 2 2\nYorkshire_terrier_5 37 2 25\n"
    )
    (top / "annotations" / "trainval.txt").write_text("german_shorthaired_2 15 2 8\n")
    colours = [
        _jpeg(top / "images" / f"{n}.jpg", k)
        for k, n in enumerate(
            [
                "Abyssinian_1",
                "american_pit_bull_terrier_12",
                "Yorkshire_terrier_5",
                "german_shorthaired_2",
            ]
        )
    ]
    ds = load_classification("pets", tmp_path)
    assert ds.labels == [0, 2, 36] and len(ds.classnames) == 37
    assert ds.classnames[2] == "American Pit Bull Terrier"
    _assert_colour(ds.image(1), colours[1])
    tv = load_classification("pets", top, split="trainval")
    assert tv.labels == [14] and tv.classnames[14] == "German Shorthaired"
    (top / "annotations" / "test.txt").write_text("Abyssinian_1 1 1 1\nBengal_3 2 1 2\n")
    with pytest.raises(DataFormatError, match="line 2: image 'Bengal_3' has class id 2"):
        load_classification("pets", top)


def test_shipped_pet_names_are_the_breeds_of_the_file_names():
    names = shipped_classnames("pets")
    assert len(names) == len(set(names)) == 37
    assert pets_breed("saint_bernard_101") == "Saint Bernard" == names[28]
    assert pets_breed("British_Shorthair_3") == "British Shorthair" == names[9]


# ---------------------------------------------------------------------------- FGVC-Aircraft


def test_fgvc_aircraft_variants_split_at_first_space(tmp_path):
    data = tmp_path / "fgvc-aircraft-2013b" / "data"
    data.mkdir(parents=True)
    (data / "variants.txt").write_text("707-320\nCessna 172\nF-16A/B\n")
    (data / "images_variant_test.txt").write_text("0034309 F-16A/B\n1234567 Cessna 172\n")
    (data / "images_variant_trainval.txt").write_text("7654321 707-320\n")
    colours = [
        _jpeg(data / "images" / f"{i}.jpg", k)
        for k, i in enumerate(["0034309", "1234567", "7654321"])
    ]
    ds = load_classification("fgvc_aircraft", tmp_path)
    assert ds.classnames == ["707-320", "Cessna 172", "F-16A/B"] and ds.labels == [2, 1]
    _assert_colour(ds.image(1), colours[1])
    assert load_classification("fgvc_aircraft", tmp_path, split="trainval").labels == [0]
    (data / "images_variant_test.txt").write_text("0034309 F-16C\n")
    with pytest.raises(DataFormatError, match="line 1: variant 'F-16C' is not in"):
        load_classification("fgvc_aircraft", tmp_path)


# ----------------------------------------------------------------------------- image folder


def test_imagefolder_sorted_folders_png_pixels_and_classnames_file(tmp_path):
    pixels = {}
    for cls in ("zebra", "ant_eater"):
        for j in range(2):
            arr = RNG.integers(0, 256, size=(5, 7, 3), dtype=np.uint8)
            (tmp_path / "test" / cls).mkdir(parents=True, exist_ok=True)
            Image.fromarray(arr).save(tmp_path / "test" / cls / f"{j}.PNG")
            pixels[cls, j] = arr
    ds = load_classification("imagefolder", tmp_path)  # test/ holds the class folders
    assert ds.classnames == ["ant_eater", "zebra"] and ds.labels == [0, 0, 1, 1]
    assert np.array_equal(np.asarray(ds.image(3)), pixels["zebra", 1])
    names = tmp_path / "names.txt"
    names.write_text("# mine\nant eater\nzebra\n")
    named = load_classification("imagefolder", tmp_path / "test", classnames=names)
    assert named.classnames == ["ant eater", "zebra"] and named.labels == ds.labels
    names.write_text("ant eater\n")
    with pytest.raises(DataFormatError, match="holds 1 class names for the 2 class folders"):
        load_classification("imagefolder", tmp_path, classnames=names)


# ---------------------------------------------------------------- names, templates, errors


def test_templates_shipped_counts_and_placeholders():
    counts = {
        "imagenet1k": 80,
        "cifar10": 18,
        "cifar100": 18,
        "caltech101": 34,
        "food101": 1,
        "flowers102": 1,
        "pets": 1,
        "fgvc_aircraft": 2,
        "imagefolder": 80,
    }
    for name in DATASETS:
        templates = default_templates(name)
        assert len(templates) == len(set(templates)) == counts[name], name
        assert all("{c}" in t for t in templates)
    assert load_templates("openai") == default_templates("imagenet1k")
    assert "itap of my {c}." in load_templates("openai")
    assert load_templates("pets") == ["a photo of a {c}, a type of pet."]


def test_template_and_classname_files(tmp_path):
    path = tmp_path / "t.txt"
    path.write_text("# open_clip style\na photo of a {}.\nitap of a {c}.\n")
    assert load_templates(str(path)) == ["a photo of a {c}.", "itap of a {c}."]
    path.write_text("a photo of a {c}.\na photo.\n")
    with pytest.raises(DataFormatError, match=r"t\.txt, line 2: template 'a photo\.' has no"):
        load_templates(str(path))
    with pytest.raises(FileNotFoundError, match="nope.txt: no such file; expected openai"):
        load_templates(str(tmp_path / "nope.txt"))
    names = tmp_path / "n.txt"
    names.write_text("cat\n\ndog\n")
    with pytest.raises(DataFormatError, match="n.txt, line 2: a blank line"):
        read_classnames(names)
    assert CLASSNAMES_DIR.parent.name == "classification"  # found beside the module


def test_bad_name_root_split_and_classnames_count(tmp_path):
    with pytest.raises(ValueError, match="dataset 'mnist': expected one of imagenet1k"):
        load_classification("mnist", tmp_path)
    with pytest.raises(FileNotFoundError, match=r"nowhere: missing; expected a folder"):
        load_classification("food101", tmp_path / "nowhere")
    with pytest.raises(FileNotFoundError, match=r"no .*cifar-10-batches-py/batches\.meta"):
        load_classification("cifar10", tmp_path)
    with pytest.raises(ValueError, match="split 'val': pets has 'test', 'trainval'"):
        load_classification("pets", tmp_path, split="val")
    _cifar10(tmp_path)
    names = tmp_path / "names.txt"
    names.write_text("a\nb\n")
    with pytest.raises(DataFormatError, match="holds 2 class names; cifar10 has 10 classes"):
        load_classification("cifar10", tmp_path, classnames=names)
    names.write_text("".join(f"thing {i}\n" for i in range(10)))
    ds = load_classification("cifar10", tmp_path, classnames=names)
    assert isinstance(ds, ClassificationSet) and ds.classnames[9] == "thing 9"


def test_sets_pickle_for_dataloader_workers(tmp_path):
    written = _cifar10(tmp_path)
    for split in ("test", "train"):
        ds = load_classification("cifar10", tmp_path, split=split)
        back = pickle.loads(pickle.dumps(ds))
        assert back.labels == ds.labels and back.describe(4) == ds.describe(4)
        assert np.array_equal(
            np.asarray(back.image(4 % len(ds))), np.asarray(ds.image(4 % len(ds)))
        )
    assert len(written) == 6
