"""``vlret export --format hf``: a tiny CLIP checkpoint written as training writes it is
exported by the command, loaded by ``transformers``' own ``CLIPModel.from_pretrained`` and
``CLIPProcessor.from_pretrained``, and its ``get_image_features`` / ``get_text_features`` on PIL
images (saved by PIL in five modes) and captions through the processor are vlret's embeddings
(before L2 normalisation) to 1e-5; what ``CLIPModel`` cannot hold is refused in one line."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers")
pytest.importorskip("PIL")

import transformers  # noqa: E402

from export_helpers import LEARNED_TEMPERATURE, pil_images, tiny_clip_checkpoint  # noqa: E402
from vlret.cli import main  # noqa: E402
from vlret.models.clip import CLIPImageTransform  # noqa: E402
from vlret.run.builders import load_trained_model  # noqa: E402

TOL = 1e-5
#: (height, width): square, and longer sides the 32-px crop leaves an even margin on (the
#: crop offsets of transformers (floor) and of vlret's preset (round) agree there).
AGREEING_SIZES = [(32, 32), (48, 48), (40, 50), (64, 48), (33, 33), (60, 40), (32, 300)]
CAPTIONS = [
    "A dog runs on the grass.",
    "  two   CATS\tsleeping\n",
    "ÉCOLE ΟΔΟΣ: les élèves jouent",
    "a " + "very " * 40 + "long caption",  # truncated to 77 ids by both
    "emoji 🐕 and NUL\x00byte",
    "",
]


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """(run folder, export folder): the CLI's export of a tiny trained-looking CLIP."""
    root = tmp_path_factory.mktemp("export_hf")
    run = tiny_clip_checkpoint(root / "run")
    assert main(["export", str(run), "--format", "hf", "--out", str(root / "hf")]) == 0
    return run, root / "hf"


def _vlret_text(encoder, model, captions):
    ids = [encoder.encode(c) for c in captions]
    longest = max(map(len, ids))
    padded = torch.tensor([x + [encoder.pad_id] * (longest - len(x)) for x in ids])
    with torch.no_grad():
        return model.encode_texts(padded, torch.tensor([len(x) for x in ids]))


def test_transformers_loads_the_export_and_gives_vlrets_embeddings(exported, tmp_path):
    run, folder = exported
    model, _, encoder = load_trained_model(run / "best.pt")
    assert not model.normalize  # encode_* give the embeddings before L2 normalisation
    clip = transformers.CLIPModel.from_pretrained(str(folder)).eval()
    processor = transformers.CLIPProcessor.from_pretrained(str(folder), backend="pil")
    paths = pil_images(tmp_path, AGREEING_SIZES)
    from PIL import Image

    images = [Image.open(p) for p in paths]
    inputs = processor(
        images=images, text=CAPTIONS, padding=True, truncation=True, return_tensors="pt"
    )
    with torch.no_grad():
        hf_images = clip.get_image_features(pixel_values=inputs["pixel_values"]).pooler_output
        hf_texts = clip.get_text_features(
            input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"]
        ).pooler_output
        ours_images = model.encode_images([str(p) for p in paths])
    ours_texts = _vlret_text(encoder, model, CAPTIONS)
    assert hf_images.dtype == hf_texts.dtype == torch.float32
    assert hf_images.shape == ours_images.shape == (len(paths), 16)
    assert (hf_images - ours_images).abs().max() < TOL
    assert (hf_texts - ours_texts).abs().max() < TOL
    # the embeddings are not trivially equal: distinct images and captions differ
    assert (ours_images[0] - ours_images[1]).abs().max() > 1e-2
    # the processor's ids are vlret's where the attention mask is 1
    for row, caption in enumerate(CAPTIONS):
        mask = inputs["attention_mask"][row].bool()
        assert inputs["input_ids"][row][mask].tolist() == encoder.encode(caption)
    assert len(encoder.encode(CAPTIONS[3])) == 77


def test_the_logit_scale_is_the_checkpoints_learned_temperature(exported):
    _, folder = exported
    clip = transformers.CLIPModel.from_pretrained(str(folder))
    assert float(clip.logit_scale.detach()) == pytest.approx(
        math.log(1 / LEARNED_TEMPERATURE), rel=1e-6
    )


