"""USER's image encoder (SGE + fc + MLP + pooling) against a naive float64 loop written from
the release's ``EncoderImageAggr`` / ``SGE`` steps: values and gradients (features and every
parameter), in training mode (batch statistics) and evaluation mode (running statistics)."""

from __future__ import annotations

import pytest
import torch

from vlret.models.user_image import (
    USER_IMAGE_DEFAULTS,
    UserImageEncoder,
    build_user_image_encoder,
)

pytestmark = pytest.mark.usefixtures("one_thread")

N, R, IN, EMBED = 3, 4, 6, 8
EPS = 1e-8


def _l2(v: torch.Tensor) -> torch.Tensor:
    return v / (torch.sqrt((v * v).sum()) + EPS)


def _bn_channel(values: list[torch.Tensor], bn, channel: int, training: bool) -> list[torch.Tensor]:
    """BatchNorm of one channel's values (each a scalar tensor), as ``torch.nn.BatchNorm1d``."""
    if training:
        stacked = torch.stack(values)
        mean = stacked.sum() / len(values)
        var = ((stacked - mean) ** 2).sum() / len(values)
    else:
        mean, var = bn.running_mean[channel], bn.running_var[channel]
    scale = bn.weight[channel] / torch.sqrt(var + bn.eps)
    return [(v - mean) * scale + bn.bias[channel] for v in values]


def naive_user_image(enc: UserImageEncoder, x: torch.Tensor, pooling: str) -> torch.Tensor:
    """The release's steps image by image, region by region (float64, loops)."""
    training = enc.training
    sge, mlp = enc.sge, enc.mlp
    n, r, d = x.shape
    # SGE local branch: Linear, BatchNorm1d(R) over (images, features) of each position, tanh
    pre = [[sge.local_fc.weight @ x[a, i] + sge.local_fc.bias for i in range(r)] for a in range(n)]
    local = [[None] * r for _ in range(n)]
    for i in range(r):
        flat = [pre[a][i][k] for a in range(n) for k in range(d)]
        normed = _bn_channel(flat, sge.local_bn, i, training)
        for a in range(n):
            local[a][i] = torch.tanh(torch.stack(normed[a * d : (a + 1) * d]))
    # global branch on the mean region: Linear, BatchNorm1d(D) over the images, tanh
    gpre = [sge.global_fc.weight @ (x[a].sum(0) / r) + sge.global_fc.bias for a in range(n)]
    glob = [[None] * d for _ in range(n)]
    for k in range(d):
        normed = _bn_channel([gpre[a][k] for a in range(n)], sge.global_bn, k, training)
        for a in range(n):
            glob[a][k] = torch.tanh(normed[a])
    out = []
    hidden_rows = []
    enhanced_all = []
    for a in range(n):
        g_vec = torch.stack(glob[a])
        logits = torch.stack(
            [sge.common.weight[0] @ (local[a][i] * g_vec) + sge.common.bias[0] for i in range(r)]
        )
        w = torch.exp(logits - logits.max())
        w = w / w.sum()
        g = _l2(sum(w[i] * x[a, i] for i in range(r)))
        scores = torch.stack([enc.attention_lambda * (g @ x[a, i]) for i in range(r)])
        att = torch.exp(scores - scores.max())
        att = _l2(att / att.sum())
        enhanced = [x[a, i] + att[i] * g for i in range(r)]
        enhanced_all.append(enhanced)
        hidden_rows += [mlp.fc1.weight @ e + mlp.fc1.bias for e in enhanced]
    # the MLP's BatchNorm over every region of the batch
    hidden_t = torch.stack(hidden_rows)
    cols = []
    for k in range(hidden_t.shape[1]):
        cols.append(torch.stack(_bn_channel(list(hidden_t[:, k]), mlp.bn, k, training)))
    hidden_n = torch.relu(torch.stack(cols, dim=1))
    for a in range(n):
        feats = []
        for i in range(r):
            e = enhanced_all[a][i]
            h = hidden_n[a * r + i]
            feats.append(enc.fc.weight @ e + enc.fc.bias + mlp.fc2.weight @ h + mlp.fc2.bias)
        f = torch.stack(feats)
        if pooling == "max":
            out.append(f.max(dim=0).values)
        elif pooling == "mean":
            out.append(f.sum(0) / r)
        else:  # GPO: each dimension's sorted values weighted by theta (tested in test_image)
            theta = enc.pool.gpo.weights(torch.tensor([r]), r)[0].to(f.dtype)
            ranked = f.sort(dim=0, descending=True).values
            out.append((theta[:, None] * ranked).sum(0))
    return torch.stack(out)


