"""Importing DIME's released checkpoints (vlret.run.import_dime).

Each checkpoint is written in the release's layout (``{"epoch", "model": [img_enc, txt_enc,
itr_module], "best_rsum", "best_r1", "opt": Namespace, "Eiters"}``) by ``torch.save`` in the
legacy (non-zip) format at pickle protocol 2, as Python 2.7 / PyTorch 1.0 wrote it, from a
tiny vlret DIME whose BERT weights differ from the folder's: the imported checkpoint, read by
``load_trained_model``, must score exactly as the model it came from.
"""

from __future__ import annotations

import argparse
import os
from collections import OrderedDict

import pytest
import torch

from bert_helpers import BERT_WORDS, write_tiny_bert
from vlret.models import build_model
from vlret.run import import_dime
from vlret.run.builders import load_trained_model
from vlret.run.import_checkpoint import CheckpointImportError
from vlret.run.import_dime import import_dime_checkpoint

WORDS = BERT_WORDS
IN_DIM, R, D = 10, 4, 16


@pytest.fixture(scope="module")
def bert_dir(tmp_path_factory):
    pytest.importorskip("transformers")
    return write_tiny_bert(tmp_path_factory.mktemp("dime_import_bert"), layers=2, seed=9)


def dime_opt(**change) -> argparse.Namespace:
    opt = dict(
        direction="i2t", embed_size=D, img_dim=IN_DIM, max_words=8, lambda_softmax_CMRC=4.0,
        hid_router=8, hid_IMRC=20, num_head_IMRC=4, raw_feature_norm_CMRC="clipped_l2norm",
        no_imgnorm=False, margin=0.2, max_violation=True, learning_rate=2e-4, lr_update=15,
        num_epochs=30, batch_size=32, grad_clip=2.0, data_path="/data", data_name="f30k_precomp",
        trade_off=0.5, extra_stc=1, extra_img=0, bert_path="/bert", measure="cosine",
    )  # fmt: skip
    opt.update(change)
    return argparse.Namespace(**opt)


def source_model(bert_dir, opt):
    torch.manual_seed(3)
    model = build_model(
        {
            "kind": "dime",
            "embed_dim": D,
            "direction": opt.direction,
            "lambda_softmax": opt.lambda_softmax_CMRC,
            "max_words": opt.max_words,
            "router_hidden": opt.hid_router,
            "imrc_hidden": opt.hid_IMRC,
            "imrc_heads": opt.num_head_IMRC,
            "image": {"in_dim": IN_DIM},
            "text": {"path": str(bert_dir)},
        }  # fmt: skip
    )
    with torch.no_grad():  # nothing at its initial value, the BERT's weights included
        for name, t in model.state_dict().items():
            if t.is_floating_point() and "running_var" not in name:
                t.add_(torch.randn_like(t) * 0.05)
            elif "running_var" in name:
                t.uniform_(0.5, 2.0)
    return model.eval()


def release_checkpoint(model, opt) -> dict:
    own = model.state_dict()
    parts = []
    for prefix in ("image_encoder.", "text_encoder.", "interaction."):
        parts.append(
            OrderedDict(
                (k[len(prefix) :], v.clone())
                for k, v in own.items()
                if k.startswith(prefix) and not k.endswith(("position_ids", "token_type_ids"))
            )
        )
    h = model.text_encoder.bert.config.hidden_size
    parts[1]["bert.pooler.dense.weight"] = torch.randn(h, h)
    parts[1]["bert.pooler.dense.bias"] = torch.randn(h)
    parts[2]["path_mapping.weight"] = torch.randn(128, 36)
    parts[2]["path_mapping.bias"] = torch.randn(128)
    for layer in ("dynamic_itr_l0", "dynamic_itr_l1", "dynamic_itr_l2"):
        parts[2][f"{layer}.glgc.fc_2.weight"] = torch.randn(D, D)
        parts[2][f"{layer}.glgc.fc_2.bias"] = torch.randn(D)
    return {
        "epoch": 17, "model": parts, "best_rsum": 501.5, "best_r1": 70.1, "opt": opt,
        "Eiters": 12345,
    }  # fmt: skip


def save(tmp_path, ckpt, name="model_best.pth.tar"):
    path = tmp_path / name
    torch.save(ckpt, path, pickle_protocol=2, _use_new_zipfile_serialization=False)
    return path


def inputs():
    gen = torch.Generator().manual_seed(1)
    feats = torch.randn(3, R, IN_DIM, generator=gen)
    caps = torch.randint(5, len(WORDS), (4, 12), generator=gen)
    lengths = torch.tensor([4, 12, 6, 3])
    caps[:, 0] = 2
    for i, n in enumerate(lengths.tolist()):
        caps[i, n - 1] = 3
    return feats, caps, lengths


def scores(model, feats, caps, lengths):
    with torch.no_grad():
        words = model.encode_texts(caps, lengths)
        return model.score(model.encode_images(feats), words, model.token_lengths(lengths))


