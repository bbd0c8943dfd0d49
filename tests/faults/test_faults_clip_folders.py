"""Issue 39, Hugging Face CLIP folders (items 6, 7 and 12): what vlret does with a CLIP folder
that transformers 5 wrote, that lacks its processor, tokenizer or weights, or whose weights do
not fit its config. Each case is one line naming the folder, file or key (through the CLI:
exit 2, one line on stderr), or, for the processor, read as transformers reads it."""

from __future__ import annotations

import json
import os
import pickle
import shutil
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

from vlret.cli import main

transformers = pytest.importorskip("transformers")
Image = pytest.importorskip("PIL.Image")
from clip_folder_helpers import tiny_clip_parts, write_folder, write_vocab  # noqa: E402


@pytest.fixture(scope="module")
def parts(tmp_path_factory):
    return tiny_clip_parts(tmp_path_factory.mktemp("vocab"))


@pytest.fixture(scope="module")
def datasets(tmp_path_factory):
    """An image folder for ``vlret zeroshot`` and Karpathy data for ``vlret eval``."""
    from vlret.data.writers import make_tiny_karpathy

    root = tmp_path_factory.mktemp("data")
    rng = np.random.default_rng(0)
    for name in ("cat", "dog"):
        (root / "zs" / name).mkdir(parents=True)
        for k in range(2):
            pixels = rng.integers(0, 256, (40, 36, 3), dtype=np.uint8)
            Image.fromarray(pixels).save(root / "zs" / name / f"{k}.png")
    (root / "f30k").mkdir()
    make_tiny_karpathy(
        root / "f30k" / "dataset_f30k.json", dataset="f30k",
        splits={"train": 1, "val": 1, "test": 4}, captions_per_image=5,
        image_root=root / "f30k" / "images", seed=1,
    )  # fmt: skip
    return root / "zs", root / "f30k"


def zeroshot(folder: Path, data: Path, *extra: str) -> list[str]:
    return ["zeroshot", "--model", str(folder), "--dataset", "imagefolder", "--data-root",
            str(data), "--device", "cpu", "--no-progress", *extra]  # fmt: skip


def eval_model_dir(folder: Path, data: Path) -> list[str]:
    return ["eval", "--model-dir", str(folder), "--data", str(data), "--split", "test",
            "--protocol", "f30k", "--no-progress"]  # fmt: skip


def both_commands(folder: Path, datasets) -> list[tuple[list[str], str]]:
    """``vlret zeroshot`` and ``vlret eval --model-dir`` on ``folder``, with their names."""
    zs, f30k = datasets
    return [(zeroshot(folder, zs), "zeroshot"), (eval_model_dir(folder, f30k), "eval")]


def one_line_error(argv: list[str], capsys, command: str) -> str:
    """Run the CLI expecting exit 2 and exactly one line on stderr; return it."""
    capsys.readouterr()
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"vlret {command}: ") and "\n" not in err, err
    return err


# ------------------------------------------------------------------------------------------
# Item 6: the processor file in either layout, or a named opt-in to defaults
# ------------------------------------------------------------------------------------------


def test_item6_a_folder_without_processor_file_is_refused(tmp_path, parts, datasets, capsys):
    from vlret.models.clip import load_clip

    folder = write_folder(tmp_path / "clip", parts, "none")
    with pytest.raises(FileNotFoundError, match=r"no processor_config.json or preprocessor_"):
        load_clip(folder)
    zs, f30k = datasets
    err = one_line_error(zeroshot(folder, zs), capsys, "zeroshot")
    assert str(folder) in err and "CLIPProcessor.save_pretrained" in err
    assert (
        "default_preprocessing 'openai-clip' (the model key; vlret zeroshot and vlret eval "
        "--model-dir: --default-preprocessing)" in err
    )
    err = one_line_error(eval_model_dir(folder, f30k), capsys, "eval")
    assert "no processor_config.json or preprocessor_config.json" in err


