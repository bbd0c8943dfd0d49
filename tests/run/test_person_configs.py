"""Person-search configs (issue 28, item 4): AdaCL Table 7's domain generalisation (a checkpoint
trained on Karpathy data evaluated on person-search folders through ``vlret eval``, checked
against a naive identity-level ranking) and the fine-tuning configs' settings (IRRA's
optimiser and schedule, the ICFG-PEDES no-validation rule, the losses they build)."""

from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import pytest
import tomllib
import torch

pytest.importorskip("PIL")

from pedes_helpers import CUHK_IMAGES, TINY_CLIP_TOML, caption, write_pedes  # noqa: E402
from vlret.configs import shipped_configs  # noqa: E402
from vlret.run.config import ConfigError, load_config  # noqa: E402

#: Training captions of each official train split (IRRA's data statistics) and the format.
TRAIN_CAPTIONS = {"cuhk": 68126, "icfg": 34674, "rstp": 37010}
FORMATS = {"cuhk": "cuhk-pedes", "icfg": "icfg-pedes", "rstp": "rstpreid"}
LOSSES = {
    "cmpm": "cmpm",
    "adacl_cmpm": "cmpm+adacl",
    "irra": "sdm+mlm+id",
    "irra_adacl": "sdm+mlm+id+adacl",
}
#: IRRA's lr_factor 5 for the names holding "cross", "classifier" or "mlm_head" (solver/build.py)
IRRA_MULTIPLIERS = {"loss": 5.0, "irr.cross_attn": 5.0, "irr.blocks": 5.0, "irr.mlm_head": 5.0}
FINE_TUNING = [f"person_{d}_{loss}" for d in TRAIN_CAPTIONS for loss in LOSSES]
DG = ["adacl_dg_f30k_cmpm", "adacl_dg_f30k_adacl_cmpm"]


def header(name: str) -> str:
    text = shipped_configs()[name].read_text()
    return "\n".join(line for line in text.splitlines() if line.startswith("#"))


