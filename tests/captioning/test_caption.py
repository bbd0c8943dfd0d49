"""`vlret caption`: tiny randomly initialised BLIP, BLIP-2 and GIT captioners saved by the tests
caption a tiny Karpathy folder and a rendered synthetic world, resumably."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers")
pytest.importorskip("PIL")

from vlret._files import OutputPathError  # noqa: E402
from vlret.captioning import read_captions_file, sidecar_path  # noqa: E402
from vlret.captioning.generate import (  # noqa: E402
    Captioner,
    CaptionSettings,
    caption_split,
    resolve_arch,
)
from vlret.cli import main  # noqa: E402
from vlret.data import KarpathyDataset  # noqa: E402
from vlret.data.writers import make_tiny_karpathy  # noqa: E402

WORDS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "[DEC]"] + [
    "a", "red", "blue", "square", "circle", "star", "on", "the", "of", "two", "picture",
]  # fmt: skip
VISION = {
    "hidden_size": 16,
    "intermediate_size": 20,
    "num_hidden_layers": 1,
    "num_attention_heads": 2,
    "image_size": 16,
    "patch_size": 8,
}


def _tokenizer(folder: Path, **special):
    from transformers import BertTokenizer

    folder.mkdir(parents=True, exist_ok=True)
    (folder / "vocab.txt").write_text("\n".join(WORDS) + "\n", encoding="utf-8")
    return BertTokenizer(str(folder / "vocab.txt"), **special)


def save_blip(folder: Path) -> Path:
    from transformers import (
        BlipConfig,
        BlipForConditionalGeneration,
        BlipImageProcessorPil,
        BlipProcessor,
    )

    text = {
        "vocab_size": len(WORDS),
        "hidden_size": 16,
        "intermediate_size": 20,
        "num_hidden_layers": 1,
        "num_attention_heads": 2,
        "max_position_embeddings": 64,
        "bos_token_id": 5,
        "pad_token_id": 0,
        "sep_token_id": 3,
        "eos_token_id": 3,
    }
    torch.manual_seed(0)
    model = BlipForConditionalGeneration(
        BlipConfig(text_config=text, vision_config=VISION, projection_dim=8)
    )
    model.save_pretrained(folder)
    tok = _tokenizer(folder / "tok", bos_token="[DEC]")  # BLIP's decoder start, as released
    size = {"height": 16, "width": 16}
    BlipProcessor(image_processor=BlipImageProcessorPil(size=size), tokenizer=tok).save_pretrained(
        folder
    )
    return folder


def save_git(folder: Path) -> Path:
    from transformers import CLIPImageProcessorPil, GitConfig, GitForCausalLM, GitProcessor

    torch.manual_seed(1)
    config = GitConfig(
        vision_config=VISION,
        vocab_size=len(WORDS),
        hidden_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=20,
        max_position_embeddings=64,
        bos_token_id=2,
        eos_token_id=3,
        pad_token_id=0,
    )
    GitForCausalLM(config).save_pretrained(folder)
    images = CLIPImageProcessorPil(
        size={"shortest_edge": 16}, crop_size={"height": 16, "width": 16}
    )
    GitProcessor(image_processor=images, tokenizer=_tokenizer(folder / "tok")).save_pretrained(
        folder
    )
    return folder


def save_blip2(folder: Path) -> Path:
    from transformers import (
        Blip2Config,
        Blip2ForConditionalGeneration,
        Blip2Processor,
        BlipImageProcessorPil,
    )

    tok = _tokenizer(folder / "tok")
    processor = Blip2Processor(
        image_processor=BlipImageProcessorPil(size={"height": 16, "width": 16}),
        tokenizer=tok,
        num_query_tokens=2,
    )  # adds the <image> token after the vocabulary
    image_token = tok.convert_tokens_to_ids("<image>")
    config = Blip2Config(
        vision_config=VISION,
        qformer_config={
            "vocab_size": len(WORDS),
            "hidden_size": 16,
            "num_hidden_layers": 1,
            "num_attention_heads": 2,
            "intermediate_size": 20,
            "encoder_hidden_size": 16,
            "max_position_embeddings": 64,
        },
        text_config={
            "model_type": "opt",
            "vocab_size": len(WORDS) + 1,
            "hidden_size": 16,
            "num_hidden_layers": 1,
            "ffn_dim": 20,
            "num_attention_heads": 2,
            "word_embed_proj_dim": 16,
            "max_position_embeddings": 64,
            "bos_token_id": 2,
            "eos_token_id": 3,
            "pad_token_id": 0,
        },
        num_query_tokens=2,
        image_token_index=image_token,
    )
    torch.manual_seed(2)
    Blip2ForConditionalGeneration(config).save_pretrained(folder)
    processor.save_pretrained(folder)
    return folder


SAVERS = {"blip": save_blip, "blip2": save_blip2, "git": save_git}


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("captioners")
    return {name: save(root / name) for name, save in SAVERS.items()}


@pytest.fixture(scope="module")
def karpathy(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("karpathy")
    make_tiny_karpathy(
        root / "dataset_flickr30k.json",
        dataset="flickr30k",
        splits={"train": 5, "val": 2, "test": 2},
        image_root=root / "images",
    )
    return root


class _Oracle:
    """Stands in for a captioner: each image's caption is its mean pixel value, so the file's
    order is checked against the split's own images."""

    def __init__(self, *args, **kwargs) -> None:
        self.calls = 0

    def __call__(self, images, settings):
        self.calls += 1
        import numpy as np

        return [[f"mean {np.asarray(im).mean():.4f}"] for im in images]


