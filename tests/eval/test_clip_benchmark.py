"""CLIP_benchmark interop: ``vlret zeroshot --json`` and ``vlret eval --json-format
clip_benchmark`` write records that CLIP_benchmark's ``build`` step merges into one table.

Facts taken from LAION-AI/CLIP_benchmark's source (``clip_benchmark/cli.py``,
``clip_benchmark/metrics/zeroshot_retrieval.py``), reimplemented here independently of vlret:

* a result file is ``{"dataset", "model", "pretrained", "task", "metrics", "language"}``;
  ``build`` reads each file, starts a row from its ``metrics``, adds the record's other keys,
  drops ``metrics``, adds ``model_fullname = model + " " + pretrained`` and writes every row
  under the union of the rows' keys (``csv.DictWriter``);
* ``scores = texts_emb @ images_emb.T`` of L2-normalised embeddings; a caption's positive is
  its own image; ``image_retrieval_recall@K`` is the fraction of captions with a positive among
  their top K images (``torch.topk`` of each row), ``text_retrieval_recall@K`` the fraction of
  images with at least one positive among their top K captions (of ``scores.T``).
"""

from __future__ import annotations

import csv
import json
import types
from pathlib import Path

import pytest
import torch
from test_eval_model_dir import write_tiny_clip
from torch import nn

from vlret.cli import main
from vlret.data.writers import make_tiny_karpathy
from vlret.eval.clip_benchmark import (
    RECALL_KS,
    architecture_name,
    check_retrieval_request,
    retrieval_dataset_name,
)
from vlret.models import build_model
from vlret.models.clip import CLIPImageTransform

transformers = pytest.importorskip("transformers")
Image = pytest.importorskip("PIL.Image")

N_TEST, CAPS = 10, 5  # COCO 1K's 5 folds of 2 images
#: the tiny CLIP of write_tiny_clip: vision 16 wide x 1 layer, patch 4, 8 px; text 16 x 1;
#: joint 12; transformers' default activation, OpenAI's quick_gelu
TINY_CLIP_NAME = "ViT-custom-v16x1-t16x1-p4-d12-8-quickgelu"


# -- CLIP_benchmark, reimplemented from the facts above -------------------------------------