def test_item6_openai_clip_defaults_are_a_named_opt_in(tmp_path, parts, datasets, capsys):
    from vlret.cli._common import DEFAULT_PREPROCESSINGS as CLI_CHOICES
    from vlret.models import build_model
    from vlret.models.clip import CLIP_MEAN, CLIP_STD, CLIPImageTransform
    from vlret.models.clip_folder import DEFAULT_PREPROCESSINGS

    assert CLI_CHOICES == DEFAULT_PREPROCESSINGS
    folder = write_folder(tmp_path / "clip", parts, "none")
    zs, _ = datasets
    assert main(zeroshot(folder, zs, "--default-preprocessing", "openai-clip")) == 0
    model = build_model(
        {"kind": "clip", "path": str(folder), "default_preprocessing": "openai-clip"}
    )
    transform = model.image_transform
    assert (transform.crop, transform.resize, transform.crop_offsets) == ((32, 32), 32, "round")
    assert np.allclose(transform.mean, CLIP_MEAN) and np.allclose(transform.std, CLIP_STD)
    image = Image.new("RGB", (45, 40), (200, 30, 90))
    assert torch.equal(transform(image), CLIPImageTransform(32)(image))
    with pytest.raises(ValueError, match=r"default_preprocessing: expected one of \['openai-cl"):
        build_model({"kind": "clip", "path": str(folder), "default_preprocessing": "imagenet"})
    # with a processor file the named defaults are not used
    v5 = write_folder(tmp_path / "v5", parts, "v5")
    model = build_model({"kind": "clip", "path": str(v5), "default_preprocessing": "openai-clip"})
    assert model.image_transform.crop_offsets == "floor"
    assert np.allclose(model.image_transform.mean, [0.3, 0.5, 0.7])


def test_item6_eval_model_dir_takes_the_named_opt_in_too(tmp_path, parts, datasets, capsys):
    """Before: only vlret zeroshot could opt in; eval --model-dir refused such a folder with no
    way through but saving a processor."""
    folder = write_folder(tmp_path / "clip", parts, "none")
    _, f30k = datasets
    opted = [*eval_model_dir(folder, f30k), "--default-preprocessing", "openai-clip"]
    capsys.readouterr()
    assert main(opted) == 0
    assert "rsum" in capsys.readouterr().out
    # a checkpoint keeps its own preprocessing: the flag is refused without --model-dir
    argv = ["eval", str(tmp_path / "x.pt"), "--data", str(f30k), "--split", "test",
            "--protocol", "f30k", "--default-preprocessing", "openai-clip"]  # fmt: skip
    assert "--default-preprocessing applies to --model-dir" in one_line_error(argv, capsys, "eval")


def write_processor(folder: Path, image_processor: object, *, nested: bool = True) -> None:
    if nested:
        data = {"image_processor": image_processor, "processor_class": "CLIPProcessor"}
        (folder / "processor_config.json").write_text(json.dumps(data))
    else:
        (folder / "preprocessor_config.json").write_text(json.dumps(image_processor))


@pytest.mark.parametrize(
    ("image_processor", "match"),
    [
        ({"size": {"shortest_edge": 40, "longest_edge": 80}}, r"size \{'shortest_edge': 40, "
         r"'longest_edge': 80\} is not read by vlret; expected an int or \{\"shortest_edge"),
        ({"image_processor_type": "SiglipImageProcessor"}, r"image_processor_type 'Siglip\w+' "
         r"is not CLIP's"),
        ({"image_mean": [0.5, 0.5]}, r"image_mean must be 3 numbers \(R, G, B\), got \[0.5, 0.5"),
        ({"image_std": [0.5, 0.0, 0.5]}, r"image_std must be positive"),
        ({"resample": 9}, r"resample must be one of PIL's filter numbers \[0, 1, 2, 3, 4, 5\]"),
        ({"do_resize": "yes"}, r"do_resize must be true or false, got 'yes'"),
        ({"size": 24, "crop_size": 32}, r"size 24 \(shorter side\) is smaller than crop_size"),
        ({"size": 40, "do_center_crop": False}, r"do_center_crop is false and size is not an "
         r"exact height and width"),
        ({"size": 24, "crop_size": 24}, r"gives 24 x 24 images but config.json's vision_config "
         r"image_size is 32"),
        ([1, 2], r"image_processor is list; expected an object"),
    ],
)  # fmt: skip
def test_item6_processor_keys_vlret_cannot_apply_name_file_and_key(
    tmp_path, parts, image_processor, match
):
    from vlret.models.clip import load_clip

    folder = write_folder(tmp_path / "clip", parts, "none")
    write_processor(folder, image_processor)
    with pytest.raises(ValueError, match=match) as info:
        load_clip(folder)
    assert "processor_config.json" in str(info.value) or str(folder) in str(info.value)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("both", [False, True])