@pytest.mark.parametrize("arch", ["blip", "blip2", "git"])
def test_each_captioner_writes_an_aligned_file(models, karpathy, tmp_path, arch) -> None:
    assert resolve_arch(models[arch]) == arch  # auto reads config.json's model_type
    out = tmp_path / "train_caps.txt"
    settings = CaptionSettings(batch_size=2, max_new_tokens=4, device="cpu", chunk=3)
    run = caption_split(models[arch], karpathy, "train", out, settings=settings, progress=False)
    assert run.finished and run.generated == 5 and run.skipped == 0
    ds = KarpathyDataset(
        karpathy / "dataset_flickr30k.json",
        "train",
        image_root=karpathy / "images",
        captions_file=out,
    )
    assert ds.num_images == 5 and ds.num_captions == 5 and ds.captions_per_image == 1
    meta = json.loads(sidecar_path(out).read_text())
    assert meta["split"] == "train" and meta["images"] == 5 and meta["arch"] == arch
    assert meta["source"] == f"{arch}:{models[arch].resolve()}"
    assert meta["max_new_tokens"] == 4 and meta["dtype"] == "float32"
    assert not (tmp_path / "train_caps.txt.partial").exists()
    # the captions are the model's own greedy output, image by image, in split order
    captioner = Captioner(models[arch], arch, device=torch.device("cpu"), dtype=torch.float32)
    paths = [ds.image_path(i) for i in range(5)]
    from PIL import Image

    for i, path in enumerate(paths):
        alone = captioner([Image.open(path).convert("RGB")], settings)[0][0]
        assert ds.captions[i] == alone
        assert len(alone.split()) <= 4  # a word per WordPiece token at most: max_new_tokens


def test_beams_keep_per_image_captions_and_prompt_is_removed(models, karpathy, tmp_path) -> None:
    out = tmp_path / "dev.txt"
    settings = CaptionSettings(
        batch_size=2, beams=3, per_image=2, max_new_tokens=3, prompt="a picture of", device="cpu"
    )
    caption_split(models["git"], karpathy, "dev", out, settings=settings, progress=False)
    read = read_captions_file(out, num_images=2, split="dev")
    assert read.captions_per_image == 2 and len(read.captions) == 4
    assert not any(c.startswith("a picture of") for c in read.captions)


def test_resumed_run_writes_the_uninterrupted_file(models, karpathy, tmp_path) -> None:
    settings = CaptionSettings(batch_size=2, max_new_tokens=5, device="cpu", chunk=2)
    whole = tmp_path / "whole.txt"
    caption_split(models["blip"], karpathy, "train", whole, settings=settings, progress=False)
    out = tmp_path / "resumed.txt"
    first = caption_split(
        models["blip"], karpathy, "train", out, settings=settings, progress=False,
        stop_after_chunks=1,
    )  # fmt: skip
    assert not first.finished and first.generated == 2 and not out.exists()
    assert sorted(p.name for p in (tmp_path / "resumed.txt.partial").iterdir()) == [
        "chunk_000000.json",
        "settings.json",
    ]
    second = caption_split(
        models["blip"], karpathy, "train", out, settings=settings, progress=False
    )
    assert second.finished and second.skipped == 2 and second.generated == 3
    assert out.read_bytes() == whole.read_bytes()
    side = json.loads(sidecar_path(out).read_text())
    assert side == json.loads(sidecar_path(whole).read_text())
    # other settings on a half-done run are refused; the finished file needs --overwrite
    caption_split(
        models["blip"], karpathy, "train", tmp_path / "t.txt", settings=settings, progress=False,
        stop_after_chunks=1,
    )  # fmt: skip
    with pytest.raises(ValueError, match=r"t\.txt\.partial: .*max_new_tokens: 5, now 6"):
        caption_split(
            models["blip"], karpathy, "train", tmp_path / "t.txt", progress=False,
            settings=CaptionSettings(batch_size=2, max_new_tokens=6, device="cpu", chunk=2),
        )  # fmt: skip
    with pytest.raises(OutputPathError, match="exists; pass --overwrite"):
        caption_split(models["blip"], karpathy, "train", out, settings=settings, progress=False)


