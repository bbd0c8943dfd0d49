"""Conformance: Hugging Face CLIP folders written by the installed ``transformers``'
``save_pretrained`` (and the older layouts it still reads) give in vlret the pixels, image
embeddings and text embeddings ``transformers`` itself computes from the same files.

The reference is ``transformers`` alone: its image processor read back from the folder
(``CLIPImageProcessor.from_pretrained``, which picks the layout itself), its tokenizer
(``AutoTokenizer``) and ``CLIPModel.get_image_features`` / ``get_text_features`` run in float64.
The image processor's settings are not CLIP's defaults (shorter side 40 px, 32 px crop, its own
mean and std, bilinear), so a reader that fell back to OpenAI's defaults fails every test here.

Tolerances (float32 against float64): the pixels are ``(x * r - m) / s`` with ``x`` an integer
and ``transformers`` rounding to float32 after the rescale, the subtraction and the division,
so they differ from the exact value by at most 3 rounding errors of the largest term, bound
here by ``8 * eps32 * (1 + max |pixel|)``. The embeddings go through 2 transformer layers of
width 32; a float32 forward pass of such a tiny network is measured to stay within
``1e-5 * max |embedding|`` of the float64 one here (it is ``~3e-7``), and ``1e-4`` relative
would still catch any preprocessing mistake, which moves the embeddings by ``O(1)``.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from vlret.cli import main

transformers = pytest.importorskip("transformers")
Image = pytest.importorskip("PIL.Image")
from clip_folder_helpers import (  # noqa: E402  (after the skips: it imports both)
    PROCESSOR,
    SIZES,
    tiny_clip_parts,
    write_folder,
    write_images,
)

EPS32 = float(np.finfo(np.float32).eps)
CAPTIONS = ["a red cat", "the dog", "cat on a mat", "a"]


@pytest.fixture(scope="module")
def parts(tmp_path_factory):
    return tiny_clip_parts(tmp_path_factory.mktemp("vocab"))


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    return write_images(tmp_path_factory.mktemp("images"))


def hf_reference(folder: Path, images: list[Path], captions: list[str]):
    """``(pixel_values, image features, text features, token ids)`` by transformers alone."""
    processor = transformers.CLIPImageProcessor.from_pretrained(str(folder), local_files_only=True)
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
    model = transformers.CLIPModel.from_pretrained(str(folder), local_files_only=True).double()
    opened = [Image.open(p) for p in images]
    pixels = processor(images=opened, return_tensors="pt")["pixel_values"]
    ids = [tokenizer(c)["input_ids"] for c in captions]
    with torch.no_grad():
        img = model.get_image_features(pixel_values=pixels.double())
        txt = [model.get_text_features(input_ids=torch.tensor([i])) for i in ids]
    pooled = [t if isinstance(t, torch.Tensor) else t.pooler_output for t in [img, *txt]]
    return pixels, pooled[0], torch.cat(pooled[1:]) if captions else None, ids


def vlret_features(folder: Path, images: list[Path], captions: list[str]):
    """``(pixel_values, image embeddings, text embeddings, token ids)`` as ``vlret zeroshot``
    and ``vlret eval --model-dir`` load the folder."""
    from vlret.data.dataset import pad_captions
    from vlret.eval.zeroshot import load_hf_clip

    model, tokenizer = load_hf_clip(folder)
    pixels = torch.stack([model.image_transform(p) for p in images])
    ids = [tokenizer.encode(c) for c in captions]
    with torch.no_grad():
        img = model.encode_images(pixels)
        if not captions:
            return pixels, img, None, ids
        padded, lengths = pad_captions([torch.tensor(i) for i in ids], pad_id=0)
        return pixels, img, model.encode_texts(padded, lengths), ids


def pixel_tolerance(pixels: torch.Tensor) -> float:
    return 8 * EPS32 * (1 + float(pixels.abs().max()))


def feature_tolerance(truth: torch.Tensor) -> float:
    return 1e-5 * float(truth.abs().max())


@pytest.mark.parametrize("layout", ["v5", "v4", "hub"])
def test_pixels_and_embeddings_equal_transformers_own(tmp_path, parts, images, layout):
    folder = write_folder(tmp_path / "clip", parts, layout)
    if layout == "v5":  # what 5.x writes: the image processor nested, no preprocessor file
        assert not (folder / "preprocessor_config.json").exists()
        assert "image_processor" in json.loads((folder / "processor_config.json").read_text())
    want_pixels, want_img, want_txt, want_ids = hf_reference(folder, images, CAPTIONS)
    pixels, img, txt, ids = vlret_features(folder, images, CAPTIONS)
    assert ids == want_ids
    assert ids == [parts[1](c)["input_ids"] for c in CAPTIONS]  # the tokenizer as built
    assert pixels.shape == want_pixels.shape == (len(SIZES), 3, 32, 32)
    assert (pixels.double() - want_pixels.double()).abs().max() <= pixel_tolerance(want_pixels)
    assert (img.double() - want_img).abs().max() <= feature_tolerance(want_img)
    assert (txt.double() - want_txt).abs().max() <= feature_tolerance(want_txt)


def test_openai_defaults_are_not_the_folder_processor(tmp_path, parts, images):
    """What the silent fallback gave: OpenAI's defaults are far from the saved processor, so the
    comparisons above can fail (the settings were chosen for that)."""
    from vlret.models.clip import CLIPImageTransform

    folder = write_folder(tmp_path / "clip", parts, "v5")
    want_pixels = hf_reference(folder, images, [])[0]
    (folder / "processor_config.json").unlink()  # the folder as vlret used to read it
    defaults = CLIPImageTransform.from_pretrained(folder, default_preprocessing="openai-clip")
    got = torch.stack([defaults(p) for p in images])
    assert (got - want_pixels).abs().max() > 0.5


@pytest.mark.parametrize(
    "settings",
    [
        {"size": {"height": 32, "width": 32}, "do_center_crop": False, "resample": 3},
        {"size": {"height": 36, "width": 48}, "crop_size": {"height": 32, "width": 32}},
        {"size": {"shortest_edge": 32}, "do_normalize": False, "resample": 0},
        {"size": {"shortest_edge": 45}, "do_rescale": False, "image_mean": 100.0,
         "image_std": 60.0, "resample": 1},
    ],
)  # fmt: skip
def test_other_processor_keys_equal_transformers_pixels(tmp_path, parts, images, settings):
    """Each key a CLIP image processor saves, with a value transformers' default does not have:
    an exact resize without crop, an exact resize then crop, no normalisation (nearest),
    no rescale with one number for mean and std (lanczos)."""
    model, tokenizer, _ = parts
    processor = transformers.CLIPImageProcessor(**{**PROCESSOR, **settings})
    folder = write_folder(tmp_path / "clip", (model, tokenizer, processor), "v5")
    want_pixels, want_img, _, _ = hf_reference(folder, images, [])
    pixels, img, _, _ = vlret_features(folder, images, [])
    assert pixels.shape == want_pixels.shape
    assert (pixels.double() - want_pixels.double()).abs().max() <= pixel_tolerance(want_pixels)
    assert (img.double() - want_img).abs().max() <= feature_tolerance(want_img)


def test_a_folder_without_tokenizer_files_is_refused_but_its_images_read(tmp_path, parts, images):
    from vlret.eval.zeroshot import load_hf_clip
    from vlret.models.clip import CLIPImageTransform

    folder = write_folder(tmp_path / "clip", parts, "v5", tokenizer_files=False)
    with pytest.raises(FileNotFoundError, match=r"no CLIP tokenizer files \(missing tokenizer"):
        load_hf_clip(folder)
    want_pixels = hf_reference_pixels(folder, images)
    got = torch.stack([CLIPImageTransform.from_pretrained(folder)(p) for p in images])
    assert (got.double() - want_pixels.double()).abs().max() <= pixel_tolerance(want_pixels)


def hf_reference_pixels(folder: Path, images: list[Path]) -> torch.Tensor:
    processor = transformers.CLIPImageProcessor.from_pretrained(str(folder), local_files_only=True)
    return processor(images=[Image.open(p) for p in images], return_tensors="pt")["pixel_values"]


def test_vlret_zeroshot_on_a_v5_folder_agrees_with_transformers(tmp_path, parts, capsys):
    """The command a user runs, end to end: ``vlret zeroshot`` on a folder 5.x wrote and an
    image folder of PNGs, against CLIP_benchmark's classifier built from transformers' own
    features in float64."""
    folder = write_folder(tmp_path / "clip", parts, "v5")
    classes = ["cat", "dog", "mat"]
    data = tmp_path / "zs"
    rng = np.random.default_rng(3)
    paths, labels = [], []
    for label, name in enumerate(classes):
        (data / name).mkdir(parents=True)
        for k in range(4):
            w, h = (int(v) for v in rng.integers(33, 70, size=2))
            path = data / name / f"{k}.png"
            Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)).save(path)
            paths.append(path)
            labels.append(label)
    templates = ["a photo of a {c}.", "a {c}"]
    (tmp_path / "templates.txt").write_text("\n".join(templates) + "\n")
    out = tmp_path / "zs.json"
    argv = ["zeroshot", "--model", str(folder), "--dataset", "imagefolder", "--data-root",
            str(data), "--templates", str(tmp_path / "templates.txt"), "--json", str(out),
            "--device", "cpu", "--no-progress"]  # fmt: skip
    assert main(argv) == 0, capsys.readouterr().err
    record = json.loads(out.read_text())
    prompts = [t.replace("{c}", c) for c in classes for t in templates]
    _, img, txt, _ = hf_reference(folder, paths, prompts)
    img = img / img.norm(dim=1, keepdim=True)
    txt = (txt / txt.norm(dim=1, keepdim=True)).reshape(len(classes), len(templates), -1).mean(1)
    logits = img @ (txt / txt.norm(dim=1, keepdim=True)).T
    top = logits.topk(2, dim=1).values
    assert (top[:, 0] - top[:, 1]).min() > 1e-4  # no near-tie a float32 rounding could flip
    pred = logits.argmax(1).tolist()
    acc1 = sum(p == y for p, y in zip(pred, labels, strict=True)) / len(labels)
    recall = np.mean([
        np.mean([p == y for p, y in zip(pred, labels, strict=True) if y == c])
        for c in range(len(classes))
    ])  # fmt: skip
    assert record["metrics"]["acc1"] == pytest.approx(acc1, abs=1e-12)
    assert record["metrics"]["mean_per_class_recall"] == pytest.approx(recall, abs=1e-12)


def test_vlret_eval_model_dir_on_a_v5_folder_agrees_with_transformers(tmp_path, parts):
    """``vlret eval --model-dir`` on a folder 5.x wrote: the F30K protocol's recalls from
    transformers' own float64 features of each image and caption."""
    from vlret.data.writers import make_tiny_karpathy
    from vlret.run.evaluate import run_evaluation

    folder = write_folder(tmp_path / "clip", parts, "v5")
    data = tmp_path / "f30k"
    data.mkdir()
    written = make_tiny_karpathy(
        data / "dataset_f30k.json", dataset="f30k", splits={"train": 1, "val": 1, "test": 8},
        captions_per_image=5, image_root=data / "images", seed=5,
    )  # fmt: skip
    test = [im for im in written if im.split == "test"]
    paths = [im.path(data / "images") for im in test]
    sentences = [s.raw for im in test for s in im.sentences]
    result = run_evaluation(
        None, data=data, split="test", protocol="f30k", model_dir=folder, progress=False
    )
    _, img, txt, _ = hf_reference(folder, paths, sentences)
    sim = (img / img.norm(dim=1, keepdim=True)) @ (txt / txt.norm(dim=1, keepdim=True)).T
    owner = torch.arange(len(sentences)) // 5
    t2i_ranks = [(sim[:, t] > sim[owner[t], t]).sum().item() for t in range(len(sentences))]
    i2t_ranks = [(sim[i] > sim[i, owner == i].max()).sum().item() for i in range(len(test))]
    want = {f"i2t_r{k}": 100 * np.mean([r < k for r in i2t_ranks]) for k in (1, 5, 10)}
    want.update({f"t2i_r{k}": 100 * np.mean([r < k for r in t2i_ranks]) for k in (1, 5, 10)})
    for key, value in want.items():
        assert result.metrics[key] == pytest.approx(value, abs=1e-9), key
