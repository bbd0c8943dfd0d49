"""Importing the released SCAN / BFAN / SGRAF checkpoints (vlret.run.import_checkpoint).

Checkpoints are written in exactly the reference ``train.py`` layout (reference parameter and
``argparse`` option names), imported, loaded through ``load_trained_model`` (in float64) and
compared at 1e-9 with a naive float64 oracle that loops over captions and images on the RAW
reference tensors: FC + l2norm, GRU cell by cell (directions averaged) + l2norm, then SCAN
``xattn_score_t2i/i2t``, BFAN ``xattn_score`` or SGRAF ``EncoderSimilarity``.
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import types
from collections import OrderedDict

import pytest
import torch
import torch.nn.functional as F

from vlret.cli.import_checkpoint import add_parser as add_import_parser
from vlret.data.writers import write_precomp
from vlret.eval import metrics_from_scores
from vlret.run.builders import encoder_from_state, load_trained_model
from vlret.run.checkpoint import load_checkpoint
from vlret.run.evaluate import run_evaluation
from vlret.run.import_checkpoint import CheckpointImportError, import_reference_checkpoint

E, WORD_DIM, IMG_DIM, SIM_DIM, N_REGIONS = 12, 7, 10, 6, 36
WORDS = ["<pad>", "<start>", "<end>", "<unk>", "a", "man", "with", "red", "helmet", "on"]
WORDS += ["small", "moped", "dirt", "road", ".", "dog", "'s", "n't", ",", "two"]
EPS = 1e-8


def _rand(gen: torch.Generator, *shape: int, scale: float = 0.5) -> torch.Tensor:
    return (torch.rand(*shape, generator=gen) * 2 - 1) * scale


def gru_state(gen, prefix: str, layers: int, bidirectional: bool) -> OrderedDict:
    out = OrderedDict()
    for layer in range(layers):
        in_dim = WORD_DIM if layer == 0 else E * (2 if bidirectional else 1)
        for sfx in ("", "_reverse") if bidirectional else ("",):
            out[f"{prefix}.weight_ih_l{layer}{sfx}"] = _rand(gen, 3 * E, in_dim)
            out[f"{prefix}.weight_hh_l{layer}{sfx}"] = _rand(gen, 3 * E, E)
            out[f"{prefix}.bias_ih_l{layer}{sfx}"] = _rand(gen, 3 * E)
            out[f"{prefix}.bias_hh_l{layer}{sfx}"] = _rand(gen, 3 * E)
    return out


def linear(state: OrderedDict, name: str, gen, out_dim: int, in_dim: int) -> None:
    state[f"{name}.weight"] = _rand(gen, out_dim, in_dim)
    state[f"{name}.bias"] = _rand(gen, out_dim, scale=0.1)


def batchnorm(state: OrderedDict, name: str, gen, dim: int) -> None:
    state[f"{name}.weight"] = 1 + _rand(gen, dim, scale=0.2)
    state[f"{name}.bias"] = _rand(gen, dim, scale=0.2)
    state[f"{name}.running_mean"] = _rand(gen, dim, scale=0.2)
    state[f"{name}.running_var"] = 0.5 + torch.rand(dim, generator=gen)
    if dim > 1:  # SAF's BatchNorm1d(1) without its counter, as PyTorch < 0.4.1 saved it
        state[f"{name}.num_batches_tracked"] = torch.tensor(1234)


def sim_enc_state(gen, module: str, steps: int) -> OrderedDict:
    """Paranioar/SGRAF ``EncoderSimilarity.state_dict()`` key names."""
    s = OrderedDict()
    linear(s, "v_global_w.embedding_local.0", gen, E, E)
    batchnorm(s, "v_global_w.embedding_local.1", gen, N_REGIONS)
    linear(s, "v_global_w.embedding_global.0", gen, E, E)
    batchnorm(s, "v_global_w.embedding_global.1", gen, E)
    linear(s, "v_global_w.embedding_common.0", gen, 1, E)
    linear(s, "t_global_w.embedding_local.0", gen, E, E)
    linear(s, "t_global_w.embedding_global.0", gen, E, E)
    linear(s, "t_global_w.embedding_common.0", gen, 1, E)
    linear(s, "sim_tranloc_w", gen, SIM_DIM, E)
    linear(s, "sim_tranglo_w", gen, SIM_DIM, E)
    linear(s, "sim_eval_w", gen, 1, SIM_DIM)
    if module == "SGR":
        for i in range(steps):
            for name in ("graph_query_w", "graph_key_w", "sim_graph_w"):
                linear(s, f"SGR_module.{i}.{name}", gen, SIM_DIM, SIM_DIM)
    else:
        linear(s, "SAF_module.attn_sim_w", gen, 1, SIM_DIM)
        batchnorm(s, "SAF_module.bn", gen, 1)
    return s


#: the options every reference train.py has, with the reference names
COMMON_OPT = dict(data_path="/data/", vocab_path="./vocab/", margin=0.2, batch_size=128)
COMMON_OPT.update(word_dim=WORD_DIM, embed_size=E, grad_clip=2.0, learning_rate=0.0002)
COMMON_OPT.update(workers=10, log_step=10, val_step=500, logger_name="./runs/runX/log")
COMMON_OPT.update(model_name="./runs/runX/checkpoint", max_violation=True, img_dim=IMG_DIM)
COMMON_OPT.update(no_imgnorm=False, no_txtnorm=False, vocab_size=len(WORDS))
COMMON_OPT.update(data_name="f30k_precomp", num_layers=1)


def scan_opt(**kw) -> argparse.Namespace:
    """kuanghuei/SCAN train.py options."""
    base = dict(COMMON_OPT, num_epochs=30, lr_update=15, resume="", precomp_enc_type="basic")
    base.update(raw_feature_norm="clipped_l2norm", agg_func="LogSumExp", cross_attn="t2i")
    base.update(bi_gru=True, lambda_lse=6.0, lambda_softmax=9.0)
    return argparse.Namespace(**{**base, **kw})


def bfan_opt(**kw) -> argparse.Namespace:
    """CrossmodalGroup/BFAN train.py options (no bi_gru: its GRU is always bidirectional)."""
    base = dict(COMMON_OPT, num_epochs=30, lr_update=15, resume="", precomp_enc_type="basic")
    base.update(lambda_softmax=20.0, focal_type="equal")
    return argparse.Namespace(**{**base, **kw})


def sgraf_opt(**kw) -> argparse.Namespace:
    """Paranioar/SGRAF opts.py options."""
    base = dict(COMMON_OPT, num_epochs=40, lr_update=30, sim_dim=SIM_DIM, bi_gru=True)
    base.update(module_name="SGR", sgr_step=3)
    return argparse.Namespace(**{**base, **kw})


def reference_checkpoint(arch: str, opt: argparse.Namespace, seed: int = 0) -> dict:
    gen = torch.Generator().manual_seed(seed)
    img = OrderedDict()
    linear(img, "fc", gen, E, IMG_DIM)
    txt = OrderedDict([("embed.weight", _rand(gen, len(WORDS), WORD_DIM))])
    rnn = "cap_rnn" if arch == "sgraf" else "rnn"
    txt.update(gru_state(gen, rnn, opt.num_layers, getattr(opt, "bi_gru", True)))
    model = [img, txt]
    if arch == "sgraf":
        model.append(sim_enc_state(gen, opt.module_name, opt.sgr_step))
    return {"epoch": 12, "model": model, "best_rsum": 480.25, "opt": opt, "Eiters": 4321}


def write_reference(tmp_path, arch: str, opt: argparse.Namespace, *, legacy=False, seed=0):
    path = tmp_path / f"{arch}_model_best.pth.tar"
    # SCAN's and BFAN's checkpoints predate the zip format (PyTorch 0.3/0.4, Python 2).
    torch.save(
        reference_checkpoint(arch, opt, seed), path, _use_new_zipfile_serialization=not legacy
    )
    return path


def write_vocab(tmp_path, words=WORDS, name="f30k_precomp_vocab.json"):
    path = tmp_path / name
    w2i, i2w = {w: i for i, w in enumerate(words)}, {str(i): w for i, w in enumerate(words)}
    path.write_text(json.dumps({"word2idx": w2i, "idx2word": i2w, "idx": len(words)}))
    return path


def run_import(tmp_path, src, arch, *, vocab=None, out="o.pt", **kwargs):
    vocab = write_vocab(tmp_path) if vocab is None else vocab
    return import_reference_checkpoint(src, arch=arch, vocab=vocab, out=tmp_path / out, **kwargs)


def save(tmp_path, obj, name="x.pth.tar"):
    torch.save(obj, tmp_path / name)
    return tmp_path / name


def l2norm(x: torch.Tensor) -> torch.Tensor:
    return x / (x.pow(2).sum(dim=-1, keepdim=True).sqrt() + EPS)


def cosine(x1: torch.Tensor, x2: torch.Tensor) -> torch.Tensor:
    return (x1 * x2).sum(-1) / (x1.norm(dim=-1) * x2.norm(dim=-1)).clamp(min=EPS)


def lin(state, name, x):
    return x @ state[f"{name}.weight"].double().t() + state[f"{name}.bias"].double()


def ref_images(img_state, feats):
    return l2norm(lin(img_state, "fc", feats.double()))


def gru_direction(txt, name, xs, reverse):
    """nn.GRU's cell (gates r, z, n in that order) over one caption, in one direction."""
    keys = ("weight_ih", "weight_hh", "bias_ih", "bias_hh")
    w_ih, w_hh, b_ih, b_hh = (txt[name.format(k)].double() for k in keys)
    h, outs = torch.zeros(E, dtype=torch.float64), {}
    for t in reversed(range(len(xs))) if reverse else range(len(xs)):
        gi, gh = w_ih @ xs[t] + b_ih, w_hh @ h + b_hh
        r, z = torch.sigmoid(gi[:E] + gh[:E]), torch.sigmoid(gi[E : 2 * E] + gh[E : 2 * E])
        h = outs[t] = (1 - z) * torch.tanh(gi[2 * E :] + r * gh[2 * E :]) + z * h
    return torch.stack([outs[t] for t in range(len(xs))])