def test_chunks_follow_split_order_and_skip_done_work(karpathy, models, tmp_path) -> None:
    oracle = _Oracle()
    settings = CaptionSettings(batch_size=2, device="cpu", chunk=2)
    out = tmp_path / "o.txt"
    kwargs = {"settings": settings, "progress": False, "load_captioner": lambda *a, **k: oracle}
    caption_split(models["blip"], karpathy, "train", out, stop_after_chunks=2, **kwargs)
    assert oracle.calls == 2
    caption_split(models["blip"], karpathy, "train", out, **kwargs)
    assert oracle.calls == 3  # the last chunk (one image) only
    ds = KarpathyDataset(
        karpathy / "dataset_flickr30k.json", "train", image_root=karpathy / "images"
    )
    import numpy as np
    from PIL import Image

    expected = [
        f"mean {np.asarray(Image.open(ds.image_path(i)).convert('RGB')).mean():.4f}"
        for i in range(5)
    ]
    assert read_captions_file(out, num_images=5).captions == expected


def test_synthetic_precomp_world_is_captioned_from_its_pictures(models, tmp_path) -> None:
    from vlret.worlds import write_synthetic

    world = write_synthetic(
        "tiny", tmp_path / "w", format="precomp", splits={"train": 3, "dev": 2, "test": 2}
    )
    oracle = _Oracle()
    out = tmp_path / "pc.txt"
    caption_split(
        models["git"], world, "dev", out, settings=CaptionSettings(device="cpu"),
        progress=False, load_captioner=lambda *a, **k: oracle,
    )  # fmt: skip
    # the same pictures as the Karpathy format's images/ of the same world
    kp = write_synthetic(
        "tiny", tmp_path / "k", format="karpathy", splits={"train": 3, "dev": 2, "test": 2}
    )
    ds = KarpathyDataset(kp / "dataset_flickr30k.json", "dev", image_root=kp / "images")
    import numpy as np
    from PIL import Image

    expected = [
        f"mean {np.asarray(Image.open(ds.image_path(i)).convert('RGB')).mean():.4f}"
        for i in range(2)
    ]
    assert read_captions_file(out, num_images=2, split="dev").captions == expected
    assert json.loads(sidecar_path(out).read_text())["format"] == "precomp"


def test_cli_errors_are_one_line(models, karpathy, tmp_path, capsys) -> None:
    from vlret.data.writers import make_tiny_precomp

    make_tiny_precomp(tmp_path / "pre", sizes={"train": 2})
    cases = [
        ([str(tmp_path / "nomodel"), "--data", str(karpathy)], "nomodel: missing"),
        ([str(models["blip"]), "--data", str(karpathy), "--arch", "coca"], "--arch"),
        ([str(tmp_path / "pre"), "--data", str(karpathy)], "config.json: missing"),
        ([str(models["blip"]), "--data", str(tmp_path / "pre")], "holds no images"),
        ([str(models["blip"]), "--data", str(karpathy), "--per-image", "2"], "--beams >= 2"),
    ]
    for args, expected in cases:
        code = main(["caption", *args, "--split", "train", "--out", str(tmp_path / "x.txt")])
        err = capsys.readouterr().err
        assert code == 2, err
        assert err.startswith("vlret caption: ") and expected in err
        assert err.count("\n") == 1, err
    model_type = json.loads((models["blip"] / "config.json").read_text())
    odd = tmp_path / "odd"
    odd.mkdir()
    (odd / "config.json").write_text(json.dumps({**model_type, "model_type": "coca"}))
    assert main(["caption", str(odd), "--data", str(karpathy), "--split", "train", "--out",
                 str(tmp_path / "y.txt")]) == 2  # fmt: skip
    assert "model_type 'coca'" in capsys.readouterr().err


def test_cli_runs_a_captioner(models, karpathy, tmp_path, capsys) -> None:
    out = tmp_path / "cli.txt"
    args = ["caption", str(models["blip"]), "--data", str(karpathy), "--split", "test"]
    code = main([*args, "--out", str(out), "--max-new-tokens", "3", "--device", "cpu"])
    assert code == 0, capsys.readouterr().err
    assert str(out) in capsys.readouterr().out
    assert read_captions_file(out, num_images=2, split="test").captions_per_image == 1


@pytest.mark.parametrize("arch", ["git", "blip"])
def test_a_captioner_without_tokenizer_files_is_refused(models, karpathy, tmp_path, capsys, arch):
    """Before (issue 39, item 7's twin): transformers built a two-token stand-in tokenizer, the
    command exited 0 and wrote nothing but empty captions."""
    import shutil

    bare = tmp_path / f"{arch}_notok"
    shutil.copytree(models[arch], bare)
    for name in ("tokenizer.json", "vocab.txt", "vocab.json", "merges.txt"):
        (bare / name).unlink(missing_ok=True)
    out = tmp_path / "caps.txt"
    argv = ["caption", str(bare), "--data", str(karpathy), "--split", "train", "--out", str(out)]
    capsys.readouterr()
    assert main([*argv, "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{bare}: no tokenizer files for the {arch} captioner" in err
    assert not out.exists()
