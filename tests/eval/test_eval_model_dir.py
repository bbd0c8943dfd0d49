"""`vlret eval --model-dir DIR`: zero-shot retrieval of a local pretrained Hugging Face CLIP that
vlret never trained, under the F30K / COCO 1K / COCO 5K protocols on Karpathy JSON + images.
The numbers equal a naive float64 computation from the model's own get_image_features /
get_text_features of each image and each caption alone."""

from __future__ import annotations

import json
import string
from pathlib import Path

import numpy as np
import pytest
import torch

from vlret.cli import main
from vlret.data.writers import make_tiny_karpathy
from vlret.models.clip import CLIPImageTransform
from vlret.run.evaluate import run_evaluation

transformers = pytest.importorskip("transformers")
pytest.importorskip("PIL.Image")

N_TEST, CAPS = 10, 5  # COCO 1K's 5 folds of 2 images


def write_tiny_clip(path: Path) -> None:
    """A tiny random CLIPModel, a character-level CLIP tokenizer (BPE without merges) and
    OpenAI's image processor at the tower's 8 px."""
    chars = string.ascii_lowercase + string.digits + ".,'-"
    vocab = {c: i for i, c in enumerate(chars)}
    vocab.update({f"{c}</w>": len(chars) + i for i, c in enumerate(chars)})
    vocab["<|startoftext|>"], vocab["<|endoftext|>"] = len(vocab), len(vocab) + 1
    path.mkdir(parents=True)
    (path / "vocab.json").write_text(json.dumps(vocab), encoding="utf-8")
    (path / "merges.txt").write_text("#version: 0.2\n", encoding="utf-8")
    tokenizer = transformers.CLIPTokenizer(
        str(path / "vocab.json"), str(path / "merges.txt"), model_max_length=64
    )
    tokenizer.save_pretrained(str(path))
    config = transformers.CLIPConfig(
        text_config=dict(
            vocab_size=len(vocab),
            hidden_size=16,
            intermediate_size=24,
            num_hidden_layers=1,
            num_attention_heads=2,
            max_position_embeddings=64,
            bos_token_id=vocab["<|startoftext|>"],
            eos_token_id=vocab["<|endoftext|>"],
            pad_token_id=vocab["<|endoftext|>"],
        ),
        vision_config=dict(
            image_size=8,
            patch_size=4,
            hidden_size=16,
            intermediate_size=24,
            num_hidden_layers=1,
            num_attention_heads=2,
        ),
        projection_dim=12,
    )
    torch.manual_seed(0)
    transformers.CLIPModel(config).save_pretrained(str(path))
    size = {"size": {"shortest_edge": 8}, "crop_size": {"height": 8, "width": 8}}
    transformers.CLIPImageProcessor(**size).save_pretrained(str(path))


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    root = tmp_path_factory.mktemp("zeroshot")
    write_tiny_clip(root / "clip")
    data = {}
    for name in ("coco", "f30k"):
        folder = root / name
        folder.mkdir()
        images = make_tiny_karpathy(
            folder / f"dataset_{name}.json",
            dataset=name,
            splits={"train": 2, "val": 2, "test": N_TEST},
            captions_per_image=CAPS,
            image_root=folder / "images",
            seed=3,
        )
        data[name] = (folder, [im for im in images if im.split == "test"])
    return root / "clip", data