def ref_words(txt, prefix, ids, layers, bidirectional):
    """One caption's word features (n, E): embedding, GRU layers, directions averaged, l2norm."""
    xs = txt["embed.weight"].double()[ids]
    for layer in range(layers):
        dirs = ["", "_reverse"] if bidirectional else [""]
        xs = torch.cat([gru_direction(txt, f"{prefix}.{{}}_l{layer}{d}", xs, d) for d in dirs], 1)
    if bidirectional:
        xs = (xs[:, :E] + xs[:, E:]) / 2
    return l2norm(xs)


def ref_attention(query, context, lam, focal=None):
    """Reference func_attention for one pair: query (q, d) attends over context (c, d)."""
    attn = F.leaky_relu(context @ query.t(), 0.1)  # (c, q)
    attn = attn / (attn.pow(2).sum(dim=1, keepdim=True).sqrt() + EPS)  # each context over q
    attn = torch.softmax(attn.t() * lam, dim=1)  # (q, c)
    if focal is not None:
        c = attn.shape[1]
        rows = []
        for row in attn:
            if focal == "equal":
                keep = [float(row[i] * c - row.sum()) > 0 for i in range(c)]
            else:
                keep = [float(((row[i] - row) * row.sqrt()).sum()) > 0 for i in range(c)]
            kept = row * torch.tensor(keep, dtype=row.dtype)
            rows.append(kept / kept.sum())
        attn = torch.stack(rows)
    return attn @ context


