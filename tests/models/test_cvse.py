"""CVSE against the release's computation written out sample by sample (benchmarks/ref_cvse.py).

The oracles: ``reference_scores`` (the release's per-caption ``t2i_sep_sim`` in float64) for the
block scorer's scores and gradients, ``reference_levels`` (each image and caption on its own,
the text softmax unmasked over padding as the release's, BatchNorm written out) for the
encoders' rows, concept weights and parameter gradients, a numpy loop for the concept GCN, and
a loop over the tokens for the caption labels.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from bench_modules import benchmark_fixture, one_thread_fixture
from vlret.data.vocab import build_vocab, tokenize
from vlret.losses.registry import build_loss
from vlret.models import build_model
from vlret.models.matchers.cvse import CVSE
from vlret.models.matchers.cvse_concepts import compute_concept_stats
from vlret.models.matchers.cvse_files import write_concept_folder
from vlret.train.procedures.cvse import CVSEStep, build, concept_kl

D, R, F_IN, C = 12, 5, 10, 6
CAPTIONS = [
    "a man in a red shirt rides a bike",
    "a dog runs on green grass",
    "a woman and a man sit on a bench",
    "the red dog sleeps on a mat",
    "a woman with a dog walks",
    "two men play with a red ball",
] * 3
VOCAB = build_vocab(CAPTIONS, min_count=1)


_one_thread = one_thread_fixture()


ref = benchmark_fixture("ref_cvse")


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    out = tmp_path_factory.mktemp("concepts")
    tokens = [tokenize(c) for c in CAPTIONS]
    n_img = len(CAPTIONS) // 2
    stats = compute_concept_stats(
        tokens,
        [i // 2 for i in range(len(CAPTIONS))],
        [str(7 * i) for i in range(n_img)],
        num_concepts=C,
    )
    write_concept_folder(out, stats, dataset="f30k", vocab_words=VOCAB.idx2word)
    return out


def _config(folder, **over):
    cfg = {
        "kind": "cvse",
        "embed_dim": D,
        "concepts": str(folder),
        "concept_dim": 7,
        "num_regions": R,
        "dropout": 0.0,
        "image": {"in_dim": F_IN},
        "text": {"word_dim": 9, "dropout": 0.0},
    }
    cfg.update(over)
    return cfg


def _model(folder, seed=0, **over) -> CVSE:
    torch.manual_seed(seed)
    model = build_model(_config(folder, **over), vocab_size=len(VOCAB))
    assert isinstance(model, CVSE)
    return model


def _captions(picks=(0, 1, 2, 3, 4)):
    ids = [VOCAB.encode(CAPTIONS[i]) for i in picks]
    ids[1] = ids[1][:4]  # a short caption among long ones: padding differs per caption
    width = max(map(len, ids))
    captions = torch.zeros(len(ids), width, dtype=torch.long)
    for i, x in enumerate(ids):
        captions[i, : len(x)] = torch.tensor(x)
    return captions, torch.tensor([len(x) for x in ids])


def _features(n=4, seed=1):
    return torch.randn(n, R, F_IN, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("max_elements", [None, 1, 5, 13])
def test_block_scores_and_gradients_match_the_reference_loop(folder, ref, max_elements):
    model = _model(folder).double()
    g = torch.Generator().manual_seed(3)
    regions = torch.randn(7, 3, D, dtype=torch.float64, generator=g).requires_grad_()
    words = torch.randn(11, 3, D, dtype=torch.float64, generator=g).requires_grad_()
    lengths = model.token_lengths(torch.arange(1, 12))
    got = model.score(regions, words, lengths, max_elements=max_elements)
    want = ref.reference_scores(model, regions, words, lengths)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-12)
    weights = torch.randn(got.shape, dtype=torch.float64, generator=g)
    g_got = torch.autograd.grad((got * weights).sum(), (regions, words))
    g_want = torch.autograd.grad((want * weights).sum(), (regions, words))
    for a, b in zip(g_got, g_want, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-12)
    assert float(g_got[0][:, 0].abs().max()) == 0.0  # the instance rows do not score


@pytest.mark.parametrize("mode", ["train", "eval"])
def test_encoders_and_gradients_match_the_release_forward(folder, ref, mode):
    model = _model(folder, fuse_eval=0.9).double()
    feats = _features().double()
    captions, lengths = _captions()
    model.train()
    model.encode_images(feats), model.encode_texts(captions, lengths)  # running statistics
    model.train(mode == "train")
    img = model.image_levels(feats)
    txt = model.text_levels(captions, lengths)
    img_want, wv_want = ref.reference_levels(model, "image", feats)
    txt_want, wt_want = ref.reference_levels(model, "text", captions, lengths)
    # the reference's unmasked text softmax and l2norm of the padded mean differ by eps only
    for got, want in (
        (img.rows(), img_want),
        (txt.rows(), txt_want),
        (img.weights, wv_want),
        (txt.weights, wt_want),
    ):
        torch.testing.assert_close(got, want, rtol=0, atol=1e-10)
    alpha = 0.85 if mode == "train" else 0.9
    expect = img.instance * alpha + img.consensus * (1 - alpha)
    torch.testing.assert_close(img.fused, expect / expect.norm(dim=1, keepdim=True))
    params = [p for p in model.parameters() if p.requires_grad]
    rows = model.token_lengths(lengths)
    got = model.score(img.rows(), txt.rows(), rows).sum() + concept_kl(img.weights, txt.weights[:4])
    want = ref.reference_scores(model, img_want, txt_want, rows).sum() + concept_kl(
        wv_want, wt_want[:4]
    )
    g_got = torch.autograd.grad(got, params, allow_unused=True)
    g_want = torch.autograd.grad(want, params, allow_unused=True)
    for p, a, b in zip(params, g_got, g_want, strict=True):
        if b is None:
            assert a is None or float(a.abs().max()) == 0.0
            continue
        torch.testing.assert_close(a, b, rtol=1e-7, atol=1e-9, msg=lambda m, p=p: f"{p.shape}: {m}")


def test_caption_labels_are_the_concepts_the_tokens_are(folder):
    model = _model(folder)
    captions, lengths = _captions()
    words = [
        w
        for w, _ in sorted(
            __import__("json").loads((folder / "category_concepts.json").read_text()).items(),
            key=lambda kv: kv[1],
        )
    ]
    want = torch.zeros(len(lengths), len(words))
    for b in range(len(lengths)):
        for t in range(int(lengths[b])):
            token = VOCAB.idx2word[int(captions[b, t])]
            if token in words:
                want[b, words.index(token)] = 1.0
    assert want.sum() > 0
    torch.testing.assert_close(model.caption_labels(captions, lengths), want)


def test_a_caption_alone_equals_it_in_a_padded_batch(folder):
    model = _model(folder).eval()
    captions, lengths = _captions()
    with torch.no_grad():
        batch = model.encode_texts(captions, lengths)
        alone = model.encode_texts(captions[1:2, : int(lengths[1])], lengths[1:2])
    torch.testing.assert_close(batch[1:2], alone, rtol=0, atol=1e-6)


def test_concept_gcn_matches_a_numpy_loop(folder):
    model = _model(folder)
    gcn = model.gcn
    a = gcn.adj_all.double().numpy()
    d = a.sum(axis=1) ** -0.5
    hat = np.array([[d[i] * a[j, i] * d[j] for j in range(C)] for i in range(C)])
    x = hat @ (gcn.vectors.double().numpy() @ gcn.gc1.detach().double().numpy())
    x = np.where(x > 0, x, 0.2 * x)
    x = hat @ (x @ gcn.gc2.detach().double().numpy())
    want = x / (np.sqrt((x**2).sum(axis=1, keepdims=True)) + 1e-12)
    np.testing.assert_allclose(gcn().detach().double().numpy(), want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
    ("over", "key"),
    [
        ({"text": {"bogus": 1}}, "text.bogus"),
        ({"image": {"in_dim": 0}}, "image.in_dim"),
        ({"fuse_train": 1.5}, "fuse_train"),
        ({"fuse_eval": "x"}, "fuse_eval"),
        ({"concept_label_ratio": -0.1}, "concept_label_ratio"),
        ({"weight_fused": 2}, "weight_fused"),
        ({"concept_temperature": 0}, "concept_temperature"),
        ({"dropout": 1.0}, "dropout"),
        ({"num_regions": 0}, "num_regions"),
        ({"gcn_hidden": 0}, "gcn_hidden"),
        ({"concept_vectors": "glove"}, "concept_vectors"),
        ({"concepts": None}, "concepts"),
        ({"bogus": 1}, "bogus"),
    ],
)
def test_config_errors_name_the_key(folder, over, key):
    with pytest.raises(ValueError, match=key):
        build_model(_config(folder, **over), vocab_size=len(VOCAB))


def test_a_vocabulary_that_differs_from_the_concept_folder_is_refused(folder):
    with pytest.raises(ValueError, match="concepts: .*vocabulary of"):
        build_model(_config(folder), vocab_size=len(VOCAB) + 1)
    with pytest.raises(FileNotFoundError, match="concepts"):
        build_model(_config(folder.parent / "absent"), vocab_size=len(VOCAB))


def test_build_model_of_its_config_rebuilds_it(folder, tmp_path):
    vectors = np.random.default_rng(0).normal(size=(C, 7)).astype(np.float32)
    np.save(tmp_path / "v.npy", vectors)
    model = _model(folder, concept_vectors=str(tmp_path / "v.npy")).eval()
    np.testing.assert_array_equal(model.gcn.vectors.numpy(), vectors)
    again = build_model(model.config)
    assert again.config == model.config
    again.load_state_dict(model.state_dict())
    again.eval()
    feats, (captions, lengths) = _features(), _captions()
    with torch.no_grad():
        torch.testing.assert_close(again.encode_images(feats), model.encode_images(feats))
        torch.testing.assert_close(
            again.encode_texts(captions, lengths), model.encode_texts(captions, lengths)
        )


def test_learned_concept_vectors_get_gradient(folder):
    model = _model(folder, concept_vectors="learned")
    assert isinstance(model.gcn.vectors, torch.nn.Parameter)
    model.train()
    levels = model.image_levels(_features())
    levels.consensus.sum().backward()
    assert model.gcn.vectors.grad is not None and float(model.gcn.vectors.grad.abs().sum()) > 0


def _release_parts(model: CVSE) -> list[dict[str, torch.Tensor]]:
    """A hand-built release checkpoint's ``model`` list: the release's names, the Linear
    layers' Sequential aliases and the unused modules included."""
    parts: list[dict[str, torch.Tensor]] = [{} for _ in range(8)]
    state = model.state_dict()
    for own, ref in model.reference_names().items():
        index, _, key = ref.partition(".")
        parts[int(index)][key] = state[own].clone()
    for k, first in ((2, "embedding_1.0"), (3, "embedding_1.0"), (4, "embedding_1.0")):
        parts[k][f"{first}.weight"] = parts[k]["fc1.weight"]
    parts[2]["fc4.weight"] = torch.zeros(D, D)
    parts[6]["adj_O_P"] = torch.zeros(C, C)
    parts[6]["joint_att_emb.weight"] = torch.zeros(D, D)
    return parts