def clip_benchmark_build(paths: list[Path], out: Path) -> list[dict[str, str]]:
    """``clip_benchmark build FILES --output OUT``; returns the CSV's rows as read back."""
    rows, fieldnames = [], []
    for path in paths:
        data = json.loads(path.read_text(encoding="utf-8"))
        row = dict(data["metrics"])
        row.update(data)
        del row["metrics"]
        row["model_fullname"] = row["model"] + " " + row["pretrained"]
        fieldnames += [k for k in row if k not in fieldnames]
        rows.append(row)
    with out.open("w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=fieldnames)
        writer.writeheader()
        writer.writerows(rows)
    with out.open(newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


def clip_benchmark_recalls(
    images: torch.Tensor, texts: torch.Tensor, owner: list[int], ks=RECALL_KS
) -> dict[str, float]:
    """CLIP_benchmark's zeroshot_retrieval metrics of normalised float64 embeddings (K is cut
    to the number of candidates, where CLIP_benchmark's ``topk`` would stop: every one is in
    the top K then)."""
    scores = texts @ images.T
    positive = torch.zeros_like(scores, dtype=torch.bool)
    positive[torch.arange(len(owner)), torch.tensor(owner)] = True
    out = {}
    for k in ks:
        # per caption: is its image among the k best images?
        top_images = torch.topk(scores, min(k, len(images)), dim=1).indices
        image_hits = positive.gather(1, top_images).any(dim=1)
        # per image: is any of its captions among the k best captions?
        top_texts = torch.topk(scores.T, min(k, len(texts)), dim=1).indices
        text_hits = positive.T.gather(1, top_texts).any(dim=1)
        out[f"image_retrieval_recall@{k}"] = image_hits.double().mean().item()
        out[f"text_retrieval_recall@{k}"] = text_hits.double().mean().item()
    return out


def transformers_embeddings(model_dir: Path, folder: Path, images):
    """Each image and caption encoded alone by transformers' own CLIPModel, float64, unit."""
    clip = transformers.CLIPModel.from_pretrained(str(model_dir), local_files_only=True).eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(model_dir), local_files_only=True)
    transform = CLIPImageTransform.from_pretrained(model_dir)
    img, txt, owner = [], [], []

    def pooled(out):
        return out if isinstance(out, torch.Tensor) else out.pooler_output

    with torch.no_grad():
        for k, im in enumerate(images):
            pixels = transform(im.path(folder / "images"))[None]
            img.append(pooled(clip.get_image_features(pixel_values=pixels)))
            for sentence in im.sentences:
                ids = torch.tensor([tokenizer(sentence.raw)["input_ids"]])
                txt.append(pooled(clip.get_text_features(input_ids=ids)))
                owner.append(k)
    a, b = torch.cat(img).double(), torch.cat(txt).double()
    return a / a.norm(dim=1, keepdim=True), b / b.norm(dim=1, keepdim=True), owner


# -- fixtures --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """A tiny Hugging Face CLIP, a Flickr30K-style Karpathy test split of 10 images x 5
    captions, and the synthetic world's two image-folder sets (by category and by colour)."""
    root = tmp_path_factory.mktemp("clip_benchmark")
    write_tiny_clip(root / "clip")
    folder = root / "f30k"
    folder.mkdir()
    images = make_tiny_karpathy(
        folder / "dataset_f30k.json",
        dataset="f30k",
        splits={"train": 2, "val": 2, "test": N_TEST},
        captions_per_image=CAPS,
        image_root=folder / "images",
        seed=3,
    )
    classes = {"category": ("cat", "dog", "fish"), "colour": ("red", "green")}
    for kind, names in classes.items():
        for c, name in enumerate(names):
            target = root / "pictures" / "imagefolder" / kind / "test" / name
            target.mkdir(parents=True)
            for i in range(2):
                Image.new("RGB", (12, 10), (90 * c, 40 * i, 120)).save(target / f"{i}.jpg")
    test = [im for im in images if im.split == "test"]
    return root / "clip", folder, test, root / "pictures" / "imagefolder"


def _eval_record(world, tmp_path, protocol: str) -> dict:
    model_dir, folder, _, _ = world
    out = tmp_path / f"{protocol}.json"
    argv = ["eval", "--model-dir", model_dir, "--data", folder, "--split", "test"]
    argv += ["--protocol", protocol, "--json", out, "--json-format", "clip_benchmark"]
    assert main([str(a) for a in [*argv, "--no-progress"]]) == 0
    return json.loads(out.read_text(encoding="utf-8"))


# -- the retrieval record ----------------------------------------------------------------------


@pytest.mark.parametrize(("protocol", "folds"), [("f30k", 1), ("coco1k", 5)])
def test_retrieval_record_is_clip_benchmarks_with_its_recall(world, tmp_path, protocol, folds):
    model_dir, folder, images, _ = world
    record = _eval_record(world, tmp_path, protocol)
    assert list(record) == [
        "dataset", "model", "pretrained", "task", "metrics", "language", "vlret",
    ]  # fmt: skip
    assert record["dataset"] == protocol and record["task"] == "zeroshot_retrieval"
    assert record["model"] == TINY_CLIP_NAME and record["pretrained"] == str(model_dir)
    assert record["language"] == "en"
    assert list(record["metrics"]) == [
        f"{side}_retrieval_recall@{k}" for k in RECALL_KS for side in ("image", "text")
    ]
    img, txt, owner = transformers_embeddings(model_dir, folder, images)
    n = N_TEST // folds  # coco1k: CLIP_benchmark's recall of each fold, averaged
    per_fold = []
    for f in range(folds):
        keep = [t for t, o in enumerate(owner) if f * n <= o < (f + 1) * n]
        local = [owner[t] - f * n for t in keep]
        per_fold.append(clip_benchmark_recalls(img[f * n : (f + 1) * n], txt[keep], local))
    want = {k: sum(p[k] for p in per_fold) / folds for k in per_fold[0]}
    assert record["metrics"] == pytest.approx(want, abs=1e-12)
    # 5 captions per image: an image is found when ANY of them is in the top K, so with 10
    # images x 50 captions text retrieval reaches 1 at K = 10 only if every image has one there
    assert 0.0 <= record["metrics"]["text_retrieval_recall@1"] <= 1.0
    scored = {"protocol": protocol, "split": "test", "n_images": N_TEST, "n_texts": N_TEST * CAPS}
    assert {k: record["vlret"][k] for k in scored} == scored
    assert record["vlret"].get("folds", 1) == folds


def test_the_recall_definitions_differ_where_captions_share_an_image():
    """The oracle itself: with two captions per image, text retrieval counts an image found
    when either caption is first, image retrieval counts each caption once."""
    images = torch.eye(2, dtype=torch.float64)
    texts = torch.tensor([[1.0, 0.0], [0.6, 0.8], [0.0, 1.0], [0.8, 0.6]], dtype=torch.float64)
    got = clip_benchmark_recalls(images, texts, [0, 0, 1, 1], ks=(1,))
    # captions 0 and 2 rank their own image first, 1 and 3 the other one; each image ranks one
    # of its own captions first (0 for image 0, 2 for image 1)
    assert got == {"image_retrieval_recall@1": 0.5, "text_retrieval_recall@1": 1.0}


def test_dataset_names_a_split_other_than_the_papers():
    assert retrieval_dataset_name("coco5k", "testall") == "coco5k"
    assert retrieval_dataset_name("coco5k", "test") == "coco5k"  # Karpathy COCO's 5000
    assert retrieval_dataset_name("coco5k", "dev") == "coco5k/dev"
    assert retrieval_dataset_name("f30k", "test") == "f30k"


def test_what_the_record_cannot_hold_is_refused_before_evaluating(world, tmp_path, capsys):
    with pytest.raises(ValueError, match="protocol cuhk-pedes counts same-identity as relevant"):
        check_retrieval_request("cuhk-pedes")
    with pytest.raises(ValueError, match="approximate shortlist protocol"):
        check_retrieval_request("f30k", approximate=True)
    with pytest.raises(ValueError, match=r"re-scored \(non-standard\)"):
        check_retrieval_request("coco5k", rescored=True)
    check_retrieval_request("msrvtt-1ka")  # a caption's own video: CLIP_benchmark's definition
    model_dir, folder, _, _ = world
    base = ["eval", "--model-dir", model_dir, "--data", folder, "--split", "test", "--no-progress"]
    cases = [
        (["--protocol", "f30k", "--json-format", "clip_benchmark"], "give --json OUT"),
        (["--protocol", "f30k", "--json", tmp_path / "r.json", "--json-format", "clip_benchmark",
          "--rescore", "dsl"], "re-scored (non-standard) evaluation"),
    ]  # fmt: skip
    for extra, words in cases:
        assert main([str(a) for a in [*base, *extra]]) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith("vlret eval: --json-format clip_benchmark: ") and words in err
        assert "\n" not in err and "Traceback" not in err
    assert not (tmp_path / "r.json").exists()


def test_vlret_format_stays_the_default(world, tmp_path):
    model_dir, folder, _, _ = world
    out = tmp_path / "m.json"
    argv = ["eval", "--model-dir", model_dir, "--data", folder, "--split", "test"]
    assert (
        main([str(a) for a in [*argv, "--protocol", "f30k", "--json", out, "--no-progress"]]) == 0
    )
    record = json.loads(out.read_text(encoding="utf-8"))
    assert record["protocol"] == "f30k" and "i2t_r1" in record["metrics"]


# -- zero-shot and retrieval in one table --------------------------------------------------------


def test_zeroshot_and_retrieval_records_merge_into_one_table(world, tmp_path, capsys):
    model_dir, _, _, folders = world
    paths = []
    # by category: the split folder itself; by colour: the set's folder holding test/
    for kind, root in (("category", folders / "category" / "test"), ("colour", folders / "colour")):
        out = tmp_path / f"zs_{kind}.json"
        argv = ["zeroshot", "--model", model_dir, "--dataset", "imagefolder", "--data-root", root]
        assert (
            main([str(a) for a in [*argv, "--json", out, "--no-progress", "--device", "cpu"]]) == 0
        )
        paths.append(out)
    retrieval = tmp_path / "retrieval.json"
    retrieval.write_text(json.dumps(_eval_record(world, tmp_path, "f30k")), encoding="utf-8")
    paths.append(retrieval)
    printed = capsys.readouterr().out
    assert "Zero-shot classification: imagefolder/category test (6 images, 3 classes" in printed
    rows = clip_benchmark_build(paths, tmp_path / "benchmark.csv")
    assert [r["dataset"] for r in rows] == ["imagefolder/category", "imagefolder/colour", "f30k"]
    assert [r["task"] for r in rows] == ["zeroshot_classification"] * 2 + ["zeroshot_retrieval"]
    assert len({(r["dataset"], r["model_fullname"], r["task"]) for r in rows}) == 3
    assert {r["model"] for r in rows} == {TINY_CLIP_NAME}  # the architecture, not a path
    assert {r["pretrained"] for r in rows} == {str(model_dir)}  # the weights
    assert {r["model_fullname"] for r in rows} == {f"{TINY_CLIP_NAME} {model_dir}"}
    for row, path in zip(rows, paths, strict=True):
        record = json.loads(path.read_text(encoding="utf-8"))
        for key, value in record["metrics"].items():  # each metric in its own column
            assert row[key] == ("" if value is None else str(value))
    zs, ret = rows[:2], rows[2]
    assert all(r["image_retrieval_recall@1"] == "" and r["acc1"] != "" for r in zs)
    assert ret["acc1"] == "" and ret["text_retrieval_recall@10"] != ""


# -- architecture names ------------------------------------------------------------------------


class _Towers(nn.Module):
    """A stand-in with a CLIP's shape: its towers' transformers configs and projections."""

    def __init__(self, vision: dict, text: dict, joint: int, crop=None, proj=None) -> None:
        super().__init__()
        self.image_encoder = nn.Module()
        self.image_encoder.vision_model = types.SimpleNamespace(
            config=transformers.CLIPVisionConfig(**vision)
        )
        self.image_encoder.visual_projection = nn.Linear(vision["hidden_size"], joint, bias=False)
        self.image_encoder.embed_proj = nn.Identity() if proj is None else nn.Linear(joint, proj)
        self.text_encoder = nn.Module()
        self.text_encoder.text_model = types.SimpleNamespace(
            config=transformers.CLIPTextConfig(**text)
        )
        if crop is not None:
            self.image_transform = types.SimpleNamespace(crop=crop)


def _vit(width, layers, patch, size=224, act="gelu") -> dict:
    return dict(
        hidden_size=width, num_hidden_layers=layers, num_attention_heads=width // 64,
        patch_size=patch, image_size=size, hidden_act=act,
    )  # fmt: skip


def test_clip_architectures_get_open_clips_names():
    b_text = {"hidden_size": 512, "num_hidden_layers": 12, "num_attention_heads": 8}
    l_text = {"hidden_size": 768, "num_hidden_layers": 12, "num_attention_heads": 12}
    assert architecture_name(_Towers(_vit(768, 12, 32), b_text, 512)) == "ViT-B-32"
    openai = _Towers(_vit(768, 12, 16, act="quick_gelu"), b_text, 512)
    assert architecture_name(openai) == "ViT-B-16-quickgelu"
    assert architecture_name(_Towers(_vit(1024, 24, 14, 336), l_text, 768)) == "ViT-L-14-336"
    # IRRA's person-search CLIP: OpenAI's ViT-B/16 at 384 x 128
    irra = _Towers(_vit(768, 12, 16, act="quick_gelu"), b_text, 512, crop=(384, 128))
    assert architecture_name(irra) == "ViT-B-16-384x128-quickgelu"
    # Unified B.1.2: vlret's projection to 768 on top of CLIP's
    tuned = _Towers(_vit(768, 12, 32), b_text, 512, proj=768)
    assert architecture_name(tuned) == "ViT-B-32-proj768"
    # a ViT-B vision tower with another text tower is no open_clip size
    small_text = {"hidden_size": 256, "num_hidden_layers": 4, "num_attention_heads": 4}
    odd = _Towers(_vit(768, 12, 32), small_text, 512)
    assert architecture_name(odd) == "ViT-custom-v768x12-t256x4-p32-d512-224"


def test_vlret_models_are_named_from_their_config():
    tiny = {
        "projection_dim": 64,
        "vision_config": {
            "hidden_size": 64,
            "intermediate_size": 256,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "image_size": 32,
            "patch_size": 8,
        },
        "text_config": {
            "hidden_size": 64,
            "intermediate_size": 256,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "max_position_embeddings": 77,
        },
    }  # fmt: skip  (synth_clip_pretrain's model)
    clip = build_model({"kind": "clip", "preset": "ViT-B-32", "tokenizer": "bytes", "config": tiny})
    assert architecture_name(clip) == "ViT-custom-v64x2-t64x2-p8-d64-32"
    vse = {
        "embed_dim": 16,
        "image": {"kind": "precomp", "in_dim": 8},
        "text": {"kind": "gru", "word_dim": 4},
    }
    assert architecture_name(build_model(vse, vocab_size=10)) == "vse-precomp-gru-16"
    regions = {"embed_dim": 16, "image": {"in_dim": 8}, "text": {"word_dim": 4}}
    scan = build_model({**regions, "kind": "scan", "direction": "t2i"}, vocab_size=10)
    assert architecture_name(scan) == "scan-t2i-16"
    assert architecture_name(build_model({**regions, "kind": "sgraf"}, vocab_size=10)) == (
        "sgraf-sgr-16"
    )
    assert architecture_name(nn.Linear(2, 2)) == "Linear"