def pool(rel, opt):
    if opt.agg_func == "LogSumExp":
        return torch.log(torch.exp(rel * opt.lambda_lse).sum()) / opt.lambda_lse
    return {"Mean": rel.mean, "Max": rel.max, "Sum": rel.sum}[opt.agg_func]()


def ref_scan_pair(v, w, opt):
    if opt.cross_attn == "t2i":
        return pool(cosine(w, ref_attention(w, v, opt.lambda_softmax)), opt)
    return pool(cosine(v, ref_attention(v, w, opt.lambda_softmax)), opt)


def ref_bfan_pair(v, w, opt):
    t2i = cosine(w, ref_attention(w, v, opt.lambda_softmax, opt.focal_type)).mean()
    i2t = cosine(v, ref_attention(v, w, opt.lambda_softmax, opt.focal_type)).mean()
    return t2i + i2t


def bn(state, name, x, channel_dim):
    shape = [1] * x.dim()
    shape[channel_dim] = -1

    def p(key):
        return state[f"{name}.{key}"].double().view(shape)

    return (x - p("running_mean")) / torch.sqrt(p("running_var") + 1e-5) * p("weight") + p("bias")


def ref_global(sim, name, x, with_bn):
    """VisualSA (with its BatchNorms) / TextSA of one image / caption, eval mode."""
    l_emb = lin(sim, f"{name}.embedding_local.0", x)
    g_emb = lin(sim, f"{name}.embedding_global.0", x.mean(0))
    if with_bn:  # BatchNorm1d(36) on (1, 36, E): one channel per region slot
        l_emb = bn(sim, f"{name}.embedding_local.1", l_emb, 0)
        g_emb = bn(sim, f"{name}.embedding_global.1", g_emb, 0)
    common = lin(sim, f"{name}.embedding_common.0", torch.tanh(l_emb) * torch.tanh(g_emb))
    return l2norm((torch.softmax(common.squeeze(1), 0).unsqueeze(1) * x).sum(0))