@pytest.mark.parametrize("direction", ["i2t", "t2i"])
def test_round_trip_scores_equal(tmp_path, bert_dir, direction):
    opt = dime_opt(direction=direction, lambda_softmax_CMRC=4.0 if direction == "i2t" else 9.0)
    model = source_model(bert_dir, opt)
    ckpt = release_checkpoint(model, opt)
    path = save(tmp_path, ckpt)
    out = import_dime_checkpoint(path, vocab=bert_dir, out=tmp_path / "dime.pt")
    loaded, run, encoder = load_trained_model(out)
    assert (
        run.model["direction"] == direction
        and run.model["lambda_softmax"] == opt.lambda_softmax_CMRC
    )
    assert run.data.max_caption_tokens == 6 and run.model["path_hidden"] == 128
    mapping = loaded.interaction.path_mapping.weight
    assert torch.equal(mapping, ckpt["model"][2]["path_mapping.weight"])
    got = scores(loaded, *inputs())
    torch.testing.assert_close(got, scores(model, *inputs()), rtol=0, atol=1e-6)
    folder_bert = build_model(run.model).text_encoder.bert.embeddings.word_embeddings.weight
    assert not torch.equal(loaded.text_encoder.bert.embeddings.word_embeddings.weight, folder_bert)
    ids = encoder.encode("a man runs .")
    assert ids[0] == 2 and ids[-1] == 3  # the folder's tokenizer: [CLS] ... [SEP]
    with pytest.raises(FileExistsError, match="--overwrite"):
        import_dime_checkpoint(path, vocab=bert_dir, out=out)


class Payload:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_a_malicious_pickle_is_refused(tmp_path, bert_dir):
    opt = dime_opt()
    ckpt = release_checkpoint(source_model(bert_dir, opt), opt)
    ckpt["opt"] = Payload(tmp_path / "ran")
    path = save(tmp_path, ckpt, "evil.tar")
    with pytest.raises(CheckpointImportError, match="evil.tar: refused: .*system"):
        import_dime_checkpoint(path, vocab=bert_dir, out=tmp_path / "o.pt")
    assert not (tmp_path / "o.pt").exists() and not (tmp_path / "ran").exists()


def test_a_truncated_file_is_named(tmp_path, bert_dir):
    opt = dime_opt()
    path = save(tmp_path, release_checkpoint(source_model(bert_dir, opt), opt))
    data = path.read_bytes()
    cut = tmp_path / "cut.pth.tar"
    cut.write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointImportError, match="cut.pth.tar"):
        import_dime_checkpoint(cut, vocab=bert_dir, out=tmp_path / "o.pt")


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"raw_feature_norm_CMRC": "softmax"}, "opt.raw_feature_norm_CMRC"),
        ({"no_imgnorm": True}, "opt.no_imgnorm"),
        ({"direction": "both"}, "opt.direction"),
        ({"max_words": 10**6}, "opt.max_words"),
    ],
)
def test_unsupported_options_are_named(tmp_path, bert_dir, change, message):
    model = source_model(bert_dir, dime_opt())
    path = save(tmp_path, release_checkpoint(model, dime_opt(**change)))
    with pytest.raises(CheckpointImportError, match=message):
        import_dime_checkpoint(path, vocab=bert_dir, out=tmp_path / "o.pt")


def test_layout_keys_and_folder_mismatches_are_named(tmp_path, bert_dir, monkeypatch):
    opt = dime_opt()
    model = source_model(bert_dir, opt)
    out = tmp_path / "o.pt"
    extra = release_checkpoint(model, opt)
    extra["model"][2]["dynamic_itr_l1.colour"] = torch.ones(1)
    with pytest.raises(
        CheckpointImportError, match=r"unexpected itr_module\.dynamic_itr_l1\.colour"
    ):
        import_dime_checkpoint(save(tmp_path, extra), vocab=bert_dir, out=out)
    wide = release_checkpoint(model, opt)
    wide["model"][0]["fc.weight"] = torch.ones(D, IN_DIM + 1)
    wide["opt"] = dime_opt()
    with pytest.raises(CheckpointImportError, match=r"img_enc\.fc\.weight has shape"):
        import_dime_checkpoint(save(tmp_path, wide), vocab=bert_dir, out=out)
    short = release_checkpoint(model, opt)
    short["model"] = short["model"][:2]
    with pytest.raises(CheckpointImportError, match="list of 2"):
        import_dime_checkpoint(save(tmp_path, short), vocab=bert_dir, out=out)
    good = save(tmp_path, release_checkpoint(model, opt))
    with pytest.raises(CheckpointImportError, match="vocab.txt: is a file"):
        import_dime_checkpoint(good, vocab=bert_dir / "vocab.txt", out=out)
    other = tmp_path / "other_bert"
    other.mkdir()
    config = (
        (bert_dir / "config.json")
        .read_text()
        .replace('"num_hidden_layers": 2', '"num_hidden_layers": 3')
    )
    (other / "config.json").write_text(config)
    with pytest.raises(CheckpointImportError, match="num_hidden_layers = 3 but .* holds 2"):
        import_dime_checkpoint(good, vocab=other, out=out)
    monkeypatch.setattr(import_dime, "DIME_MAX_WEIGHTS", 1000)
    with pytest.raises(CheckpointImportError, match="over the 1000"):
        import_dime_checkpoint(good, vocab=bert_dir, out=out)
    assert not out.exists()


def test_the_cli_imports_with_arch_dime(tmp_path, bert_dir, capsys):
    from vlret.cli import main

    opt = dime_opt()
    path = save(tmp_path, release_checkpoint(source_model(bert_dir, opt), opt))
    out = tmp_path / "imported.pt"
    args = ["import-checkpoint", str(path), "--arch", "dime", "--vocab", str(bert_dir)]
    assert main([*args, "--out", str(out)]) == 0
    assert capsys.readouterr().out.strip() == str(out) and out.exists()
    assert main([*args, "--out", str(out)]) == 2  # exists: one line naming --overwrite
    assert "--overwrite" in capsys.readouterr().err
    missing = tmp_path / "no_bert"
    assert main([*args[:-1], str(missing), "--out", str(tmp_path / "x.pt")]) == 2
    assert str(missing) in capsys.readouterr().err