def test_the_processor_files_say_vlrets_eval_transform(exported):
    run, folder = exported
    model, _, _ = load_trained_model(run / "best.pt")
    steps = json.loads((folder / "processor_config.json").read_text())["image_processor"]
    transform = model.image_transform
    assert steps["size"] == {"shortest_edge": 32} and steps["crop_size"] == {
        "height": 32,
        "width": 32,
    }
    assert steps["resample"] == 3  # PIL's bicubic
    assert steps["image_mean"] == transform.mean.tolist()
    assert steps["image_std"] == transform.std.tolist()
    assert steps["rescale_factor"] == pytest.approx(1 / 255)


def test_crop_offsets_differ_exactly_where_documented(exported, tmp_path):
    """A 32 x 67 image: resized to 32 x 67, a margin of 35 = 4 * 8 + 3, floor 17, round 18."""
    run, folder = exported
    model, _, _ = load_trained_model(run / "best.pt")
    processor = transformers.CLIPProcessor.from_pretrained(str(folder), backend="pil")
    (path,) = pil_images(tmp_path, [(32, 67)])
    pixels = processor(images=[__import__("PIL.Image").Image.open(path)], return_tensors="pt")
    theirs = pixels["pixel_values"][0]
    floor = CLIPImageTransform(32, crop_offsets="floor")(path)
    assert (theirs - floor).abs().max() < 1e-5  # transformers is vlret's transform with floor
    assert (theirs - model.image_transform(path)).abs().max() > 0.1  # the preset rounds


def test_vlret_reads_the_export_back_as_a_local_clip(exported):
    run, folder = exported
    model, _, encoder = load_trained_model(run / "best.pt")
    from vlret.data.vocab import load_hf_tokenizer
    from vlret.models import build_model

    back = build_model({"kind": "clip", "path": str(folder), "proj_dim": 0}).eval()
    pixels = torch.randn(3, 3, 32, 32)
    with torch.no_grad():
        assert (back.encode_images(pixels) - model.encode_images(pixels)).abs().max() < TOL
    tokenizer = load_hf_tokenizer(folder, max_positions=77)
    assert [tokenizer.encode(c) for c in CAPTIONS] == [encoder.encode(c) for c in CAPTIONS]


def _fail_line(capsys, argv) -> str:
    capsys.readouterr()
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("vlret export: ")
    return err


def test_an_existing_folder_needs_overwrite_and_only_an_exports_files_are_replaced(
    exported, tmp_path, capsys
):
    run, folder = exported
    out = tmp_path / "out"
    argv = ["export", str(run / "best.pt"), "--format", "hf", "--out", str(out)]
    assert main(argv) == 0
    assert "pass --overwrite" in _fail_line(capsys, argv)
    before = (out / "model.safetensors").read_bytes()
    assert main([*argv, "--overwrite"]) == 0
    assert (out / "model.safetensors").read_bytes() == before
    (out / "notes.txt").write_text("mine")
    assert "notes.txt" in _fail_line(capsys, [*argv, "--overwrite"])
    assert (out / "notes.txt").read_text() == "mine"
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".out.")]  # no temporaries


def test_a_failed_export_leaves_the_previous_one_and_no_temporary(exported, tmp_path):
    from vlret.models.export import write_export_dir

    run, folder = exported
    out = tmp_path / "out"
    write_export_dir(out, lambda d: (d / "config.json").write_text("old"), overwrite=False)

    def broken(d: Path) -> None:
        (d / "config.json").write_text("new")
        raise RuntimeError("disk gone")

    with pytest.raises(RuntimeError):
        write_export_dir(out, broken, overwrite=True)
    assert (out / "config.json").read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["out"]


@pytest.mark.parametrize(
    ("overrides", "words"),
    [
        ({"proj_dim": 8}, "model.proj_dim = 8 adds an embedding layer with a bias"),
        ({"image_size": [32, 16]}, "model.image_size = [32, 16] is not square"),
    ],
)
def test_what_clipmodel_cannot_hold_is_refused_in_one_line(tmp_path, capsys, overrides, words):
    run = tiny_clip_checkpoint(tmp_path / "run", model_overrides=overrides)
    out = tmp_path / "out"
    err = _fail_line(capsys, ["export", str(run), "--format", "hf", "--out", str(out)])
    assert words in err and "cannot export to hf" in err
    assert not out.exists() and [p.name for p in tmp_path.iterdir()] == ["run"]