def naive_metrics(model_dir: Path, folder: Path, images, folds: int) -> dict[str, float]:
    """Every caption and image encoded alone by CLIPModel, cosines in float64, ranks by loops."""
    clip = transformers.CLIPModel.from_pretrained(str(model_dir), local_files_only=True).eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(model_dir), local_files_only=True)
    transform = CLIPImageTransform.from_pretrained(model_dir)
    img, txt, owner = [], [], []
    with torch.no_grad():
        for k, im in enumerate(images):
            pixels = transform(im.path(folder / "images"))[None]
            out = clip.get_image_features(pixel_values=pixels)
            img.append(out if isinstance(out, torch.Tensor) else out.pooler_output)
            for sentence in im.sentences:
                ids = torch.tensor([tokenizer(sentence.raw)["input_ids"]])
                out = clip.get_text_features(input_ids=ids)
                txt.append(out if isinstance(out, torch.Tensor) else out.pooler_output)
                owner.append(k)
    a = torch.cat(img).double()
    b = torch.cat(txt).double()
    a, b = a / a.norm(dim=1, keepdim=True), b / b.norm(dim=1, keepdim=True)
    per_fold = []
    n = len(images) // folds
    for f in range(folds):
        keep_i = list(range(f * n, (f + 1) * n))
        keep_t = [t for t, k in enumerate(owner) if k in keep_i]
        sim = (a[keep_i] @ b[keep_t].T).tolist()
        own = [keep_i.index(owner[t]) for t in keep_t]
        i2t = []
        for i, row in enumerate(sim):  # rank of the image's best caption
            best = max(row[t] for t in range(len(keep_t)) if own[t] == i)
            i2t.append(sum(1 for s in row if s > best))
        t2i = []
        for t in range(len(keep_t)):
            col = [sim[i][t] for i in range(len(keep_i))]
            t2i.append(sum(1 for s in col if s > col[own[t]]))
        out = {}
        for name, ranks in (("i2t", i2t), ("t2i", t2i)):
            for k in (1, 5, 10):
                out[f"{name}_r{k}"] = 100.0 * sum(r < k for r in ranks) / len(ranks)
            out[f"{name}_meanr"] = float(np.mean(ranks)) + 1
        out["rsum"] = sum(v for key, v in out.items() if "_r" in key and "meanr" not in key)
        per_fold.append(out)
    return {key: float(np.mean([f[key] for f in per_fold])) for key in per_fold[0]}


@pytest.mark.parametrize(
    ("name", "protocol", "folds"),
    [("f30k", "f30k", 1), ("coco", "coco5k", 1), ("coco", "coco1k", 5)],
)
def test_model_dir_recalls_equal_a_naive_computation(
    world, tmp_path, capsys, name, protocol, folds
):
    model_dir, data = world
    folder, images = data[name]
    out = tmp_path / "m.json"
    argv = ["eval", "--model-dir", model_dir, "--data", folder, "--split", "test"]
    assert main([str(a) for a in [*argv, "--protocol", protocol, "--json", out]]) == 0
    printed = capsys.readouterr().out
    assert "R@1" in printed and "rsum" in printed
    record = json.loads(out.read_text())
    assert record["protocol"] == protocol and record["split"] == "test"
    expected = naive_metrics(model_dir, folder, images, folds)
    got = {k: record["metrics"][k] for k in expected}
    assert got == pytest.approx(expected, abs=1e-9)
    if folds > 1:
        assert len(record["folds"]) == folds


def test_model_dir_and_checkpoints_are_exclusive(world, tmp_path, capsys):
    model_dir, data = world
    folder, _ = data["f30k"]
    common = ["--data", folder, "--split", "test", "--protocol", "f30k"]
    assert (
        main([str(a) for a in ["eval", tmp_path / "a.pt", "--model-dir", model_dir, *common]]) == 2
    )
    err = capsys.readouterr().err.strip()
    assert err.startswith("vlret eval: --model-dir") and "not both" in err and "\n" not in err
    assert main([str(a) for a in ["eval", *common]]) == 2
    assert "--model-dir DIR" in capsys.readouterr().err
    with pytest.raises(ValueError, match="model_dir: .*not both"):
        run_evaluation(
            tmp_path / "a.pt", model_dir=model_dir, data=folder, split="test", protocol="f30k"
        )


def test_missing_or_wrong_model_dir_is_one_line(world, tmp_path, capsys):
    _, data = world
    folder, _ = data["f30k"]
    common = ["--data", folder, "--split", "test", "--protocol", "f30k"]
    missing = tmp_path / "absent"
    assert main([str(a) for a in ["eval", "--model-dir", missing, *common]]) == 2
    err = capsys.readouterr().err.strip()
    assert str(missing) in err and "never downloads" in err and "\n" not in err
    empty = tmp_path / "empty"
    empty.mkdir()
    assert main([str(a) for a in ["eval", "--model-dir", empty, *common]]) == 2
    err = capsys.readouterr().err.strip()
    assert str(empty) in err and "\n" not in err


def test_model_dir_refuses_a_split_the_protocol_does_not_evaluate(world, capsys):
    model_dir, data = world
    folder, _ = data["f30k"]
    argv = ["eval", "--model-dir", model_dir, "--data", folder, "--split", "testall"]
    assert main([str(a) for a in [*argv, "--protocol", "f30k"]]) == 2
    err = capsys.readouterr().err
    assert str(model_dir) in err and "testall" in err