def test_item6_layouts_are_read_in_transformers_order(tmp_path, parts, both):
    """``processor_config.json``'s ``image_processor`` first, else ``preprocessor_config.json``
    (a processor file that holds no image processor falls through), as transformers' own
    ``CLIPImageProcessor.from_pretrained`` reads the same folder."""
    from vlret.models.clip import CLIPImageTransform

    folder = write_folder(tmp_path / "clip", parts, "none")
    old = {"size": 36, "crop_size": 32, "image_mean": [0.1, 0.2, 0.3], "resample": 2}
    new = {"size": {"shortest_edge": 44}, "crop_size": {"height": 32, "width": 32},
           "image_std": [0.4, 0.3, 0.2], "image_processor_type": "CLIPImageProcessor"}  # fmt: skip
    write_processor(folder, old, nested=False)
    if both:
        write_processor(folder, new)
    else:
        (folder / "processor_config.json").write_text('{"processor_class": "CLIPProcessor"}')
    image = Image.new("RGB", (53, 47))
    image.putdata([((7 * i) % 256, (3 * i) % 256, (11 * i) % 256) for i in range(53 * 47)])
    processor = transformers.CLIPImageProcessor.from_pretrained(str(folder), local_files_only=True)
    want = processor(images=image, return_tensors="pt")["pixel_values"][0]
    got = CLIPImageTransform.from_pretrained(folder)(image)
    assert got.shape == want.shape == (3, 32, 32)
    assert (got - want).abs().max() <= 8 * float(np.finfo(np.float32).eps) * (1 + want.abs().max())


# ------------------------------------------------------------------------------------------
# Item 7: no tokenizer files
# ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("keep", [(), ("vocab.json",)])
def test_item7_a_folder_without_tokenizer_files_is_refused(tmp_path, parts, datasets, capsys, keep):
    folder = write_folder(tmp_path / "clip", parts, "v5", tokenizer_files=False)
    if keep:  # half of the slow tokenizer's pair
        parts[1].save_pretrained(str(tmp_path / "tok"))
        shutil.copy(tmp_path / "tok" / "tokenizer.json", folder / "vocab.json")
    zs, f30k = datasets
    err = one_line_error(zeroshot(folder, zs), capsys, "zeroshot")
    missing = "tokenizer.json, merges.txt" if keep else "tokenizer.json, vocab.json, merges.txt"
    assert f"{folder}: no CLIP tokenizer files (missing {missing};" in err
    err = one_line_error(eval_model_dir(folder, f30k), capsys, "eval")
    assert "no CLIP tokenizer files" in err


# ------------------------------------------------------------------------------------------
# Item 12: weights missing, of another image size, or a pickle that is not weights
# ------------------------------------------------------------------------------------------


def test_item12_no_weights_is_one_line(tmp_path, parts, datasets, capsys):
    folder = write_folder(tmp_path / "clip", parts, "v5")
    (folder / "model.safetensors").unlink()
    for argv, command in both_commands(folder, datasets):
        err = one_line_error(argv, capsys, command)
        assert f"{folder}: no CLIP weights (expected model.safetensors or pytorch_model.bin" in err


def bigger_weights(tmp_path: Path, parts, *, binary: bool) -> Path:
    """The folder's config.json (32 px) over weights saved for 64 px images."""
    model = parts[0]
    config = model.config.to_dict()
    config["vision_config"]["image_size"] = 64
    big = transformers.CLIPModel(transformers.CLIPConfig(**config))
    folder = write_folder(tmp_path / "clip", parts, "v5")
    (folder / "model.safetensors").unlink()
    if binary:
        torch.save(big.state_dict(), folder / "pytorch_model.bin")
    else:
        big.save_pretrained(str(tmp_path / "big"))
        shutil.copy(tmp_path / "big" / "model.safetensors", folder / "model.safetensors")
    return folder