def test_reference_names_read_a_hand_built_release_state(folder):
    source = _model(folder, seed=0).eval()
    target = _model(folder, seed=5).eval()
    parts = _release_parts(source)
    assert parts[6]["gc1.weight"].shape == (7, D // 2)
    assert "1.rnn.weight_hh_l0_reverse" in source.reference_names().values()
    target.load_state_dict(target.state_from_reference(parts))
    feats, (captions, lengths) = _features(), _captions()
    with torch.no_grad():
        torch.testing.assert_close(target.encode_images(feats), source.encode_images(feats))
        torch.testing.assert_close(
            target.encode_texts(captions, lengths), source.encode_texts(captions, lengths)
        )
    del parts[3]["fc2.bias"]
    with pytest.raises(ValueError, match=r"model\[3\] lacks 'fc2.bias'"):
        target.state_from_reference(parts)


def _batch(n=4):
    captions, lengths = _captions(tuple(range(n)))
    ids = torch.arange(n)
    return SimpleNamespace(
        features=_features(n),
        captions=captions,
        lengths=lengths,
        img_index=ids,
        identity=None,
        cap_index=ids,
    )


def test_a_training_step_lowers_the_loss_on_its_batch(folder):
    model = _model(folder).train()
    loss_fn = build_loss("triplet", margin=0.2)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    batch = _batch()
    losses = []
    for _ in range(5):
        sim = model(batch)
        assert sim.shape == (4, 4)
        loss = loss_fn.from_similarity(sim)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    assert losses[-1] < losses[0]


def test_the_cvse_procedure_weighs_the_levels_and_the_kl(folder):
    model = _model(folder).train()
    loss_fn = build_loss("triplet", margin=0.2)
    ctx = SimpleNamespace(
        model=model,
        loss_fn=loss_fn,
        epoch=0,
        step=0,
        gather=False,
        world_size=1,
        autocast=_null,
    )
    batch = _batch()
    state = {k: v.clone() for k, v in model.state_dict().items()}
    loss, logged, out = CVSEStep(levels=(3.0, 5.0, 1.0), kl_weight=2.0)(ctx, batch)
    model.load_state_dict(state)
    img, txt = model.image_levels(batch.features), model.text_levels(batch.captions, batch.lengths)
    want = 2 * concept_kl(img.weights, txt.weights)
    for w, level in ((3, "fused"), (5, "instance"), (1, "consensus")):
        a, b = getattr(img, level), getattr(txt, level)
        want = want + w * loss_fn.from_similarity(a @ b.t())
    torch.testing.assert_close(loss, want)
    assert out["sim"].shape == (4, 4)
    naive = sum(
        float((txt.weights[i, c] * (txt.weights[i, c].log() - img.weights[i, c].log())).detach())
        for i in range(4)
        for c in range(C)
    )
    assert float(concept_kl(img.weights, txt.weights).detach()) == pytest.approx(naive, rel=1e-5)


def _null():
    import contextlib

    return contextlib.nullcontext()


@pytest.mark.parametrize(
    ("options", "key"),
    [({"levels": [1, 2]}, "levels"), ({"kl_weight": -1}, "kl_weight"), ({"bogus": 1}, "bogus")],
)
def test_procedure_options_are_checked(options, key):
    config = SimpleNamespace(train=SimpleNamespace(procedure_options=options))
    with pytest.raises(ValueError, match=f"procedure_options.{key}"):
        build(config)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("name", "ratio", "fuse_eval", "batch", "dim"),
    [
        ("cvse_f30k_triplet", 0.35, 0.85, 128, 1024),
        ("cvse_coco_triplet", 0.4, 0.9, 128, 1024),
        ("adacl_cvse_f30k", 0.35, 0.85, 64, 256),
        ("adacl_cvse_coco", 0.4, 0.9, 64, 256),
    ],
)
def test_shipped_configs_build_with_a_concept_folder(folder, name, ratio, fuse_eval, batch, dim):
    from vlret.configs import shipped_configs
    from vlret.run.config import load_config
    from vlret.train.procedures.registry import build_procedure

    cfg = load_config(shipped_configs()[name])
    model_cfg = {**cfg.model, "concepts": str(folder), "concept_dim": 7, "embed_dim": 8}
    model = build_model(model_cfg, vocab_size=len(VOCAB))
    assert (model.config["concept_label_ratio"], model.config["fuse_eval"]) == (ratio, fuse_eval)
    assert (cfg.train.batch_size, cfg.model["embed_dim"]) == (batch, dim)
    step = build_procedure(cfg, scores_pairs=True)
    if name.startswith("adacl"):
        assert step.name == "pair_bank" and cfg.loss.params["queue_size"] == 4096
    else:
        assert isinstance(step, CVSEStep) and step.levels == (3.0, 5.0, 1.0)


