"""Fault cases of issue 39 on images: the pixel cap checked before decoding (item 3), images
that do not decode or are over the cap as one line naming the file in every reader (item 12),
class folders that nest their images a level deeper (item 14)."""

from __future__ import annotations

import io
import json
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from vlret._images import (
    DEFAULT_MAX_IMAGE_PIXELS,
    ImageReadError,
    ImageTooLarge,
    open_rgb,
)

Image = pytest.importorskip("PIL.Image")
ImageFile = pytest.importorskip("PIL.ImageFile")

BIG_SIDE = 6000  # 36 M pixels: over the default cap, a PNG of a few tens of KB when all black
SMALL_CAP = 10_000


@pytest.fixture(scope="module")
def big_png(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real 6000 x 6000 all-black PNG written by PIL: tiny on disk, 36 MB decoded."""
    path = tmp_path_factory.mktemp("big") / "big.png"
    Image.new("L", (BIG_SIDE, BIG_SIDE)).save(path)
    assert path.stat().st_size < 200_000
    return path


@pytest.fixture
def no_decoding(monkeypatch: pytest.MonkeyPatch) -> None:
    """Any pixel decoding fails the test: the cap must be met from the header alone."""

    def load(self: object) -> None:
        raise AssertionError("an image over the cap was decoded")

    monkeypatch.setattr(ImageFile.ImageFile, "load", load)


def test_default_cap_is_the_config_default() -> None:
    from vlret.data.config import DataConfig

    assert DataConfig(root="data").max_image_pixels == DEFAULT_MAX_IMAGE_PIXELS


def test_cap_refuses_from_the_header(big_png: Path, no_decoding: None) -> None:
    start = time.perf_counter()
    with pytest.raises(ImageTooLarge) as caught:
        open_rgb(big_png)  # the default cap (25 M) is below 36 M
    assert time.perf_counter() - start < 1.0
    message = str(caught.value)
    assert "\n" not in message and message.startswith(f"{big_png}: 6000 x 6000")
    assert "data.max_image_pixels" in message


@pytest.mark.parametrize("kind", ["bytes", "file", "pil"])
def test_cap_applies_to_every_source(big_png: Path, no_decoding: None, kind: str) -> None:
    data = big_png.read_bytes()
    source = {
        "bytes": lambda: data,
        "file": lambda: io.BytesIO(data),
        "pil": lambda: Image.open(io.BytesIO(data)),  # lazy: header parsed, nothing decoded
    }[kind]()
    with pytest.raises(ImageTooLarge, match="^member 7.png: 6000 x 6000"):
        open_rgb(source, name="member 7.png")


@pytest.mark.parametrize("fmt", ["PNG", "TIFF", "GIF"])  # TIFF, GIF: PIL checks on decoding too
def test_image_under_a_cap_above_pils_limit_reads_without_warning(
    monkeypatch: pytest.MonkeyPatch, fmt: str
) -> None:
    """max_pixels is the limit that applies: PIL's own (here made tiny) neither warns nor
    refuses, and is left as it was."""
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 100)
    buffer = io.BytesIO()
    Image.new("RGB", (40, 30), (0, 0, 0)).save(buffer, fmt)  # 1200 > 2 x PIL's 100
    for cap in (1200, None):
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            image = open_rgb(buffer.getvalue(), max_pixels=cap)
        assert image.size == (40, 30) and image.getpixel((0, 0)) == (0, 0, 0)
    assert Image.MAX_IMAGE_PIXELS == 100
    with pytest.raises(ImageTooLarge):
        open_rgb(buffer.getvalue(), max_pixels=1199)


def test_no_cap_reads_a_large_image(big_png: Path) -> None:
    assert open_rgb(big_png, max_pixels=None).size == (BIG_SIDE, BIG_SIDE)


def png_bytes(size: tuple[int, int] = (8, 8)) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(np.full((size[1], size[0], 3), 7, dtype=np.uint8)).save(buffer, "PNG")
    return buffer.getvalue()


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        (b"this is a caption, not an image", "not an image PIL can read"),
        (png_bytes((64, 64))[:80], "does not decode"),  # truncated in its pixel data
        (b"", "not an image PIL can read"),
    ],
)
def test_bad_files_are_one_line_naming_the_file(
    tmp_path: Path, content: bytes, problem: str
) -> None:
    path = tmp_path / "photo.jpg"
    path.write_bytes(content)
    with pytest.raises(ImageReadError) as caught:
        open_rgb(path)
    assert str(caught.value).startswith(f"{path}: {problem}")
    assert "\n" not in str(caught.value)


def test_missing_file_folder_and_fifo_are_named(tmp_path: Path) -> None:
    with pytest.raises(ImageReadError, match="missing.png: no such file"):
        open_rgb(tmp_path / "missing.png")
    with pytest.raises(ImageReadError, match="is a folder"):
        open_rgb(tmp_path)
    fifo = tmp_path / "pipe.png"
    os = pytest.importorskip("os")
    if not hasattr(os, "mkfifo"):
        pytest.skip("no FIFOs on this platform")
    os.mkfifo(fifo)
    with pytest.raises(ImageReadError, match="pipe.png: not a regular file"):
        open_rgb(fifo)  # PIL would block on it, waiting for a writer


def test_eps_is_never_handed_to_ghostscript(tmp_path: Path) -> None:
    path = tmp_path / "figure.eps"
    path.write_bytes(b"%!PS-Adobe-3.0 EPSF-3.0\n%%BoundingBox: 0 0 10 10\nshowpage\n")
    with pytest.raises(ImageReadError, match="not an image PIL can read"):
        open_rgb(path)


def test_result_is_loaded_and_holds_no_file(tmp_path: Path) -> None:
    path = tmp_path / "a.png"
    path.write_bytes(png_bytes())
    image = open_rgb(path)
    path.unlink()  # the pixels are in memory
    assert image.mode == "RGB" and image.getpixel((3, 3)) == (7, 7, 7)


# ------------------------------------------------------------- every reader (items 3 and 12)


class DecodeLog:
    """Records every decode of an image over the default cap (none may happen)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.over_cap: list[tuple[int, int]] = []
        original = ImageFile.ImageFile.load

        def load(image: Any) -> Any:
            if image.size[0] * image.size[1] > DEFAULT_MAX_IMAGE_PIXELS:
                self.over_cap.append(image.size)
            return original(image)

        monkeypatch.setattr(ImageFile.ImageFile, "load", load)


@pytest.fixture
def decodes(monkeypatch: pytest.MonkeyPatch) -> DecodeLog:
    return DecodeLog(monkeypatch)


def write_big(path: Path) -> Path:
    """A 6000 x 6000 all-black PNG (36 M pixels, over the default cap), whatever the suffix."""
    Image.new("L", (BIG_SIDE, BIG_SIDE)).save(path, "PNG")
    return path


BAD_KINDS = ["not an image", "truncated", "over the cap"]


def spoil(path: Path, kind: str) -> str:
    """Replace the image at ``path`` by a bad one; returns what the error must say."""
    if kind == "not an image":
        path.write_bytes(b"<html>404 not found</html>")
        return "not an image PIL can read"
    if kind == "truncated":
        buffer = io.BytesIO()
        pixels = np.random.default_rng(0).integers(0, 256, (64, 64, 3), dtype=np.uint8)
        Image.fromarray(pixels).save(buffer, "JPEG")
        path.write_bytes(buffer.getvalue()[: len(buffer.getvalue()) * 2 // 3])  # in the scan
        return "does not decode"
    write_big(path)
    return "6000 x 6000 = 36000000 pixels, over the cap of 25000000"


def one_line(text: str, path: Path, words: str) -> None:
    lines = [line for line in text.strip().splitlines() if not line.startswith("Loading")]
    assert len(lines) == 1, text
    assert str(path) in lines[0] and words in lines[0], lines[0]
    assert "Traceback" not in text


def karpathy_world(root: Path, n: int = 4) -> Path:
    """A Karpathy JSON (test split) and its images, written with json and PIL."""
    (root / "images").mkdir(parents=True)
    images = []
    for i in range(n):
        Image.new("RGB", (40, 30), (60 * i, 20, 200 - 40 * i)).save(root / "images" / f"{i}.jpg")
        words = ["a", "red", "box", str(i)]
        sentences = [
            {"raw": " ".join(words[: 2 + j % 3]), "tokens": words[: 2 + j % 3], "sentid": 5 * i + j}
            for j in range(5)
        ]
        images.append(
            {
                "filename": f"{i}.jpg",
                "imgid": i,
                "split": "test",
                "sentids": [5 * i + j for j in range(5)],
                "sentences": sentences,
            }
        )
    path = root / "dataset_flickr30k.json"
    path.write_text(json.dumps({"dataset": "flickr30k", "images": images}))
    return path


@pytest.fixture(scope="module")
def clip_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random CLIP with its tokenizer and image processor, written by transformers."""
    transformers = pytest.importorskip("transformers")
    torch = pytest.importorskip("torch")
    path = tmp_path_factory.mktemp("tiny_clip")
    vocab = {"<|startoftext|>": 0, "<|endoftext|>": 1}
    letters = "abcdefghijklmnopqrstuvwxyz0123456789"
    vocab.update({ch: 2 + i for i, ch in enumerate(letters)})
    vocab.update({ch + "</w>": 2 + len(letters) + i for i, ch in enumerate(letters)})
    (path / "vocab.json").write_text(json.dumps(vocab))
    (path / "merges.txt").write_text("#version: 0.2\n")
    tokenizer = transformers.CLIPTokenizer(str(path / "vocab.json"), str(path / "merges.txt"))
    tokenizer.model_max_length = 32
    tokenizer.save_pretrained(str(path))
    text = dict(
        vocab_size=len(vocab), hidden_size=16, intermediate_size=24, num_hidden_layers=1,
        num_attention_heads=2, max_position_embeddings=32, bos_token_id=0, eos_token_id=1,
        pad_token_id=1,
    )  # fmt: skip
    vision = dict(
        image_size=32, patch_size=16, hidden_size=16, intermediate_size=24, num_hidden_layers=1,
        num_attention_heads=2,
    )  # fmt: skip
    config = transformers.CLIPConfig(text_config=text, vision_config=vision, projection_dim=8)
    torch.manual_seed(0)
    transformers.CLIPModel(config).save_pretrained(str(path))
    processor = transformers.CLIPImageProcessor(
        size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32}
    )
    processor.save_pretrained(str(path))
    return path


@pytest.mark.parametrize("kind", BAD_KINDS)
def test_karpathy_eval_names_the_bad_image_in_one_line(
    clip_dir: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    decodes: DecodeLog,
    kind: str,
) -> None:
    """Before: PIL's UnidentifiedImageError traceback; the 6000 x 6000 PNG decoded."""
    from vlret.cli import main

    karpathy_world(tmp_path / "data")
    bad = tmp_path / "data" / "images" / "2.jpg"
    words = spoil(bad, kind)
    argv = ["eval", "--model-dir", clip_dir, "--data", tmp_path / "data", "--split", "test"]
    argv += ["--protocol", "f30k", "--device", "cpu"]
    capsys.readouterr()
    assert main([str(a) for a in argv]) != 0
    one_line(capsys.readouterr().err, bad, words)
    assert decodes.over_cap == []


def image_folder(root: Path) -> Path:
    for k, name in enumerate(("cat", "dog")):
        (root / name).mkdir(parents=True)
        for i in range(2):
            Image.new("RGB", (40, 36), (90 * k, 40 * i, 200)).save(root / name / f"{i}.jpg")
    return root


@pytest.mark.parametrize("kind", BAD_KINDS)
def test_zeroshot_names_the_bad_image_in_one_line(
    clip_dir: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    decodes: DecodeLog,
    kind: str,
) -> None:
    """Before: the 6000 x 6000 PNG was decoded (0.7 GB, 19 s) and scored without a word."""
    from vlret.cli import main

    folder = image_folder(tmp_path / "folder")
    bad = folder / "dog" / "1.jpg"
    words = spoil(bad, kind)
    argv = ["zeroshot", "--model", clip_dir, "--dataset", "imagefolder", "--data-root", folder]
    argv += ["--no-progress", "--device", "cpu"]
    capsys.readouterr()
    assert main([str(a) for a in argv]) != 0
    one_line(capsys.readouterr().err, bad, words)
    assert decodes.over_cap == []


@pytest.mark.parametrize("kind", BAD_KINDS)
def test_classification_set_reads_under_the_cap_given(tmp_path: Path, kind: str) -> None:
    from vlret.data.classification import load_classification

    folder = image_folder(tmp_path / "folder")
    words = spoil(folder / "cat" / "0.jpg", kind)
    data = load_classification("imagefolder", folder)
    with pytest.raises(ImageReadError, match=words):
        data.image(0)
    small = load_classification("imagefolder", folder, max_pixels=40 * 36 - 1)
    with pytest.raises(ImageTooLarge, match="dog/0.jpg: 40 x 36"):
        small.image(2)


def karpathy_config(root: Path, **keys: Any) -> Any:
    from vlret.data.config import DataConfig

    return DataConfig(
        root=str(root),
        format="karpathy",
        karpathy_json=str(root / "dataset_flickr30k.json"),
        image_root=str(root / "images"),
        **keys,
    )


def test_run_datasets_read_under_data_max_image_pixels(tmp_path: Path) -> None:
    """builders puts the model's transform behind the run's cap: a 40 x 30 image is refused
    under a cap of 1000 pixels, from its header; read under the default."""
    from vlret.data.formats import open_dataset
    from vlret.models.clip import CLIPImageTransform

    karpathy_world(tmp_path)
    transform = CLIPImageTransform(32)
    capped_set = open_dataset(
        karpathy_config(tmp_path, max_image_pixels=1000), "test", image_transform=transform
    )
    with pytest.raises(ImageTooLarge, match=r"images/1\.jpg: 40 x 30 = 1200 pixels"):
        capped_set.image(1)
    default_set = open_dataset(karpathy_config(tmp_path), "test", image_transform=transform)
    assert tuple(default_set.image(1).shape) == (3, 32, 32)
    assert default_set.image_transform.crop == transform.crop  # reads as the model's
    # the run's cap is the one that holds, also where the model's transform has a lower one
    strict = CLIPImageTransform(32, max_pixels=1000)
    raised = open_dataset(karpathy_config(tmp_path), "test", image_transform=strict)
    assert tuple(raised.image(1).shape) == (3, 32, 32)
    assert strict.max_pixels == 1000  # the model's own transform is left as it was


def test_training_augmentation_reads_under_data_max_image_pixels(tmp_path: Path) -> None:
    from vlret.data.transforms import build_train_transform
    from vlret.models.clip import CLIPImageTransform

    karpathy_world(tmp_path)
    data = karpathy_config(tmp_path, max_image_pixels=1000, train_transform="random_resized_crop")
    augment = build_train_transform(data, CLIPImageTransform(32))
    with pytest.raises(ImageTooLarge, match="0.jpg: 40 x 30"):
        augment(tmp_path / "images" / "0.jpg", key=(0, 0, 0))


@pytest.mark.parametrize("value", [0, -5, "many", 2.5, True])
def test_max_image_pixels_is_checked(value: Any) -> None:
    from vlret.data.formats.checks import image_data_problem

    data = karpathy_config(Path("data"), max_image_pixels=value)
    key, message = image_data_problem(data, {})
    assert key == "max_image_pixels" and "positive integer" in message


@pytest.mark.parametrize("kind", BAD_KINDS)
def test_report_thumbnails_name_the_bad_image(
    tmp_path: Path, decodes: DecodeLog, kind: str
) -> None:
    """Before: PIL's error (an OSError the report command does not catch): a traceback."""
    from vlret.analysis.report.thumbs import write_thumb
    from vlret.data import KarpathyDataset

    json_path = karpathy_world(tmp_path / "data")
    dataset = KarpathyDataset(json_path, "test", image_root=tmp_path / "data" / "images")
    bad = tmp_path / "data" / "images" / "3.jpg"
    words = spoil(bad, kind)
    assert write_thumb(dataset, 0, tmp_path / "report") is not None
    with pytest.raises(ImageReadError) as caught:
        write_thumb(dataset, 3, tmp_path / "report")
    one_line(str(caught.value), bad, words)
    assert decodes.over_cap == []


def person_search_world(root: Path) -> Path:
    """A CUHK-PEDES ``reid_raw.json`` (written with json) and its pictures (PIL)."""
    (root / "imgs" / "cam").mkdir(parents=True)
    records = []
    for i in range(6):
        split = ("train", "val", "test")[i // 2]
        name = f"cam/{i}.jpg"
        Image.new("RGB", (32, 96), (40 * i, 90, 30)).save(root / "imgs" / name)
        caption = f"a person in red number {i}"
        records.append(
            {
                "split": split,
                "captions": [caption],
                "file_path": name,
                "processed_tokens": [caption.split()],
                "id": i // 2 + 1,
            }
        )
    (root / "reid_raw.json").write_text(json.dumps(records))
    return root


@pytest.mark.parametrize("kind", BAD_KINDS)
def test_person_search_images_and_thumbnails_name_the_bad_image(
    tmp_path: Path, decodes: DecodeLog, kind: str
) -> None:
    from vlret.analysis.report.thumbs import write_thumb
    from vlret.data.config import DataConfig
    from vlret.data.formats import open_dataset
    from vlret.models.clip import CLIPImageTransform

    root = person_search_world(tmp_path / "persons")
    bad = root / "imgs" / "cam" / "5.jpg"
    words = spoil(bad, kind)
    data = DataConfig(root=str(root), format="cuhk-pedes")
    dataset = open_dataset(data, "test", image_transform=CLIPImageTransform((96, 32)))
    assert tuple(dataset.image(0).shape) == (3, 96, 32)
    with pytest.raises(ImageReadError) as caught:
        dataset.image(1)
    one_line(str(caught.value), bad, words)
    with pytest.raises(ImageReadError) as caught:
        write_thumb(dataset, 1, tmp_path / "report")
    one_line(str(caught.value), bad, words)
    assert decodes.over_cap == []


@pytest.mark.parametrize("kind", BAD_KINDS)
def test_captioning_images_name_the_bad_image(
    tmp_path: Path, decodes: DecodeLog, kind: str
) -> None:
    from vlret.captioning.images import split_images

    karpathy_world(tmp_path / "data")
    bad = tmp_path / "data" / "images" / "0.jpg"
    words = spoil(bad, kind)
    images = split_images(tmp_path / "data", "test")
    assert images.load(1).mode == "RGB"
    with pytest.raises(ImageReadError) as caught:
        images.load(0)
    one_line(str(caught.value), bad, words)
    assert decodes.over_cap == []


# ------------------------------------------------------- 16-bit pictures in the readers (11)


def sixteen_bit_png(path: Path) -> np.ndarray:
    """A 16-bit grey PNG (PIL mode I;16) of mid and bright greys; returns its 8-bit reading."""
    values = np.tile(np.array([[1000, 30000, 40000, 65535]], dtype=np.uint16), (4, 10))
    Image.fromarray(values).save(path, "PNG")
    return np.repeat(np.floor(values / 257.0 + 0.5)[..., None], 3, axis=2)


def test_readers_do_not_clip_sixteen_bit_pngs_to_white(tmp_path: Path) -> None:
    """Before: ``convert("RGB")`` clipped every value above 255: the picture read all white."""
    from vlret.captioning.images import split_images
    from vlret.data.classification import load_classification

    folder = image_folder(tmp_path / "folder")
    expected = sixteen_bit_png(folder / "cat" / "0.png")
    data = load_classification("imagefolder", folder)
    index = next(i for i in range(len(data)) if data.describe(i).endswith("0.png"))
    got = np.asarray(data.image(index), dtype=np.float64)
    np.testing.assert_array_equal(got, expected)
    karpathy_world(tmp_path / "data")
    sixteen_bit_png(tmp_path / "data" / "images" / "1.jpg")  # a PNG under a .jpg name
    got = np.asarray(split_images(tmp_path / "data", "test").load(1), dtype=np.float64)
    np.testing.assert_array_equal(got, expected)


# ------------------------------------------------ class folders one level deeper (item 14)


def test_imagefolder_reads_images_nested_under_a_class_like_torchvision(tmp_path: Path) -> None:
    """Before: ``dog/2019/*.jpg`` made ``dog`` a class without images, silently."""
    from vlret.data.classification import load_classification

    root = tmp_path / "pets"
    (root / "cat").mkdir(parents=True)
    (root / "dog" / "2019" / "summer").mkdir(parents=True)
    (root / "dog" / ".ipynb_checkpoints").mkdir()
    Image.new("RGB", (8, 8), (255, 0, 0)).save(root / "cat" / "a.jpg")
    Image.new("RGB", (8, 8), (0, 0, 255)).save(root / "dog" / "2019" / "b.png")
    Image.new("RGB", (8, 8), (0, 0, 250)).save(root / "dog" / "2019" / "summer" / "c.png")
    Image.new("RGB", (8, 8), (0, 0, 250)).save(root / "dog" / ".ipynb_checkpoints" / "b.png")
    data = load_classification("imagefolder", root)
    assert data.classnames == ["cat", "dog"] and data.labels == [0, 1, 1]
    assert [data.describe(i).split("pets/")[1] for i in range(3)] == [
        "cat/a.jpg",
        "dog/2019/b.png",
        "dog/2019/summer/c.png",
    ]


def test_imagefolder_refuses_a_class_without_images(tmp_path: Path) -> None:
    from vlret.data.checks import DataFormatError
    from vlret.data.classification import load_classification

    root = image_folder(tmp_path / "folder")
    (root / "fish" / "notes").mkdir(parents=True)
    (root / "fish" / "notes" / "readme.txt").write_text("fish pictures to come")
    with pytest.raises(DataFormatError, match="class folders without an image .*: fish;"):
        load_classification("imagefolder", root)


def test_imagefolder_refuses_split_folders_without_the_split(tmp_path: Path) -> None:
    """``ROOT/train/<class>/`` and ``ROOT/val/<class>/`` asked for ``test``: not two classes
    named train and val; a class named ``train`` holding its images is one (CIFAR-100)."""
    from vlret.data.checks import DataFormatError
    from vlret.data.classification import load_classification

    image_folder(tmp_path / "root" / "train")
    image_folder(tmp_path / "root" / "val")
    with pytest.raises(DataFormatError, match=r"split folders \(train, val\) but no 'test'"):
        load_classification("imagefolder", tmp_path / "root")
    assert len(load_classification("imagefolder", tmp_path / "root", split="val")) == 4
    vehicles = tmp_path / "vehicles"
    for name in ("bus", "train"):
        (vehicles / name).mkdir(parents=True)
        Image.new("RGB", (8, 8)).save(vehicles / name / "0.jpg")
    assert load_classification("imagefolder", vehicles).classnames == ["bus", "train"]


def test_imagefolder_survives_a_symlink_cycle(tmp_path: Path) -> None:
    from vlret.data.classification import load_classification

    root = image_folder(tmp_path / "folder")
    (root / "cat" / "loop").symlink_to(root / "cat", target_is_directory=True)
    assert load_classification("imagefolder", root).labels == [0, 0, 1, 1]


def test_errors_survive_pickling_whole() -> None:
    """A worker process hands its error back pickled: type, message and parts intact."""
    import pickle

    too_large = ImageTooLarge("a.png", width=3, height=4, max_pixels=5)
    back = pickle.loads(pickle.dumps(too_large))
    assert type(back) is ImageTooLarge and str(back) == str(too_large)
    assert (back.name, back.width, back.height, back.max_pixels) == ("a.png", 3, 4, 5)
    unreadable = pickle.loads(pickle.dumps(ImageReadError("b.jpg", "does not decode")))
    assert type(unreadable) is ImageReadError and str(unreadable) == "b.jpg: does not decode"


class _BadImages:
    """A map-style set whose item 1 is an image file that does not decode."""

    def __init__(self, folder: Path) -> None:
        self.paths = [folder / "0.png", folder / "1.png"]
        Image.new("RGB", (4, 4)).save(self.paths[0])
        self.paths[1].write_bytes(b"GIF89a but not really")

    def __len__(self) -> int:
        return 2

    def __getitem__(self, index: int) -> Any:
        return np.asarray(open_rgb(self.paths[index]))


@pytest.mark.parametrize("big", [False, True])
def test_a_data_loader_worker_error_stays_one_line(tmp_path: Path, big: bool) -> None:
    """torch rebuilds a worker's error from its traceback text: still the one line, same type
    (before: a RuntimeError holding the worker's whole traceback)."""
    torch = pytest.importorskip("torch")
    dataset = _BadImages(tmp_path)
    if big:
        write_big(dataset.paths[1])
    loader = torch.utils.data.DataLoader(dataset, batch_size=1, num_workers=1)
    kind = ImageTooLarge if big else ImageReadError
    with pytest.raises(kind) as caught:
        list(loader)
    assert str(caught.value).startswith(f"{dataset.paths[1]}: ")
    assert "\n" not in str(caught.value) and "Caught" not in str(caught.value)


def test_irra_augmentation_reads_under_data_max_image_pixels(tmp_path: Path) -> None:
    """Before: IRRA's transforms read every file at the default cap, so a run that lowered (or
    raised) data.max_image_pixels was not obeyed by person search's training images."""
    from vlret.data.formats.pedes.augment import build_augment
    from vlret.models.clip import CLIPImageTransform

    karpathy_world(tmp_path)
    image = tmp_path / "images" / "0.jpg"
    eval_transform = CLIPImageTransform(32)
    small = build_augment(
        karpathy_config(tmp_path, max_image_pixels=1000, train_transform="irra"), eval_transform
    )
    with pytest.raises(ImageTooLarge, match="0.jpg: 40 x 30"):
        small(image, key=(0, 0, 0))
    roomy = build_augment(
        karpathy_config(tmp_path, max_image_pixels=1200, train_transform="irra"), eval_transform
    )
    assert tuple(roomy(image, key=(0, 0, 0)).shape[-2:]) == (32, 32)


def test_a_decoded_image_is_not_held_to_a_later_readers_cap(tmp_path: Path) -> None:
    """Before: a reader that decoded under the run's raised cap (CSV, shards) handed the image
    to CLIPImageTransform, which refused it at its own default cap, without the file's name."""
    from vlret.models.clip import CLIPImageTransform

    path = tmp_path / "wide.png"
    Image.new("RGB", (40, 30), (10, 200, 30)).save(path)
    transform = CLIPImageTransform(32)
    transform.max_pixels = 1000  # below the image: a file is refused from its header
    with pytest.raises(ImageTooLarge, match="wide.png: 40 x 30"):
        transform(path)
    decoded = open_rgb(path, max_pixels=2000)  # a reader's own, higher cap
    assert tuple(transform(decoded).shape) == (3, 32, 32)
    with pytest.raises(ImageTooLarge, match="wide.png: 40 x 30"):  # lazily opened: still capped
        open_rgb(Image.open(path), max_pixels=1000)