def ref_sgraf_pair(v, w, sim, opt):
    """Paranioar/SGRAF EncoderSimilarity for one (image, caption), eval mode."""
    img_glo = ref_global(sim, "v_global_w", v, True)
    cap_glo = ref_global(sim, "t_global_w", w, False)
    context = l2norm(ref_attention(w, v, 9.0))
    sim_loc = l2norm(lin(sim, "sim_tranloc_w", (context - w) ** 2))
    sim_glo = l2norm(lin(sim, "sim_tranglo_w", (img_glo - cap_glo) ** 2))
    nodes = torch.cat([sim_glo.unsqueeze(0), sim_loc])
    if opt.module_name == "SGR":
        for i in range(opt.sgr_step):
            q = lin(sim, f"SGR_module.{i}.graph_query_w", nodes)
            k = lin(sim, f"SGR_module.{i}.graph_key_w", nodes)
            edges = torch.softmax(q @ k.t(), dim=-1)
            nodes = torch.relu(lin(sim, f"SGR_module.{i}.sim_graph_w", edges @ nodes))
        vec = nodes[0]
    else:
        a = torch.sigmoid(bn(sim, "SAF_module.bn", lin(sim, "SAF_module.attn_sim_w", nodes).t(), 0))
        a = a / (a.abs().sum(dim=-1, keepdim=True) + EPS)
        vec = l2norm((a @ nodes).squeeze(0))
    return torch.sigmoid(lin(sim, "sim_eval_w", vec)).squeeze()


def reference_scores(arch, ckpt, feats, caps, lengths):
    img, txt = ckpt["model"][0], ckpt["model"][1]
    opt = ckpt["opt"]
    regions = ref_images(img, feats)
    prefix = "cap_rnn" if arch == "sgraf" else "rnn"
    bi = getattr(opt, "bi_gru", True) if arch != "bfan" else True
    out = torch.zeros(len(feats), len(caps), dtype=torch.float64)
    for j in range(len(caps)):  # per caption, as the reference loops
        w = ref_words(txt, prefix, caps[j, : lengths[j]], opt.num_layers, bi)
        for i in range(len(feats)):
            if arch == "scan":
                out[i, j] = ref_scan_pair(regions[i], w, opt)
            elif arch == "bfan":
                out[i, j] = ref_bfan_pair(regions[i], w, opt)
            else:
                out[i, j] = ref_sgraf_pair(regions[i], w, ckpt["model"][2], opt)
    return out


def inputs(regions):
    gen = torch.Generator().manual_seed(1)
    feats = torch.randn(3, regions, IMG_DIM, generator=gen, dtype=torch.float64)
    lengths = torch.tensor([6, 2, 9, 4])
    caps = torch.randint(4, len(WORDS), (4, 9), generator=gen)
    caps[:, 0] = 1  # <start>; <end> at each caption's length, <pad> after it
    for j, n in enumerate(lengths.tolist()):
        caps[j, n - 1], caps[j, n:] = 2, 0
    return feats, caps, lengths


