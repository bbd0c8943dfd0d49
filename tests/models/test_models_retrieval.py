"""RetrievalModel and build_model: the trainer's contract, the config schema, house rules."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch.utils.data import DataLoader

from vlret.data import PrecompDataset, Vocabulary, build_precomp_vocab
from vlret.data.writers import make_tiny_precomp
from vlret.models import GRUTextEncoder, ImageEncoder, RetrievalModel, VideoEncoder, build_model

MODELS_DIR = Path(__file__).resolve().parents[2] / "src" / "vlret" / "models"

VSE = {
    "image": {"kind": "precomp", "in_dim": 16, "pooling": "max", "region_dropout": 0.0},
    "text": {"kind": "gru", "word_dim": 12, "bidirectional": True, "pooling": "last"},
    "embed_dim": 8,
}


@pytest.fixture(scope="module")
def precomp(tmp_path_factory):
    root = tmp_path_factory.mktemp("precomp")
    make_tiny_precomp(root, feature_shape=(4, 16))
    vocab = build_precomp_vocab(root, min_count=1)
    return PrecompDataset(root, "train", encoder=vocab), vocab


def test_forward_on_a_real_batch(precomp):
    dataset, vocab = precomp
    torch.manual_seed(0)
    model = build_model(VSE, vocab_size=len(vocab))
    assert isinstance(model.image_encoder, ImageEncoder)
    assert isinstance(model.text_encoder, GRUTextEncoder) and model.text_encoder.bidirectional
    batch = next(iter(DataLoader(dataset, batch_size=7, collate_fn=dataset.collate)))
    img, txt = model(batch)
    assert img.shape == txt.shape == (7, 8)
    assert torch.equal(img, model.encode_images(batch.features))
    assert torch.equal(txt, model.encode_texts(batch.captions, batch.lengths))
    norms = img.norm(dim=1)
    assert not torch.allclose(norms, torch.ones_like(norms))  # not normalised by default
    (img * txt).sum().backward()
    missing = [n for n, p in model.named_parameters() if p.grad is None]
    assert not missing


def test_normalize_option_gives_unit_rows(precomp):
    dataset, vocab = precomp
    model = build_model({**VSE, "normalize": True}, vocab_size=len(vocab))
    batch = dataset.collate([dataset[i] for i in range(5)])
    img, txt = model(batch)
    assert torch.allclose(img.norm(dim=1), torch.ones(5), atol=1e-5)
    assert torch.allclose(txt.norm(dim=1), torch.ones(5), atol=1e-5)


def test_defaults_are_vse_pp_butd():
    model = build_model({}, vocab_size=30)
    assert model.config["image"] == {
        "kind": "precomp",
        "in_dim": 2048,
        "pooling": "max",
        "region_dropout": 0.0,
        "gpo_pe_dim": 32,
        "gpo_hidden": 32,
        "gpo_temperature": 0.1,
    }
    text = model.config["text"]
    assert (text["kind"], text["word_dim"], text["pooling"], text["vocab_size"]) == (
        "gru",
        300,
        "last",
        30,
    )
    assert model.embed_dim == 1024 and model.tokenizer_path is None


def test_resolved_config_rebuilds_the_same_model():
    cfg = {
        "image": {"pooling": "gpo", "region_dropout": 0.2, "in_dim": 10},
        "text": {"pooling": "gpo", "bidirectional": True, "word_dim": 6},
        "embed_dim": 4,
    }
    torch.manual_seed(1)
    first = build_model(cfg, vocab_size=11)
    torch.manual_seed(1)
    again = build_model(first.config)  # vocab_size travels in the resolved config
    a, b = first.state_dict(), again.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert first.image_encoder.region_dropout == 0.2


def test_video_kind():
    model = build_model(
        {"image": {"kind": "video", "in_dim": 6, "frame_dropout": 0.1}, "embed_dim": 4},
        vocab_size=9,
    )
    assert isinstance(model.image_encoder, VideoEncoder)
    assert model.image_encoder.pooling == "mean" and model.image_encoder.frame_dropout == 0.1
    frames = torch.randn(2, 5, 6)
    assert model.eval().encode_images(frames, torch.tensor([5, 2])).shape == (2, 4)


@pytest.mark.parametrize(
    ("config", "kwargs", "pattern"),
    [
        ({"embed_dims": 8}, {}, r"unknown key 'embed_dims'.*valid keys: \['embed_dim'"),
        ({"kind": "vsrn"}, {}, r"model.kind: unknown kind 'vsrn'; valid kinds: \['bert', 'bfan'"),
        ({"image": {"kind": "grid"}}, {}, r"image.kind: unknown kind 'grid'.*precomp"),
        ({"image": {"dropout": 0.2}}, {}, r"image: unknown key 'dropout'.*region_dropout"),
        ({"text": {"hidden": 3}}, {}, r"text: unknown key 'hidden'.*word_dim"),
        ({"text": {"pooling": "cls"}}, {}, r"text.pooling: unknown pooling 'cls'.*'last'"),
        ({"image": {"pooling": "sum"}}, {}, r"image.pooling.*'gpo'"),
        ({"text": {"bidirectional": "yes"}}, {}, r"text.bidirectional must be true or false"),
        ({}, {"vocab_size": None}, r"text.vocab_size.*build_model\(config, vocab_size"),
        ({"text": {"vocab_size": 5}}, {"vocab_size": 6}, r"disagrees"),
        ({"kind": "clip"}, {}, r"model: a CLIP takes exactly one of 'path'"),
        ({"text": {"kind": "bert"}}, {}, r"text: key 'path' is required"),
        ({"kind": "clip", "path": "x", "image": {}}, {}, r"unknown key 'image'"),
        ([("kind", "vse")], {}, r"config must be a dict"),
    ],
)
def test_bad_configs_name_the_key(config, kwargs, pattern):
    with pytest.raises(ValueError, match=pattern):
        build_model(config, **kwargs)


def test_bert_shorthand_and_text_section(tmp_path):
    transformers = pytest.importorskip("transformers")
    (tmp_path / "vocab.txt").write_text("[PAD]\n[UNK]\n[CLS]\n[SEP]\na\ndog\n", encoding="utf-8")
    transformers.BertTokenizer(str(tmp_path / "vocab.txt")).save_pretrained(str(tmp_path))
    cfg = transformers.BertConfig(
        vocab_size=6, hidden_size=8, num_hidden_layers=1, num_attention_heads=2,
        intermediate_size=8, max_position_embeddings=16,
    )  # fmt: skip
    transformers.BertModel(cfg).save_pretrained(str(tmp_path))
    image = {"in_dim": 5, "pooling": "gpo"}
    short = build_model({"kind": "bert", "path": tmp_path, "image": image, "embed_dim": 4})
    long = build_model(
        {"image": image, "text": {"kind": "bert", "path": str(tmp_path)}, "embed_dim": 4}
    )
    for model in (short, long):
        assert model.tokenizer_path == str(tmp_path)
        img, txt = (
            model.encode_images(torch.randn(2, 3, 5)),
            model.encode_texts(torch.tensor([[2, 4, 5, 3], [2, 5, 3, 0]]), torch.tensor([4, 3])),
        )
        assert img.shape == txt.shape == (2, 4)
    rebuilt = build_model(short.config)
    assert rebuilt.state_dict().keys() == short.state_dict().keys()
    with pytest.raises(ValueError, match="text.kind"):
        build_model({"kind": "bert", "path": tmp_path, "text": {"kind": "gru"}})


def test_retrieval_model_rejects_mismatched_dims_and_raw_inputs():
    with pytest.raises(ValueError, match="embed_dim"):
        RetrievalModel(ImageEncoder(in_dim=4, embed_dim=3), GRUTextEncoder(5, embed_dim=4))
    model = RetrievalModel(ImageEncoder(in_dim=4, embed_dim=3), GRUTextEncoder(5, embed_dim=3))
    with pytest.raises(ValueError, match="image_transform"):
        model.encode_images([Path("a.jpg")])
    with pytest.raises(ValueError, match="RetrievalBatch"):
        model((torch.randn(2, 4), torch.ones(2, 3, dtype=torch.long)))


def test_models_never_import_losses_and_hf_is_lazy():
    for path in MODELS_DIR.glob("*.py"):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                names = [node.module or ""]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            else:
                continue
            for name in names:
                assert "loss" not in name, f"{path.name} imports {name}"
                if node.col_offset == 0:  # module level
                    assert not name.startswith(("transformers", "PIL")), path.name
    code = (
        "import sys; sys.modules['transformers'] = None; sys.modules['PIL'] = None\n"
        "import vlret.models as m\n"
        "model = m.build_model({'image': {'in_dim': 4}, 'embed_dim': 3}, vocab_size=7)\n"
        "try:\n"
        "    m.build_model({'kind': 'clip', 'path': '.'})\n"
        "except ImportError as err:\n"
        "    print(err)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "pip install vlret[hf]" in out.stdout


def test_vocabulary_size_from_a_vocabulary_object():
    vocab = Vocabulary(["<pad>", "<start>", "<end>", "<unk>", "dog"])
    model = build_model({"embed_dim": 4, "image": {"in_dim": 3}}, vocab_size=len(vocab))
    assert model.text_encoder.embed.num_embeddings == 5
    ids = torch.tensor([vocab.encode("dog dog"), vocab.encode("cat dog")])
    assert model.encode_texts(ids, torch.tensor([4, 4])).shape == (2, 4)