def test_a_square_size_other_than_the_presets_is_the_configs_image_size(tmp_path):
    run = tiny_clip_checkpoint(tmp_path / "run", model_overrides={"image_size": 48})
    assert main(["export", str(run), "--format", "hf", "--out", str(tmp_path / "hf")]) == 0
    model, _, _ = load_trained_model(run / "best.pt")
    clip = transformers.CLIPModel.from_pretrained(str(tmp_path / "hf")).eval()
    assert clip.config.vision_config.image_size == 48
    pixels = torch.randn(2, 3, 48, 48)
    with torch.no_grad():
        theirs = clip.get_image_features(pixel_values=pixels).pooler_output
        assert (theirs - model.encode_images(pixels)).abs().max() < TOL


def test_a_model_that_is_not_clip_is_refused_naming_the_kinds(tmp_path, capsys):
    two_tower = Path(__file__).parents[1] / "fixtures" / "prev_release" / "two_tower.pt"
    err = _fail_line(
        capsys, ["export", str(two_tower), "--format", "hf", "--out", str(tmp_path / "x")]
    )
    assert "model.kind is 'vse'; only CLIP models (model.kind = \"clip\"" in err
    assert not (tmp_path / "x").exists()


def test_a_run_folder_without_best_pt_is_named(tmp_path, capsys):
    err = _fail_line(capsys, ["export", str(tmp_path), "--format", "hf", "--out", "x"])
    assert f"{tmp_path}: a folder without best.pt" in err


def test_the_parsers_formats_are_the_librarys():
    from vlret.cli.export import FORMATS
    from vlret.models.export import EXPORT_FORMATS

    assert FORMATS == EXPORT_FORMATS


@pytest.mark.parametrize("layout", ["v5", "hub"])
def test_a_clip_fine_tuned_from_a_hugging_face_folder_goes_back_whole(tmp_path, layout):
    """A CLIP read from a folder ``transformers`` wrote (its BPE tokenizer, bilinear resize
    to 40, its own mean and std, floor crop offsets), exported, gives its embeddings on every
    image size, the odd margins included, and its tokenizer's ids, truncation included."""
    from PIL import Image

    from clip_folder_helpers import SIZES, tiny_clip_parts, write_folder
    from vlret.data.vocab import load_hf_tokenizer
    from vlret.models import build_model
    from vlret.models.export.hf import export_hf

    source = write_folder(tmp_path / "src", tiny_clip_parts(tmp_path), layout)
    model = build_model({"kind": "clip", "path": str(source), "proj_dim": 0}).eval()
    encoder = load_hf_tokenizer(source, max_positions=64)
    assert export_hf(model, encoder=encoder, out=tmp_path / "hf", logit_scale=None) == []
    clip = transformers.CLIPModel.from_pretrained(str(tmp_path / "hf")).eval()
    processor = transformers.CLIPProcessor.from_pretrained(str(tmp_path / "hf"), backend="pil")
    images = [Image.new("RGB", size) for size in SIZES]
    rng = torch.Generator().manual_seed(0)
    for image in images:  # noise, so that a one-pixel shift of the crop would show
        pixels = torch.randint(0, 256, (image.size[1], image.size[0], 3), generator=rng)
        image.paste(Image.fromarray(pixels.to(torch.uint8).numpy()))
    captions = ["the cat", "a cat at the cat.", "cat " * 80, "'-,"]
    inputs = processor(
        images=images, text=captions, padding=True, truncation=True, return_tensors="pt"
    )
    with torch.no_grad():
        theirs = clip.get_image_features(pixel_values=inputs["pixel_values"]).pooler_output
        ours = model.encode_images(images)
        theirs_text = clip.get_text_features(
            input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"]
        ).pooler_output
    assert (theirs - ours).abs().max() < TOL
    assert (theirs_text - _vlret_text(encoder, model, captions)).abs().max() < TOL
    for row, caption in enumerate(captions):
        mask = inputs["attention_mask"][row].bool()
        assert inputs["input_ids"][row][mask].tolist() == encoder.encode(caption)
    assert len(encoder.encode(captions[2])) == 64
    assert float(clip.logit_scale.detach()) == pytest.approx(2.6592)