SGRAF_KEYS = ("module", "sim_dim", "sgr_steps", "lambda_softmax", "dropout")
CASES = [
    ("scan", lambda: scan_opt(cross_attn="t2i", agg_func="LogSumExp", lambda_softmax=9.0), True),
    ("scan", lambda: scan_opt(cross_attn="i2t", agg_func="Mean", lambda_softmax=4.0), True),
    ("scan", lambda: scan_opt(cross_attn="t2i", agg_func="Max", num_layers=2), False),
    ("scan", lambda: scan_opt(cross_attn="i2t", agg_func="Sum", bi_gru=False), False),
    ("bfan", lambda: bfan_opt(focal_type="equal"), True),
    ("bfan", lambda: bfan_opt(focal_type="prob"), True),
    ("sgraf", lambda: sgraf_opt(module_name="SGR", sgr_step=3), False),
    ("sgraf", lambda: sgraf_opt(module_name="SAF", sgr_step=2), False),
]


@pytest.mark.parametrize("arch, make_opt, legacy", CASES)
def test_imported_scores_equal_the_reference_computation(tmp_path, arch, make_opt, legacy):
    opt = make_opt()
    path = write_reference(tmp_path, arch, opt, legacy=legacy)
    out = run_import(tmp_path, path, arch, out="model.pt")
    feats, caps, lengths = inputs(regions=N_REGIONS if arch == "sgraf" else 5)
    model, config, _ = load_trained_model(out)
    with torch.no_grad():
        model = model.double()
        got = model.score(model.encode_images(feats), model.encode_texts(caps, lengths), lengths)
    expected = reference_scores(arch, reference_checkpoint(arch, opt), feats, caps, lengths)
    assert got.dtype == torch.float64
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-9)
    assert config.model["kind"] == arch
    assert config.data.format == "precomp"
    assert config.data.root == "/data/f30k_precomp"
    assert (config.loss.name, config.loss.params) == ("triplet", {"margin": 0.2, "hardest": True})
    if arch == "sgraf":  # SGRAF's code fixes lambda 9 and dropout 0.4
        sgraf = (opt.module_name.lower(), SIM_DIM, opt.sgr_step, 9.0, 0.4)
        assert tuple(config.model[k] for k in SGRAF_KEYS) == sgraf