@pytest.mark.parametrize("name", FINE_TUNING)
def test_fine_tuning_configs_carry_irras_settings(name):
    _, data, loss = name.split("_", 2)
    cfg = load_config(shipped_configs()[name])
    assert (cfg.data.format, cfg.data.train_transform) == (FORMATS[data], "irra")
    assert cfg.model["kind"] == "clip" and cfg.model["path"].endswith("clip-vit-base-patch16")
    assert cfg.model["image_size"] == [384, 128]
    assert cfg.loss.name == LOSSES[loss]
    if "sdm" in cfg.loss.name:
        assert cfg.loss.params["sdm"] == {"scale": 50.0}  # 1 / IRRA's temperature 0.02
    o, t = cfg.optim, cfg.train
    assert (o.name, o.lr, o.betas, o.weight_decay, o.no_decay) == (
        "adam",
        1e-5,
        [0.9, 0.999],
        4e-5,
        ["bias"],
    )
    assert (o.schedule, o.grad_clip, t.epochs, t.batch_size) == ("cosine", 0.0, 60, 64)
    assert o.eps == 1e-3  # IRRA's solver/build.py: Adam(..., eps=1e-3)
    assert o.warmup_steps == 5 * (TRAIN_CAPTIONS[data] // 64)  # IRRA's 5 warm-up epochs
    irra = "mlm" in cfg.loss.name.split("+")
    assert o.lr_multipliers == (IRRA_MULTIPLIERS if irra else {})
    # IRRA's implicit relation reasoning is on exactly where its MLM part is
    assert cfg.model.get("irr", False) is irra
    # float16 arithmetic on CUDA (IRRA trains float16 weights); the header says so and why
    assert t.amp is True
    assert "float32 (IRRA's precision)" not in header(name)
    assert "Precision: IRRA's build_model converts the weights to float16" in header(name)
    # ICFG-PEDES has no validation split: no selection at all, never silently the test split
    assert cfg.data.dev_split == (None if data == "icfg" else "val")
    text = header(name)
    assert f"vlret train {name}\n" in text + "\n"
    command = f"vlret eval runs/{name}/best.pt --data "
    assert command in text and f"--split test --protocol {FORMATS[data]}" in text
    if data == "icfg":
        assert "no validation split" in text and "IRRA#45" in text


def test_icfg_configs_refuse_a_val_split_and_take_test_only_by_name():
    path = shipped_configs()["person_icfg_irra"]
    with pytest.raises(ConfigError, match="data.dev_split.*no 'val' split"):
        load_config(path, overrides=["data.dev_split=val"])
    assert load_config(path, overrides=["data.dev_split=test"]).data.dev_split == "test"
    # IRRA's exact model: no layer added after CLIP's projections (0, TOML has no null)
    assert load_config(path).model["proj_dim"] == 0


@pytest.mark.parametrize("name", DG)
def test_dg_configs_train_on_flickr30k_and_name_the_three_evaluations(name):
    cfg = load_config(shipped_configs()[name])
    assert (cfg.data.format, cfg.data.dev_split) == ("karpathy", "val")
    assert cfg.data.karpathy_json.endswith("dataset_flickr30k.json")
    assert cfg.loss.name == (
        "cmpm" if name.endswith("_cmpm") and "adacl_cmpm" not in name else "cmpm+adacl"
    )
    text = header(name)
    for fmt, root in (
        ("cuhk-pedes", "CUHK-PEDES"),
        ("icfg-pedes", "ICFG-PEDES"),
        ("rstpreid", "RSTPReid"),
    ):
        want = f"vlret eval runs/{name}/best.pt --data data/{root} --split test --protocol {fmt}"
        assert want in text


@pytest.mark.parametrize("name", [*FINE_TUNING[:4], DG[1]])
def test_the_configs_losses_build_on_a_person_search_training_set(name, tmp_path):
    from vlret.data.formats.pedes import CUHKPedesDataset
    from vlret.run.loss_builder import build_run_loss

    cfg = load_config(shipped_configs()[name])
    train = CUHKPedesDataset(write_pedes(tmp_path / "cuhk"), "train", check_images=False)
    # CLIP ViT-B/16's own 512-d projections (proj_dim = 0): the built model gives the width
    loss = build_run_loss(cfg, train, model=SimpleNamespace(embed_dim=512))
    if "id" in cfg.loss.name.split("+"):  # the classifier: 3 training persons x 512-d
        classifier = loss.parts["id"].classifier
        assert tuple(classifier.weight.shape) == (3, 512)
    g = torch.Generator().manual_seed(0)
    img, txt = torch.randn(6, 512, generator=g), torch.randn(6, 512, generator=g)
    ids = torch.tensor([0, 1, 2, 0, 1, 2])
    extra = {}
    if "mlm" in cfg.loss.name.split("+"):  # IRR's scores of 6 masked captions of 5 tokens
        extra["mlm_logits"] = torch.randn(6, 5, 49408, generator=g)
        extra["mlm_labels"] = torch.tensor([[-100, 7, -100, -100, -100]] * 6)
    value = loss(img, txt, img_ids=ids, txt_ids=ids, **extra)
    assert value.dim() == 0 and torch.isfinite(value)


# -- AdaCL Table 7: trained on Flickr30K (Karpathy), tested on person-search folders -------------

ICFG_IMAGES = [x for x in CUHK_IMAGES if x[1] != "val"]


def naive_identity_metrics(sim: np.ndarray, q_ids, g_ids) -> dict[str, float]:
    """R@1 and mAP by sorting each row (no ties with random float embeddings)."""
    r1, aps = [], []
    for row, q in zip(sim, q_ids, strict=True):
        order = np.argsort(-row, kind="stable")
        hits = np.asarray(g_ids)[order] == q
        r1.append(float(hits[0]))
        ranks = np.flatnonzero(hits) + 1
        aps.append(np.mean([(k + 1) / r for k, r in enumerate(ranks)]))
    return {"R1": 100 * np.mean(r1), "mAP": 100 * np.mean(aps)}


def test_a_flickr30k_checkpoint_evaluates_on_the_three_person_search_sets(tmp_path):
    pytest.importorskip("transformers")
    from vlret.cli import main
    from vlret.data.formats.pedes.letterbox import Letterbox
    from vlret.data.writers import make_tiny_karpathy
    from vlret.run.builders import load_trained_model

    f30k = tmp_path / "flickr30k"
    make_tiny_karpathy(
        f30k / "dataset_flickr30k.json",
        dataset="flickr30k",
        splits={"train": 8, "val": 2, "test": 2},
        image_root=f30k / "images",
    )
    shipped = tomllib.loads(shipped_configs()["adacl_dg_f30k_adacl_cmpm"].read_text())
    loss = shipped["loss"]
    adacl = "".join(f"{k} = {v}\n" for k, v in loss["adacl"].items())
    out = tmp_path / "run"
    config = tmp_path / "dg.toml"
    config.write_text(
        f'output_dir = "{out}"\n[data]\nroot = "{f30k}"\nformat = "karpathy"\n'
        f'karpathy_json = "{f30k / "dataset_flickr30k.json"}"\nimage_root = "{f30k / "images"}"\n'
        'dev_split = "val"\n'
        '[model]\nkind = "clip"\npreset = "ViT-B-32"\ntokenizer = "bytes"\n'
        f"config = {TINY_CLIP_TOML}\n"
        f'[loss]\nname = "{loss["name"]}"\nweights = {{ cmpm = 1.0, adacl = 1.0 }}\n'
        f"[loss.adacl]\n{adacl}"
        "[optim]\nlr = 1e-4\n[train]\nepochs = 1\nbatch_size = 8\nprogress = false\n"
        "eval_batch_size = 8\n"
    )
    assert main(["train", str(config)]) == 0
    ckpt = out / "best.pt"
    model, _, encoder = load_trained_model(ckpt)
    model.eval()
    for fmt, images in (
        ("cuhk-pedes", CUHK_IMAGES),
        ("icfg-pedes", ICFG_IMAGES),
        ("rstpreid", CUHK_IMAGES),
    ):
        root = tmp_path / fmt
        annotations = write_pedes(root, fmt, images)
        record = tmp_path / f"{fmt}.json"
        cmd = ["eval", str(ckpt), "--data", str(root), "--split", "test", "--protocol", fmt]
        assert main([*cmd, "--json", str(record), "--no-progress"]) == 0
        found = json.loads(record.read_text())
        assert (found["protocol"], found["split"]) == (fmt, "test")
        # the oracle: the test images letterboxed into the model's input (nothing cropped,
        # data.person_transform's default for a run trained on other data), the captions
        # through the checkpoint's tokenizer, cosine scores, identities compared
        entries = json.loads(annotations.read_text())
        tests = [(k, e) for k, e in enumerate(entries) if e["split"] == "test"]
        key = "img_path" if fmt == "rstpreid" else "file_path"
        boxed = Letterbox.from_eval(model.image_transform)
        with torch.no_grad():
            pixels = torch.stack([boxed(root / "imgs" / e[key]) for _, e in tests])
            img = torch.nn.functional.normalize(model.image_encoder(pixels).double(), dim=1)
            caps, q_ids = [], []
            for k, e in tests:
                for c in range(len(e["captions"])):
                    assert e["captions"][c] == caption(e["id"], k * 10 + c)
                    caps.append(encoder.encode(e["captions"][c]))
                    q_ids.append(e["id"])
            lengths = torch.tensor([len(c) for c in caps])
            ids = torch.zeros(len(caps), int(lengths.max()), dtype=torch.long)
            for i, c in enumerate(caps):
                ids[i, : len(c)] = torch.tensor(c)
            txt = torch.nn.functional.normalize(model.text_encoder(ids, lengths).double(), dim=1)
        want = naive_identity_metrics((txt @ img.T).numpy(), q_ids, [e["id"] for _, e in tests])
        got = found["metrics"]
        # float32 encoders on both sides, the same operations: equal rankings, so equal metrics
        assert got["identity_t2i_r1"] == pytest.approx(want["R1"], abs=1e-6)
        assert got["identity_t2i_map"] == pytest.approx(want["mAP"], abs=1e-4)
