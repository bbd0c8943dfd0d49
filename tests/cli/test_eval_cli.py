"""`vlret train` then `vlret eval --json` on tiny real-format data; the numbers equal the
foundation metrics computed directly from the checkpoint's model."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
import yaml

from train_helpers import tiny_data, tiny_msrvtt_run_config, tiny_raw
from vlret.cli import main
from vlret.data import MSRVTTDataset, PrecompDataset, Vocabulary
from vlret.data.config import DataConfig
from vlret.data.formats import open_dataset
from vlret.data.writers import make_tiny_karpathy
from vlret.metrics import RetrievalMetrics, coco_5fold_metrics, retrieval_metrics
from vlret.models import build_model
from vlret.run.checkpoint import load_checkpoint
from vlret.run.eval_data import eval_data_config
from vlret.train import TrainingInterrupted

METRIC_KEYS = set(RetrievalMetrics.__dataclass_fields__) - {"folds"}


def direct_embeddings(checkpoint: Path, dataset) -> tuple[torch.Tensor, torch.Tensor]:
    state = load_checkpoint(checkpoint)
    model = build_model(state["config"]["model"], vocab_size=state["vocab_size"])
    model.load_state_dict(state["model"])
    model.eval()
    with torch.no_grad():
        img = torch.stack([dataset.image(i) for i in range(dataset.num_images)])
        img_emb = model.encode_images(img)
        txt_emb = torch.cat(
            [
                model.encode_texts(c[None], torch.tensor([len(c)]))
                for c in map(dataset.caption, range(dataset.num_captions))
            ]
        )
    return F.normalize(img_emb, dim=1), F.normalize(txt_emb, dim=1)


def run_cli(args: list[str]) -> int:
    return main([str(a) for a in args])


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    root = tmp_path_factory.mktemp("cli")
    data = tiny_data(root / "data")
    cfg = root / "run.yaml"
    cfg.write_text(yaml.safe_dump(tiny_raw(data, root / "unused")))
    assert (
        run_cli(
            [
                "train",
                cfg,
                "--set",
                f"output_dir={root / 'run'}",
                "--set",
                "train.epochs=2",
                "--set",
                "loss.name=unified",
                "--set",
                "loss.gamma=50",
            ]
        )
        == 0
    )
    return data, root / "run"


def test_train_writes_the_run_folder(trained):
    _, run = trained
    assert {"config.yaml", "metrics.jsonl", "last.pt", "best.pt", "vocab.json"} <= {
        p.name for p in run.iterdir()
    }
    resolved = yaml.safe_load((run / "config.yaml").read_text())
    assert resolved["loss"] == {"name": "unified", "gamma": 50.0}
    assert resolved["train"]["epochs"] == 2 and resolved["output_dir"] == str(run)
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    epochs = [r for r in records if r["kind"] == "epoch"]
    steps = [r for r in records if r["kind"] == "step"]
    assert [r["epoch"] for r in epochs] == [0, 1] and len(steps) == 5  # 10 steps, every 2
    assert {"loss", "lr", "pairs_per_s", "pos_sim", "hardest_neg_sim"} <= set(steps[0])
    assert "dev_rsum" in epochs[0] and epochs[-1]["best_rsum"] == max(r["dev_rsum"] for r in epochs)
    assert Vocabulary.load(run / "vocab.json") == Vocabulary(
        load_checkpoint(run / "best.pt")["encoder"]["idx2word"]
    )


@pytest.mark.parametrize(
    ("split", "protocol"), [("test", "f30k"), ("testall", "coco5k"), ("testall", "coco1k")]
)
def test_eval_json_matches_the_foundation_metrics(trained, tmp_path, capsys, split, protocol):
    data, run = trained
    out = tmp_path / "m.json"
    assert (
        run_cli(
            [
                "eval",
                run / "best.pt",
                "--data",
                data,
                "--split",
                split,
                "--protocol",
                protocol,
                "--json",
                out,
            ]
        )
        == 0
    )
    printed = capsys.readouterr().out
    assert "R@1" in printed and "rsum" in printed
    record = json.loads(out.read_text())
    assert record["protocol"] == protocol and record["split"] == split
    assert set(record["metrics"]) == METRIC_KEYS

    dataset = PrecompDataset(data, split, encoder=Vocabulary.load(run / "vocab.json"))
    img, txt = direct_embeddings(run / "best.pt", dataset)
    if protocol == "coco1k":
        expected = coco_5fold_metrics(img, txt, dataset.txt_to_img)
        assert [set(f) for f in record["folds"]] == [METRIC_KEYS] * 5
    else:
        expected = retrieval_metrics(img, txt, dataset.txt_to_img)
    assert record["metrics"] == pytest.approx(expected.as_dict())


def test_eval_msrvtt_protocols(tmp_path, capsys):
    root, cfg = tiny_msrvtt_run_config(tmp_path)
    assert run_cli(["train", cfg]) == 0
    encoder = Vocabulary.load(tmp_path / "run" / "vocab.json")
    for protocol, ds_protocol, n_txt in (("msrvtt-full", "full", 12), ("msrvtt-1ka", "1k-A", 2)):
        out = tmp_path / f"{protocol}.json"
        assert (
            run_cli(
                [
                    "eval",
                    tmp_path / "run" / "last.pt",
                    "--data",
                    root,
                    "--split",
                    "test",
                    "--protocol",
                    protocol,
                    "--json",
                    out,
                ]
            )
            == 0
        )
        dataset = MSRVTTDataset(
            root, "test", protocol=ds_protocol, encoder=encoder, captions_per_video=4
        )
        assert dataset.num_captions == n_txt
        img, txt = direct_embeddings(tmp_path / "run" / "last.pt", dataset)
        expected = retrieval_metrics(img, txt, dataset.txt_to_img)
        assert json.loads(out.read_text())["metrics"] == pytest.approx(expected.as_dict())
    assert "MSR-VTT" in capsys.readouterr().out


def test_eval_rejects_unknown_protocol(trained):
    data, run = trained
    with pytest.raises(SystemExit):
        run_cli(["eval", run / "best.pt", "--data", data, "--split", "test", "--protocol", "x"])


@pytest.mark.parametrize(
    ("split", "protocol", "words"),
    [
        ("testall", "f30k", "protocol f30k on precomp data evaluates the split(s) test, dev"),
        ("test", "coco5k", "not 'test'"),  # precomp COCO test is only the first 1000 images
        ("test", "msrvtt-full", "protocol msrvtt-full needs msrvtt data"),
        ("dev", "coco1k", "2 images, not divisible by 5"),
    ],
)
def test_eval_checks_split_protocol_and_data(trained, capsys, split, protocol, words):
    data, run = trained
    args = ["eval", run / "best.pt", "--data", data, "--split", split, "--protocol", protocol]
    assert run_cli(args) == 2
    err = capsys.readouterr().err
    assert err.startswith("vlret eval: ") and words in err and "Traceback" not in err


def test_eval_split_is_a_choice(trained, capsys):
    data, run = trained
    with pytest.raises(SystemExit):
        run_cli(["eval", run / "best.pt", "--data", data, "--split", "tst", "--protocol", "f30k"])
    assert "invalid choice: 'tst'" in capsys.readouterr().err


def test_eval_missing_data_folder(trained, tmp_path, capsys):
    _, run = trained
    missing = tmp_path / "nowhere"
    args = ["eval", run / "best.pt", "--data", missing, "--split", "test", "--protocol", "f30k"]
    assert run_cli(args) == 2
    assert capsys.readouterr().err == f"vlret eval: {missing}: missing; expected the data " + (
        "folder of the test split\n"
    )


def test_eval_data_locates_karpathy_files(tmp_path):
    stored = DataConfig(
        root="/train/flickr30k",
        format="karpathy",
        karpathy_json="/train/flickr30k/dataset_flickr30k.json",
        image_root="/train/flickr30k/images",
    )
    moved = tmp_path / "copy"
    images = make_tiny_karpathy(
        moved / "dataset_flickr30k.json", dataset="flickr30k", image_root=moved / "images"
    )
    cfg = eval_data_config(stored, moved)
    assert (cfg.karpathy_json, cfg.image_root, cfg.root) == (
        str(moved / "dataset_flickr30k.json"),
        str(moved / "images"),
        str(moved),
    )
    assert eval_data_config(stored, moved / "dataset_flickr30k.json") == cfg  # the JSON itself
    test = open_dataset(cfg, "test")
    assert test.num_images == 2 and test.image_path(0) == moved / "images" / images[-2].filename
    # another JSON name: the only dataset_*.json of the folder
    (moved / "dataset_flickr30k.json").rename(moved / "dataset_f30k.json")
    assert eval_data_config(stored, moved).karpathy_json == str(moved / "dataset_f30k.json")
    (moved / "dataset_f30k.json").unlink()
    with pytest.raises(FileNotFoundError, match="expected the Karpathy JSON dataset_flickr30k"):
        eval_data_config(stored, moved)
    with pytest.raises(FileNotFoundError, match="missing; expected the data folder"):
        eval_data_config(stored, tmp_path / "nowhere")


def _write_config(tmp_path: Path, data: Path, **data_keys) -> Path:
    raw = tiny_raw(data, tmp_path / "run")
    raw["data"].update(data_keys)
    cfg = tmp_path / "run.yaml"
    cfg.write_text(yaml.safe_dump(raw))
    return cfg


@pytest.mark.parametrize(
    ("data_keys", "override", "words"),
    [
        ({"root": "/nonexistent/f30k"}, None, "/nonexistent/f30k"),
        ({}, "model.image.poolin=max", "model.image: unknown key 'poolin'"),
        ({}, "loss.margin=abc", "loss.margin: expected a number, got 'abc'"),
    ],
)
def test_train_errors_exit_2_without_traceback(
    trained, tmp_path, capsys, data_keys, override, words
):
    data, _ = trained
    cfg = _write_config(tmp_path, data, **data_keys)
    args = ["train", cfg] + (["--set", override] if override else [])
    assert run_cli(args) == 2
    captured = capsys.readouterr()
    assert captured.err.startswith("vlret train: ") and words in captured.err
    assert "Traceback" not in captured.err + captured.out
    assert not (tmp_path / "run" / "last.pt").exists()


def test_ctrl_c_hint_repeats_the_overrides(trained, tmp_path, capsys, monkeypatch):
    import vlret.train

    def interrupted(config, *, resume=None, overwrite=False, hooks=None):
        raise TrainingInterrupted(Path(config.output_dir) / "last.pt")

    monkeypatch.setattr(vlret.train, "train", interrupted)
    data, _ = trained
    cfg = _write_config(tmp_path, data)
    out = tmp_path / "my run"
    sets = [f"output_dir={out}", "train.epochs=2", "loss.margin=0.1"]
    assert run_cli(["train", cfg, *[a for s in sets for a in ("--set", s)]]) == 130
    hint = capsys.readouterr().out.strip()
    assert hint == (
        f"interrupted; resume with: vlret train {cfg} --set 'output_dir={out}' "
        f"--set train.epochs=2 --set loss.margin=0.1 --resume '{out}/last.pt'"
    )
    assert shlex.split(hint.split(": ", 1)[1])[4] == f"output_dir={out}"
    # the gradient log is an option, not a key: the resumed run keeps it
    assert run_cli(["train", cfg, "--log-gradients", "7"]) == 130
    hint = capsys.readouterr().out.strip()
    assert hint.endswith(f"--log-gradients 7 --resume {tmp_path}/run/last.pt")


def test_a_protocol_registered_in_one_module_runs_eval_and_compare(
    trained, tmp_path, capsys, monkeypatch
):
    """A new protocol is one registration: the --split / --protocol choices, run_evaluation's
    split gate and compare's protocol check all read the registry (no other file changes)."""
    from vlret.analysis.compare import compare
    from vlret.eval import EvalProtocol, eval_splits
    from vlret.eval.protocols import register_protocol, registry

    data, run = trained
    dataset = PrecompDataset(data, "train", encoder=Vocabulary.load(run / "vocab.json"))
    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))
    assert "train" not in eval_splits()
    register_protocol(  # the whole new protocol: the precomp train split scored as a test
        EvalProtocol(
            name="f30k-dev-like",
            title="Tiny train-as-test",
            summary="precomp train: every training image x its captions",
            paper_set="Tiny train",
            paper_splits=("train",),
            paper_images=dataset.num_images,
            paper_texts=dataset.num_captions,
            splits={"precomp": ("train", "dev")},
        )
    )
    assert eval_splits() == ("test", "testall", "train", "dev", "val")  # val: person search
    out = tmp_path / "m.json"
    args = ["eval", run / "best.pt", "--data", data, "--split", "train"]
    assert run_cli([*args, "--protocol", "f30k-dev-like", "--json", out]) == 0
    assert capsys.readouterr().out.startswith("Tiny train-as-test")
    record = json.loads(out.read_text())
    assert (record["protocol"], record["split"]) == ("f30k-dev-like", "train")
    assert (record["n_images"], record["n_texts"]) == (dataset.num_images, dataset.num_captions)
    img, txt = direct_embeddings(run / "best.pt", dataset)
    expected = retrieval_metrics(img, txt, dataset.txt_to_img).as_dict()
    assert record["metrics"] == pytest.approx(expected)
    # ... and the other protocols still refuse that split
    assert run_cli([*args, "--protocol", "f30k"]) == 2
    assert "evaluates the split(s) test, dev, not 'train'" in capsys.readouterr().err

    raw = tiny_raw(data, tmp_path / "base")
    raw["train"]["epochs"] = 1
    raw["compare"] = {"protocol": "f30k-dev-like", "split": "train"}
    cfg = tmp_path / "cmp.yaml"
    cfg.write_text(yaml.safe_dump(raw, sort_keys=False))
    compare(cfg, losses=["triplet"], seeds=1, out=tmp_path / "cmp", progress=False)
    run_dir = tmp_path / "cmp" / "runs" / "triplet" / "seed0"
    stored = json.loads((run_dir / "result.json").read_text())
    assert (stored["protocol"], stored["split"]) == ("f30k-dev-like", "train")
    # the run's record is the Evaluation's own (title, sizes), plus the run's identity
    assert stored["title"] == "Tiny train-as-test" and stored["checkpoint"] == "best.pt"
    assert (stored["n_images"], stored["n_texts"], stored["seed"]) == (
        dataset.num_images,
        dataset.num_captions,
        0,
    )
    cmp_dataset = PrecompDataset(data, "train", encoder=Vocabulary.load(run_dir / "vocab.json"))
    img, txt = direct_embeddings(run_dir / stored["checkpoint"], cmp_dataset)
    expected = retrieval_metrics(img, txt, cmp_dataset.txt_to_img).as_dict()
    assert stored["metrics"] == pytest.approx(expected)