@pytest.mark.parametrize("binary", [False, True])
def test_item12_weights_of_another_image_size_are_one_line(
    tmp_path, parts, datasets, capsys, binary
):
    folder = bigger_weights(tmp_path, parts, binary=binary)
    name = "pytorch_model.bin" if binary else "model.safetensors"
    for argv, command in both_commands(folder, datasets):
        err = one_line_error(argv, capsys, command)
        assert (
            f"{folder / name}: vision_model.embeddings.position_embedding.weight has shape " in err
        )
        assert "[65, 32] but config.json gives [17, 32] (weights of another image size?" in err


class Payload:
    """Unpickling it would create a marker file."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.mkdir, (str(self.marker),))


@pytest.mark.parametrize("writer", ["torch.save", "pickle.dump"])
def test_item12_a_malicious_pytorch_model_bin_is_refused_in_one_line(
    tmp_path, parts, datasets, capsys, writer
):
    folder = write_folder(tmp_path / "clip", parts, "v5")
    (folder / "model.safetensors").unlink()
    marker = tmp_path / "payload-ran"
    state = {"text_projection.weight": Payload(marker)}
    if writer == "torch.save":
        torch.save(state, folder / "pytorch_model.bin")
    else:
        with open(folder / "pytorch_model.bin", "wb") as f:
            pickle.dump(state, f)
    for argv, command in both_commands(folder, datasets):
        err = one_line_error(argv, capsys, command)
        assert (
            f"{folder / 'pytorch_model.bin'}: refused: it holds pickled objects other than" in err
        )
    assert not marker.exists()


@pytest.mark.parametrize("nested", [True, False])
def test_item6_backbone_folders_read_either_layout_too(tmp_path, nested):
    """A ResNet / ViT backbone folder's image processor gives the mean and std in either
    layout (transformers 5's processor_config.json nests it under image_processor)."""
    from vlret.models.backbones import backbone_transform

    keys = transformers.ViTImageProcessor(image_mean=[0.5, 0.4, 0.3], image_std=0.25).to_dict()
    write_processor(tmp_path, keys, nested=nested)
    transform = backbone_transform("vit", transformers.ViTConfig(image_size=16), path=tmp_path)
    assert np.allclose(transform.mean, [0.5, 0.4, 0.3]) and np.allclose(transform.std, 0.25)
    keys["image_mean"] = [0.5, 0.4]
    write_processor(tmp_path, keys, nested=nested)
    with pytest.raises(ValueError, match=r"image_mean must be 3 numbers \(R, G, B\)"):
        backbone_transform("vit", transformers.ViTConfig(image_size=16), path=tmp_path)


def test_item7_training_on_a_clip_folder_without_tokenizer_files_is_refused(tmp_path, parts):
    """The caption encoder of a run fine-tuning a local CLIP is the folder's tokenizer: the same
    refusal before training (unless data.tokenizer names another tokenizer folder)."""
    from vlret.data.config import DataConfig
    from vlret.run.builders import build_encoder

    folder = write_folder(tmp_path / "clip", parts, "v5", tokenizer_files=False)
    data = DataConfig(root=str(tmp_path), format="karpathy")
    with pytest.raises(FileNotFoundError, match=r"no CLIP tokenizer files \(missing tokenizer"):
        build_encoder(data, model={"kind": "clip", "path": str(folder)})
    other = write_folder(tmp_path / "with_tokenizer", parts, "v5")
    data = DataConfig(root=str(tmp_path), format="karpathy", tokenizer=str(other))
    encoder = build_encoder(data, model={"kind": "clip", "path": str(folder)})
    assert encoder.encode("the cat") == parts[1]("the cat")["input_ids"]


def test_item6_a_checkpoint_trained_on_a_folder_without_processor_still_evaluates(tmp_path, parts):
    """A checkpoint of a run trained before such folders were refused (OpenAI CLIP's
    preprocessing, silently) is rebuilt with that preprocessing, with a warning naming the
    folder, instead of being refused; a folder with a processor file is read as it says."""
    from vlret.models import build_model
    from vlret.run.builders import stored_run

    data = {"root": str(tmp_path), "format": "karpathy"}
    bare = write_folder(tmp_path / "bare", parts, "none")
    with pytest.warns(UserWarning, match=r"bare holds no processor_config.json or preprocessor"):
        run = stored_run({"data": data, "model": {"kind": "clip", "path": str(bare)}}, source="x")
    assert run.model["default_preprocessing"] == "openai-clip"
    assert build_model(run.model).image_transform.crop == (32, 32)
    saved = write_folder(tmp_path / "v5", parts, "v5")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        run = stored_run({"data": data, "model": {"kind": "clip", "path": str(saved)}}, source="x")
    assert run.model.get("default_preprocessing") is None


# ------------------------------------------------------------------------------------------
# A tokenizer saved without model_max_length: captions are cut to the text tower's positions
# ------------------------------------------------------------------------------------------


def unlimited_tokenizer_folder(tmp_path: Path, parts) -> Path:
    """``parts``' model and processor with a tokenizer built as ``CLIPTokenizer(vocab_file,
    merges_file)`` and saved: transformers writes its "no limit" sentinel (~1e30) as
    ``model_max_length``, while the text tower embeds only 64 positions."""
    model, _, image_processor = parts
    (tmp_path / "bpe").mkdir(parents=True)
    vocab_file, merges_file = write_vocab(tmp_path / "bpe")
    tokenizer = transformers.CLIPTokenizer(str(vocab_file), str(merges_file))
    assert tokenizer.model_max_length > 10**6
    return write_folder(tmp_path / "clip", (model, tokenizer, image_processor), "v5")


def long_captions_karpathy(root: Path) -> tuple[list[Path], list[str]]:
    """Karpathy data whose captions run to ~3 times the 64 positions (the tiny BPE spells most
    words letter by letter): ``(test image paths, test captions)``, each caption distinct within
    its first 64 tokens."""
    from vlret.data.writers import make_tiny_karpathy

    root.mkdir()
    path = root / "dataset_f30k.json"
    written = make_tiny_karpathy(
        path, dataset="f30k", splits={"train": 1, "val": 1, "test": 6}, captions_per_image=5,
        image_root=root / "images", seed=4,
    )  # fmt: skip
    record = json.loads(path.read_text())
    for image in record["images"]:
        for sentence in image["sentences"]:
            sentence["raw"] = f"{sentence['raw']} " + " ".join(["a long tail of words"] * 10)
    path.write_text(json.dumps(record))
    test = [im for im in record["images"] if im["split"] == "test"]
    paths = [im.path(root / "images") for im in written if im.split == "test"]
    return paths, [s["raw"] for im in test for s in im["sentences"]]


def truncated_reference(folder: Path, images: list[Path], captions: list[str], positions: int):
    """``(image features, text features, ids)`` by transformers alone in float64, the captions
    padded and truncated to ``positions`` as CLIPProcessor users do."""
    processor = transformers.CLIPImageProcessor.from_pretrained(str(folder), local_files_only=True)
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
    model = transformers.CLIPModel.from_pretrained(str(folder), local_files_only=True).double()
    pixels = processor(images=[Image.open(p) for p in images], return_tensors="pt")
    tokens = tokenizer(
        captions, padding="max_length", truncation=True, max_length=positions, return_tensors="pt"
    )
    with torch.no_grad():
        img = model.get_image_features(pixel_values=pixels["pixel_values"].double())
        txt = model.get_text_features(**tokens)
    img, txt = (t if isinstance(t, torch.Tensor) else t.pooler_output for t in (img, txt))
    ids = [
        row[: int(n)].tolist()
        for row, n in zip(tokens["input_ids"], tokens["attention_mask"].sum(1), strict=True)
    ]
    return img, txt, ids


@pytest.mark.parametrize("loader", ["eval", "zeroshot", "train"])
def test_a_tokenizer_without_model_max_length_is_cut_to_the_text_positions(tmp_path, parts, loader):
    """Each way vlret loads the folder's tokenizer (``vlret eval --model-dir``, ``vlret
    zeroshot``, a run with ``model.path``) truncates to the text tower's 64 positions: the ids
    and text embeddings are transformers' own on the truncated captions."""
    from vlret.data.dataset import pad_captions

    folder = unlimited_tokenizer_folder(tmp_path, parts)
    images, captions = long_captions_karpathy(tmp_path / "f30k")
    _, want, want_ids = truncated_reference(folder, images[:1], captions, 64)
    if loader == "eval":
        from vlret.run.builders import load_pretrained_clip

        model, _, encoder = load_pretrained_clip(folder)
    elif loader == "zeroshot":
        from vlret.eval.zeroshot import load_hf_clip

        model, encoder = load_hf_clip(folder)
    else:
        from vlret.data.config import DataConfig
        from vlret.models import build_model
        from vlret.run.builders import build_encoder, encoder_from_state

        config = {"kind": "clip", "path": str(folder), "proj_dim": None}
        encoder = build_encoder(DataConfig(root=str(tmp_path), format="karpathy"), model=config)
        stored = encoder_from_state({"kind": "hf", "path": str(folder)}, model=config)
        assert stored.max_length == encoder.max_length == 64  # a checkpoint evaluates alike
        model = build_model(config).eval()
    ids = [encoder.encode(c) for c in captions]
    assert max(len(i) for i in ids) == 64 < len(parts[1](captions[0])["input_ids"])
    assert ids == want_ids
    padded, lengths = pad_captions([torch.tensor(i) for i in ids], pad_id=encoder.pad_id)
    with torch.no_grad():
        got = model.encode_texts(padded, lengths).double()
    assert (got - want).abs().max() <= 1e-5 * float(want.abs().max())


def test_vlret_eval_model_dir_with_long_captions_agrees_with_transformers(tmp_path, parts, capsys):
    """``vlret eval --model-dir`` on such a folder and captions longer than 64 tokens runs (it
    stopped in transformers' "Sequence length must be less than max_position_embeddings") and
    gives the F30K recalls of transformers' own float64 features of the truncated captions."""
    folder = unlimited_tokenizer_folder(tmp_path, parts)
    images, captions = long_captions_karpathy(tmp_path / "f30k")
    out = tmp_path / "eval.json"
    argv = [*eval_model_dir(folder, tmp_path / "f30k"), "--json", str(out), "--device", "cpu"]
    assert main(argv) == 0, capsys.readouterr().err
    metrics = json.loads(out.read_text())["metrics"]
    img, txt, _ = truncated_reference(folder, images, captions, 64)
    sim = (img / img.norm(dim=1, keepdim=True)) @ (txt / txt.norm(dim=1, keepdim=True)).T
    owner = torch.arange(len(captions)) // 5
    t2i = [(sim[:, t] > sim[owner[t], t]).sum().item() for t in range(len(captions))]
    i2t = [(sim[i] > sim[i, owner == i].max()).sum().item() for i in range(len(images))]
    want = {f"i2t_r{k}": 100 * np.mean([r < k for r in i2t]) for k in (1, 5, 10)}
    want.update({f"t2i_r{k}": 100 * np.mean([r < k for r in t2i]) for k in (1, 5, 10)})
    for key, value in want.items():
        assert metrics[key] == pytest.approx(value, abs=1e-9), key


def test_a_smaller_model_max_length_is_kept_and_a_preset_caps_too(tmp_path, parts):
    """A tokenizer limit below the text positions stays; a CLIP built from a preset truncates
    ``data.tokenizer``'s captions to its own (configured) positions."""
    from vlret.data.config import DataConfig
    from vlret.run.builders import build_encoder

    model, _, image_processor = parts
    (tmp_path / "bpe").mkdir()
    vocab_file, merges_file = write_vocab(tmp_path / "bpe")
    short = transformers.CLIPTokenizer(str(vocab_file), str(merges_file), model_max_length=20)
    folder = write_folder(tmp_path / "short", (model, short, image_processor), "v5")
    data = DataConfig(root=str(tmp_path), format="karpathy")
    assert build_encoder(data, model={"kind": "clip", "path": str(folder)}).max_length == 20
    unlimited = unlimited_tokenizer_folder(tmp_path / "u", parts)
    data = DataConfig(root=str(tmp_path), format="karpathy", tokenizer=str(unlimited))
    preset = {"kind": "clip", "preset": "ViT-B-32"}
    assert build_encoder(data, model=preset).max_length == 77
    preset["config"] = {"text_config": {"max_position_embeddings": 48}}
    encoder = build_encoder(data, model=preset)
    assert encoder.max_length == 48 and len(encoder.encode("the cat " * 40)) == 48