def test_the_procedure_trains_with_the_images_labels_as_the_release(folder):
    import json

    model = _model(folder).train()
    loss_fn = build_loss("triplet", margin=0.2)
    ids = [str(7 * i) for i in range(9)]  # the fixture's image ids; one the file lacks
    train_set = SimpleNamespace(image_ids=[*ids[:4], "999"])
    printed: list[str] = []
    ctx = SimpleNamespace(
        model=model,
        loss_fn=loss_fn,
        epoch=0,
        step=0,
        gather=False,
        world_size=1,
        autocast=_null,
        train_set=train_set,
        device=torch.device("cpu"),
        grad_cache=None,
        exchange="gather",
        momentum_encoder=None,
        print=printed.append,
    )
    step = CVSEStep()
    assert step.hooks(ctx) == [] and step.table is not None
    entries = json.loads((folder / "all_f30k_concept_label.json").read_text())
    for k in range(4):
        want = torch.zeros(C)
        want[entries[k]["concept_labels"]] = 1.0
        torch.testing.assert_close(step.table[k], want)
    torch.testing.assert_close(step.table[4], torch.full((C,), 1.0 / C))
    assert "1 training images lack labels" in printed[0]
    batch = _batch(5)
    batch.img_index = torch.tensor([4, 3, 2, 1, 0])
    state = {k: v.clone() for k, v in model.state_dict().items()}
    loss, _, _ = step(ctx, batch)
    model.load_state_dict(state)
    img = model.image_levels(batch.features)
    txt = model.text_levels(batch.captions, batch.lengths, labels=step.table[batch.img_index])
    want = 2 * concept_kl(img.weights, txt.weights)
    for w, level in ((3, "fused"), (5, "instance"), (1, "consensus")):
        a, b = getattr(img, level), getattr(txt, level)
        want = want + w * loss_fn.from_similarity(a @ b.t())  # distinct images
    torch.testing.assert_close(loss, want)
    ctx.train_set = SimpleNamespace(image_ids=["x", "y"])
    with pytest.raises(ValueError, match="holds none of the training images"):
        CVSEStep().hooks(ctx)
    with pytest.raises(ValueError, match="labels"):
        CVSEStep(labels="lemma")


def test_the_gemm_bound_runs_the_products_the_scorer_runs(folder, ref):
    from collections import Counter

    from torch.utils._python_dispatch import TorchDispatchMode

    products = {torch.ops.aten.mm.default, torch.ops.aten.mm.out}

    class Products(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.seen: Counter = Counter()

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func in products:
                self.seen[(args[0].shape[0], args[0].shape[1], args[1].shape[1])] += 1
            return func(*args, **(kwargs or {}))

    model = _model(folder)
    regions, words = torch.randn(300, 3, D), torch.randn(70_000, 3, D)
    lengths = model.token_lengths(torch.ones(70_000, dtype=torch.long))
    bound = ref.gemm_bound(model, regions, words, lengths)
    with Products() as scorer:
        model.score(regions, words, lengths)
    with Products() as bare:
        bound()
    assert scorer.seen == bare.seen and sum(bare.seen.values()) == 2  # 2**24 // 300 per block