def test_an_imported_scan_ensemble_evaluates_as_the_reference(tmp_path):
    """vlret eval of the paper's SCAN ensemble (t2i + i2t) from imported checkpoints gives the
    metrics of the averaged reference score matrices (distinct captions of known words, so
    the float32 evaluation and the float64 oracle rank alike)."""
    gen = torch.Generator().manual_seed(5)
    known = WORDS[4:]
    words = [known[int(i)] for i in torch.randint(len(known), (20 * 8,), generator=gen)]
    captions = [" ".join(words[8 * k : 8 * k + 3 + k % 6]) for k in range(20)]
    feats = torch.randn(4, 5, IMG_DIM, generator=gen, dtype=torch.float64)
    write_precomp(tmp_path / "f30k", "test", feats.float().numpy(), captions, ids=range(4))
    opts = [scan_opt(), scan_opt(cross_attn="i2t", agg_func="Mean", lambda_softmax=4.0)]
    ckpts = [reference_checkpoint("scan", opt, seed=k) for k, opt in enumerate(opts)]
    paths = [save(tmp_path, c, f"{k}.tar") for k, c in enumerate(ckpts)]
    outs = [run_import(tmp_path, p, "scan", out=f"{p.stem}.pt") for p in paths]
    result = run_evaluation(outs, data=tmp_path / "f30k", split="test", protocol="f30k")
    word2idx = {w: i for i, w in enumerate(WORDS)}
    ids = [torch.tensor([1, *(word2idx[t] for t in c.split()), 2]) for c in captions]
    caps = torch.nn.utils.rnn.pad_sequence(ids, batch_first=True)
    lengths = torch.tensor([len(i) for i in ids])
    sim = sum(reference_scores("scan", c, feats.float(), caps, lengths) for c in ckpts) / 2
    expected = metrics_from_scores(sim, torch.arange(20) // 5)
    assert result.members == tuple(map(str, outs))
    assert result.metrics.as_dict() == pytest.approx(expected.as_dict())


def test_model_config_and_record_follow_opt(tmp_path):
    opt = scan_opt(cross_attn="i2t", agg_func="Mean", lambda_softmax=4.0, lambda_lse=5.0)
    opt.max_violation, opt.num_epochs, opt.lr_update = False, 20, 8
    path = write_reference(tmp_path, "scan", opt)
    out = run_import(tmp_path, path, "scan", out="m.pt")
    state = load_checkpoint(out)
    model = state["config"]["model"]
    assert model["direction"] == "i2t" and model["aggregation"] == "mean"
    assert (model["lambda_softmax"], model["lambda_lse"]) == (4.0, 5.0)
    assert model["text"] == {"word_dim": WORD_DIM, "num_layers": 1, "bidirectional": True}
    assert model["image"] == {"in_dim": IMG_DIM}
    assert state["config"]["loss"] == {"name": "triplet", "margin": 0.2, "hardest": False}
    config = state["config"]
    assert (config["optim"]["decay_epochs"], config["train"]["epochs"]) == ([8, 16], 20)
    assert state["vocab_size"] == len(WORDS)
    record = state["imported_from"]
    assert (record["arch"], record["code"], record["epoch"]) == ("scan", "kuanghuei/SCAN", 12)
    assert record["best_rsum"] == 480.25 and record["opt"]["agg_func"] == "Mean"
    assert len(record["sha256"]) == 64


def test_caption_encoder_reproduces_the_reference_ids(tmp_path):
    out = run_import(tmp_path, write_reference(tmp_path, "bfan", bfan_opt()), "bfan")
    encoder = encoder_from_state(load_checkpoint(out)["encoder"])
    word2idx = {w: i for i, w in enumerate(WORDS)}
    # (caption as in {split}_caps.txt, NLTK word_tokenize of its lower-cased text)
    cases = [
        ("A man with a red helmet on a small moped .", "a man with a red helmet on a small moped .")
    ]
    cases += [("Two dog 's , on a zebra road", "two dog 's , on a zebra road")]
    cases += [("A MAN on a moped.", "a man on a moped .")]
    for caption, nltk_tokens in cases:
        # the reference __getitem__: <start>, vocab(token) (<unk> if unknown), <end>
        expected = [word2idx["<start>"]]
        expected += [word2idx.get(t, word2idx["<unk>"]) for t in nltk_tokens.split()]
        expected.append(word2idx["<end>"])
        assert encoder.encode(caption) == expected, caption


@pytest.mark.parametrize("caption", ["a man do n't run", "a man don't run"])
def test_captions_where_nltk_tokenises_differently(tmp_path, caption):
    """The reference vocabularies hold NLTK tokens (n't, ``, '', mrs., 3.5) that vlret's own
    regex tokeniser never produces: an imported checkpoint's vocabulary tokenises with NLTK's
    Treebank rules, which give "a man do n't run" for both."""
    out = run_import(tmp_path, write_reference(tmp_path, "bfan", bfan_opt()), "bfan")
    encoder = encoder_from_state(load_checkpoint(out)["encoder"])
    assert encoder.encode(caption)[1:-1] == [
        WORDS.index(t) if t in WORDS else 3 for t in "a man do n't run".split()
    ]


class Payload:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


class TrainingScriptClass:
    pass


@pytest.mark.parametrize("kind", ["reduce", "class"])
def test_a_pickle_with_another_object_is_refused(tmp_path, kind):
    ckpt = reference_checkpoint("scan", scan_opt())
    ckpt["opt"] = Payload(tmp_path / "ran") if kind == "reduce" else TrainingScriptClass()
    shown = "system" if kind == "reduce" else "TrainingScriptClass"
    with pytest.raises(CheckpointImportError, match=f"evil.tar: refused: .*{shown}"):
        run_import(tmp_path, save(tmp_path, ckpt, "evil.tar"), "scan")
    assert not (tmp_path / "o.pt").exists() and not (tmp_path / "ran").exists()


def test_python2_byte_strings_are_read_as_latin1(tmp_path):
    class Py2Str(str):
        """Written as Python 2 wrote a byte string: SHORT_BINSTRING, here not UTF-8."""

    class Pickler(pickle._Pickler):
        dispatch = dict(pickle._Pickler.dispatch)

        def save_py2(self, obj):
            data = obj.encode("latin1")
            self.write(pickle.SHORT_BINSTRING + bytes([len(data)]) + data)
            self.memoize(obj)

        dispatch[Py2Str] = save_py2

    module = types.SimpleNamespace(
        __name__="py2_pickle",
        Pickler=Pickler,
        dump=lambda obj, f, protocol=2: Pickler(f, protocol).dump(obj),
    )
    ckpt = reference_checkpoint("scan", scan_opt(data_path=Py2Str("/donn\xe9es/")))
    path = tmp_path / "py2.pth.tar"
    torch.save(
        ckpt, path, pickle_module=module, pickle_protocol=2, _use_new_zipfile_serialization=False
    )
    out = run_import(tmp_path, path, "scan")
    assert load_checkpoint(out)["config"]["data"]["root"] == "/donn\xe9es/f30k_precomp"


def shorter(d):
    d.update(idx=19, word2idx=dict(list(d["word2idx"].items())[:19]))
    d["idx2word"].pop("19")


@pytest.mark.parametrize(
    "mutate, message",
    [
        (lambda d: d.update(idx=d["idx"] + 1), "idx is 21 but idx2word has 20"),
        (lambda d: d["word2idx"].pop("dog"), "word2idx 19 entries"),
        (lambda d: d["idx2word"].update({"5": "dog"}), r"word2idx\['dog'\] is 15, idx2word says 5"),
        (shorter, "19 words but .* txt_enc.embed.weight has 20;"),  # consistent, but too short
    ],
)
def test_a_vocabulary_that_disagrees_is_refused(tmp_path, mutate, message):
    path = write_vocab(tmp_path)
    data = json.loads(path.read_text())
    mutate(data)
    path.write_text(json.dumps(data))
    ckpt = write_reference(tmp_path, "scan", scan_opt())
    with pytest.raises(ValueError, match=message):
        run_import(tmp_path, ckpt, "scan", vocab=path)


def test_wrong_arch_is_refused_naming_the_key(tmp_path):
    vocab = write_vocab(tmp_path)
    sgraf = write_reference(tmp_path, "sgraf", sgraf_opt())
    with pytest.raises(ValueError, match="holds 3 state dicts; --arch scan expects 2"):
        run_import(tmp_path, sgraf, "scan", vocab=vocab)
    scan = write_reference(tmp_path, "scan", scan_opt())
    with pytest.raises(ValueError, match="holds 2 state dicts; --arch sgraf expects 3"):
        run_import(tmp_path, scan, "sgraf", vocab=vocab)
    with pytest.raises(ValueError, match="opt.focal_type: missing"):
        run_import(tmp_path, scan, "bfan", vocab=vocab)
    # an SGRAF text encoder (cap_rnn) under SCAN's two state dicts and opt
    ckpt = reference_checkpoint("sgraf", sgraf_opt())
    ckpt["model"], ckpt["opt"] = ckpt["model"][:2], scan_opt()
    with pytest.raises(ValueError, match=r"missing txt_enc\.rnn\.weight_ih_l0, .*; found cap_rnn"):
        run_import(tmp_path, save(tmp_path, ckpt), "scan", vocab=vocab)


def test_unexpected_and_misshapen_keys_are_named(tmp_path):
    extra = reference_checkpoint("bfan", bfan_opt())
    extra["model"][0]["fc.weight_g"] = torch.ones(1)
    one_way = reference_checkpoint("scan", scan_opt(bi_gru=False))
    one_way["opt"].bi_gru = True
    wide = reference_checkpoint("bfan", bfan_opt(embed_size=E + 1))
    for ckpt, arch, message in [
        (extra, "bfan", r"unexpected img_enc\.fc\.weight_g"),
        (
            wide,
            "bfan",
            r"opt\.embed_size = 13, .* imply img_enc\.fc\.weight of shape \(13, 10\), but it has "
            r"shape \(12, 10\)",
        ),
        (one_way, "scan", r"missing txt_enc\.rnn\.weight_ih_l0_reverse"),
    ]:
        with pytest.raises(ValueError, match=message):
            run_import(tmp_path, save(tmp_path, ckpt), arch)


@pytest.mark.parametrize(
    "change, option",
    [
        ({"raw_feature_norm": "softmax"}, "opt.raw_feature_norm = 'softmax'"),
        ({"precomp_enc_type": "weight_norm"}, "opt.precomp_enc_type = 'weight_norm'"),
        ({"no_imgnorm": True}, "opt.no_imgnorm = True"),
        ({"no_txtnorm": True}, "opt.no_txtnorm = True"),
        ({"agg_func": "Median"}, "opt.agg_func = 'Median'"),
        ({"cross_attn": "both"}, "opt.cross_attn = 'both'"),
        ({"embed_size": "big"}, "opt.embed_size: expected a positive int"),
    ],
)
def test_settings_vlret_does_not_implement_are_refused_naming_the_option(tmp_path, change, option):
    path = write_reference(tmp_path, "scan", scan_opt(**change))
    with pytest.raises(ValueError, match=option.replace("(", r"\(")) as info:
        run_import(tmp_path, path, "scan")
    assert "\n" not in str(info.value)


def test_layout_errors(tmp_path):
    vocab = write_vocab(tmp_path)
    for bad, message in [
        ({"model": []}, "no 'opt' key"),
        ({"model": {"fc.weight": torch.ones(1)}, "opt": scan_opt()}, "'model' is dict"),
        ({"model": [{}, {"embed.weight": 3}], "opt": scan_opt()}, r"txt_enc\.embed\.weight is int"),
        ([1, 2], "top level is list"),
    ]:
        save(tmp_path, bad)
        with pytest.raises(ValueError, match=message):
            run_import(tmp_path, tmp_path / "x.pth.tar", "scan", vocab=vocab)
    (tmp_path / "junk.pth.tar").write_bytes(b"not a checkpoint at all")
    with pytest.raises(ValueError, match="junk.pth.tar: not a PyTorch checkpoint"):
        run_import(tmp_path, tmp_path / "junk.pth.tar", "scan", vocab=vocab)
    with pytest.raises(FileNotFoundError, match="nope.pth.tar"):
        run_import(tmp_path, tmp_path / "nope.pth.tar", "scan", vocab=vocab)
    with pytest.raises(ValueError, match="arch must be one of"):
        run_import(tmp_path, tmp_path / "x.pth.tar", "vse", vocab=vocab)


def test_an_existing_output_is_kept_unless_overwrite(tmp_path):
    path = write_reference(tmp_path, "bfan", bfan_opt())
    vocab = write_vocab(tmp_path)
    out = tmp_path / "m.pt"
    out.write_bytes(b"precious")
    with pytest.raises(FileExistsError, match="--overwrite"):
        import_reference_checkpoint(path, arch="bfan", vocab=vocab, out=out)
    assert out.read_bytes() == b"precious"
    import_reference_checkpoint(path, arch="bfan", vocab=vocab, out=out, overwrite=True)
    assert load_checkpoint(out)["config"]["model"]["kind"] == "bfan"


def test_command_line(tmp_path, capsys):
    parser = argparse.ArgumentParser(prog="vlret")
    add_import_parser(parser.add_subparsers(dest="command"))
    path = write_reference(tmp_path, "bfan", bfan_opt(focal_type="prob"))
    vocab = write_vocab(tmp_path)
    out = tmp_path / "m.pt"
    argv = f"import-checkpoint {path} --arch bfan --vocab {vocab} --out {out}".split()

    def run(argv):
        args = parser.parse_args(argv)
        return args.func(args)

    assert run(argv) == 0 and str(out) in capsys.readouterr().out
    assert run(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("vlret import-checkpoint: ") and "--overwrite" in err
    assert err.count("\n") == 1
    assert run([*argv, "--overwrite"]) == 0
    assert run([*argv[:3], "scan", *argv[4:], "--overwrite"]) == 2
    assert "opt.agg_func: missing" in capsys.readouterr().err