def _encoder(pooling: str, dropout: float = 0.0) -> UserImageEncoder:
    torch.manual_seed(0)
    enc = UserImageEncoder(
        in_dim=IN,
        embed_dim=EMBED,
        num_regions=R,
        dropout=dropout,
        attention_lambda=3.0,
        pooling=pooling,
        gpo_pe_dim=4,
        gpo_hidden=4,
    ).double()
    enc.pool.float()  # GPO's weights are computed in float32 (vlret.models.image.GPO)
    for bn in (enc.sge.local_bn, enc.sge.global_bn, enc.mlp.bn):  # not the identity
        with torch.no_grad():
            bn.weight.uniform_(0.5, 1.5)
            bn.bias.uniform_(-0.3, 0.3)
    return enc


def _features(seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(N, R, IN, generator=g, dtype=torch.float64).requires_grad_()


@pytest.mark.parametrize("pooling", ["gpo", "max", "mean"])
@pytest.mark.parametrize("training", [True, False], ids=["train", "eval"])
def test_values_and_gradients_equal_the_naive_loop(pooling, training):
    enc = _encoder(pooling)
    for seed in (5, 6):  # running statistics away from their initial values
        enc.train()(_features(seed))
    enc.train(training)
    x = _features(1)
    got = enc(x)  # training mode: batch statistics; evaluation mode: the running ones
    expected = naive_user_image(enc, x, pooling)
    torch.testing.assert_close(got, expected, rtol=1e-10, atol=1e-12)
    weights = torch.randn(N, EMBED, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    params = [p for p in enc.parameters() if p.requires_grad]
    g_got = torch.autograd.grad((got * weights).sum(), [x, *params], allow_unused=True)
    g_naive = torch.autograd.grad((expected * weights).sum(), [x, *params], allow_unused=True)
    names = ["features"] + [n for n, p in enc.named_parameters() if p.requires_grad]
    for name, a, b in zip(names, g_got, g_naive, strict=True):
        assert a is not None and b is not None, name
        # GPO's own weights are float32 (its theta, from the module in both)
        tol = (1e-4, 1e-5) if name.startswith("pool.") else (1e-9, 1e-11)
        torch.testing.assert_close(
            a, b, rtol=tol[0], atol=tol[1], msg=lambda m, n=name: f"{n}: {m}"
        )


def test_training_updates_the_running_statistics_as_batchnorm_does():
    """The SGE's BatchNorm1d(num_regions): each position's statistics over the images and the
    features; the running mean moves by momentum 0.1 toward them."""
    enc = _encoder("gpo").train()
    x = _features(2).detach()
    enc(x)
    pre = enc.sge.local_fc(x)  # (N, R, IN)
    expected = 0.1 * pre.mean(dim=(0, 2))
    torch.testing.assert_close(enc.sge.local_bn.running_mean, expected.detach())


def test_dropout_acts_in_training_only():
    enc = _encoder("mean", dropout=0.4)
    x = _features(3).detach()
    enc.eval()
    assert torch.equal(enc(x), enc(x))
    enc.train()
    torch.manual_seed(1)
    first = enc(x)
    torch.manual_seed(2)
    assert not torch.allclose(first, enc(x))


def test_bad_inputs_and_settings_are_named():
    enc = _encoder("gpo")
    with pytest.raises(ValueError, match="num_regions=4"):
        enc(torch.zeros(2, R + 1, IN, dtype=torch.float64))
    with pytest.raises(ValueError, match="lengths"):
        enc(torch.zeros(2, R, IN, dtype=torch.float64), torch.tensor([R, R - 1]))
    assert enc.eval()(torch.randn(2, R, IN, dtype=torch.float64), torch.tensor([R, R])).shape == (
        2,
        EMBED,
    )
    cfg = {**USER_IMAGE_DEFAULTS, "in_dim": IN, "num_regions": R}
    with pytest.raises(ValueError, match=r"^image\.dropout"):
        build_user_image_encoder({**cfg, "dropout": 1.0}, embed_dim=EMBED)
    with pytest.raises(ValueError, match=r"^image\.pooling"):
        build_user_image_encoder({**cfg, "pooling": "last"}, embed_dim=EMBED)
    with pytest.raises(ValueError, match=r"^image\.num_regions"):
        build_user_image_encoder({**cfg, "num_regions": 0}, embed_dim=EMBED)
    built = build_user_image_encoder(cfg, embed_dim=EMBED)
    assert built.mlp.fc1.out_features == EMBED // 2 and built.embed_dim == EMBED


def test_user_model_trains_with_uto_momentum_queues(tmp_path):
    """The whole two-tower model on a random local BERT (GPO text side): three steps of UTO
    with its queues filled by a momentum copy; the loss is finite, every part of both towers
    gets a gradient, and the queues hold the momentum keys."""
    pytest.importorskip("transformers")
    from vlret.losses import build_loss
    from vlret.memory import MomentumEncoder
    from vlret.models import RetrievalModel
    from vlret.models.text import BertTextEncoder
    from vlret.worlds.bert import write_random_bert

    words = ["a red car", "two dogs run in the park", "a man on a blue boat"]
    path = write_random_bert(tmp_path / "bert", words, hidden=16, layers=1, intermediate=32)
    torch.manual_seed(0)
    image = UserImageEncoder(in_dim=IN, embed_dim=EMBED, num_regions=R, gpo_pe_dim=4)
    text = BertTextEncoder(path, embed_dim=EMBED, pooling="gpo", gpo_pe_dim=4)
    model = RetrievalModel(image, text).train()
    keys = MomentumEncoder(model, momentum=0.999)
    loss_fn = build_loss("uto", batch_weight=20.0, queue_size=8, embed_dim=EMBED)
    optim = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=1e-4)
    vocab = text.bert.config.vocab_size
    g = torch.Generator().manual_seed(1)
    for step in range(3):
        regions = torch.randn(4, R, IN, generator=g)
        lengths = torch.tensor([5, 3, 4, 2])
        captions = torch.randint(1, vocab, (4, 5), generator=g)
        img, txt = model.encode_images(regions), model.encode_texts(captions, lengths)
        with torch.no_grad():
            k_img = keys.module.encode_images(regions)
            k_txt = keys.module.encode_texts(captions, lengths)
        ids = torch.arange(4) + 4 * step
        loss = loss_fn(img, txt, ids, img_keys=k_img, txt_keys=k_txt)
        optim.zero_grad()
        loss.backward()
        assert torch.isfinite(loss)
        for name, p in model.named_parameters():
            if name.startswith(("image_encoder.sge", "image_encoder.mlp", "text_encoder.bert.enc")):
                assert p.grad is not None and bool(p.grad.abs().sum() > 0), name
        optim.step()
        keys.update(model)
    assert loss_fn.txt_queue is not None and int(loss_fn.txt_queue.valid.sum()) == 8
    queued = loss_fn.txt_queue.keys[loss_fn.txt_queue.ids == 8]
    torch.testing.assert_close(queued[0], torch.nn.functional.normalize(k_txt, dim=1)[0])


def test_build_model_builds_the_user_image_kind_and_round_trips():
    """``[model.image] kind = "user"`` through ``build_model`` (retrieval.py's wiring): the
    release's defaults filled in, ``model.config`` rebuilds it, unknown keys are named."""
    from vlret.models import build_model

    spec = {"image": {"kind": "user", "in_dim": IN, "num_regions": R}, "embed_dim": EMBED}
    model = build_model({**spec, "text": {"vocab_size": 11, "word_dim": 4}})
    assert isinstance(model.image_encoder, UserImageEncoder)
    assert model.config["image"] == {**USER_IMAGE_DEFAULTS, "in_dim": IN, "num_regions": R}
    rebuilt = build_model(model.config)
    assert rebuilt.image_encoder.mlp.fc1.out_features == EMBED // 2
    with pytest.raises(ValueError, match="region_dropout"):
        build_model({**spec, "image": {**spec["image"], "region_dropout": 0.2}}, vocab_size=11)
