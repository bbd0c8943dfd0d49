"""IRRA's implicit relation reasoning (vlret.models.irr) against naive implementations: the
masking rule against a per-token loop written after IRRA's dataset (statistics of seeded
draws, and the rule's exact properties), the cross-modal encoder against a float64 forward
written by hand from its weights, and the token features against the model's own forward."""

from __future__ import annotations

import math
import random
import sys
from pathlib import Path

import pytest
import torch

from vlret.models import build_model
from vlret.models.irr import (
    IGNORE_INDEX,
    ImplicitRelationReasoning,
    IRROptions,
    clip_text_token_features,
    clip_token_features,
    mask_caption_tokens,
)

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from pedes_helpers import TINY_CLIP  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")

MASK, BOS, EOS = 49405, 49406, 49407  # IRRA's <|mask|>, CLIP's start and end ids


def caption_batch(
    n: int, length: int, seed: int, shortest: int = 3
) -> tuple[torch.Tensor, torch.Tensor]:
    """``n`` captions ``[BOS, words..., EOS, padding]`` of random lengths, word ids in
    ``[0, 49405)`` (id 0 included: IRRA never masks it), padded with ``EOS`` (as Hugging
    Face's CLIP tokenizer pads) beyond each length."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(shortest, length + 1, (n,), generator=g)
    ids = torch.full((n, length), EOS, dtype=torch.long)
    for i, ln in enumerate(lengths.tolist()):
        ids[i, 0] = BOS
        ids[i, 1 : ln - 1] = torch.randint(0, MASK, (ln - 2,), generator=g)
        ids[i, ln - 1] = EOS
    ids[0, 1] = 0  # at least one id 0 inside a caption
    return ids, lengths


def naive_mask(ids: list[int], length: int, rng: random.Random) -> tuple[list[int], list[int]]:
    """IRRA's ``_build_random_masked_tokens_and_labels``, one token at a time (labels: the
    original id or IGNORE_INDEX; padding beyond ``length`` never chosen)."""
    tokens, labels = list(ids), []
    for i, token in enumerate(tokens):
        if i < length and 0 < token < MASK:
            p = rng.random()
            if p < 0.15:
                p /= 0.15
                if p < 0.8:
                    tokens[i] = MASK
                elif p < 0.9:
                    tokens[i] = rng.randrange(1, MASK)
                labels.append(token)
                continue
        labels.append(IGNORE_INDEX)
    if all(lab == IGNORE_INDEX for lab in labels) and length > 2:
        labels[1], tokens[1] = tokens[1], MASK
    return tokens, labels


def shares(ids: torch.Tensor, masked: torch.Tensor, labels: torch.Tensor, eligible: torch.Tensor):
    chosen = labels != IGNORE_INDEX
    n = int(chosen.sum())
    return {
        "chosen": n / int(eligible.sum()),
        "mask": int((chosen & (masked == MASK)).sum()) / n,
        "random": int((chosen & (masked != MASK) & (masked != ids)).sum()) / n,
        "kept": int((chosen & (masked == ids)).sum()) / n,
    }


def test_masking_statistics_match_a_per_token_loop_and_irras_rates():
    """Seeded draws of both implementations over ~15000 eligible tokens: the share of chosen
    tokens and, of those, masked / replaced / kept agree with each other and with IRRA's
    15% / 80% / 10% / 10% within five binomial standard deviations (captions of 20 tokens or
    more: the "at least one" rule, at most 0.85^18 of them, barely moves the rates)."""
    ids, lengths = caption_batch(600, 40, seed=0, shortest=20)
    g = torch.Generator().manual_seed(1)
    masked, labels = mask_caption_tokens(
        ids, lengths, mask_token_id=MASK, special_ids=(BOS, EOS), generator=g
    )
    rng = random.Random(2)
    rows = [naive_mask(r, int(n), rng) for r, n in zip(ids.tolist(), lengths, strict=True)]
    naive_masked = torch.tensor([r[0] for r in rows])
    naive_labels = torch.tensor([r[1] for r in rows])
    positions = torch.arange(ids.shape[1])
    eligible = (positions < lengths[:, None]) & (ids > 0) & (ids < MASK)
    got = shares(ids, masked, labels, eligible)
    naive = shares(ids, naive_masked, naive_labels, eligible)
    expected = {"chosen": 0.15, "mask": 0.8, "random": 0.1, "kept": 0.1}
    n_eligible = int(eligible.sum())
    n_chosen = 0.15 * n_eligible
    for key, p in expected.items():
        n = n_eligible if key == "chosen" else n_chosen
        sd = math.sqrt(p * (1 - p) / n)
        assert abs(got[key] - p) < 5 * sd, (key, got[key])
        assert abs(naive[key] - p) < 5 * sd, (key, naive[key])
        assert abs(got[key] - naive[key]) < 5 * math.sqrt(2) * sd, (key, got, naive)


def test_masking_rule_exactly():
    """Labels are the original ids at the chosen positions and nothing else; padding, the
    start and end ids and id 0 are never chosen; unchosen positions keep their id; random
    replacements lie in [1, MASK); the same generator state gives the same masking."""
    ids, lengths = caption_batch(300, 30, seed=3)
    masked, labels = mask_caption_tokens(
        ids,
        lengths,
        mask_token_id=MASK,
        special_ids=(BOS, EOS),
        generator=torch.Generator().manual_seed(4),
    )
    chosen = labels != IGNORE_INDEX
    assert torch.equal(labels[chosen], ids[chosen])
    positions = torch.arange(ids.shape[1])
    assert not (chosen & (positions >= lengths[:, None])).any()
    assert not (chosen & ((ids == BOS) | (ids == EOS) | (ids == 0))).any()
    assert torch.equal(masked[~chosen], ids[~chosen])
    replaced = chosen & (masked != MASK) & (masked != ids)
    assert replaced.any() and (masked[replaced] >= 1).all() and (masked[replaced] < MASK).all()
    again = mask_caption_tokens(
        ids,
        lengths,
        mask_token_id=MASK,
        special_ids=(BOS, EOS),
        generator=torch.Generator().manual_seed(4),
    )
    assert torch.equal(again[0], masked) and torch.equal(again[1], labels)


def test_a_caption_with_nothing_chosen_gets_its_first_word_masked():
    """IRRA's "at least mask 1": with a tiny probability nothing is drawn, and the token after
    the start id becomes [MASK] with its label; a caption of only start and end ids, or a
    first word of id 0, moves to the first eligible token or to none."""
    ids = torch.tensor([[BOS, 11, 12, EOS], [BOS, EOS, EOS, EOS], [BOS, 0, 13, EOS]])
    lengths = torch.tensor([4, 2, 4])
    masked, labels = mask_caption_tokens(
        ids,
        lengths,
        mask_token_id=MASK,
        special_ids=(BOS, EOS),
        prob=1e-12,
        generator=torch.Generator().manual_seed(0),
    )
    assert masked.tolist() == [[BOS, MASK, 12, EOS], [BOS, EOS, EOS, EOS], [BOS, 0, MASK, EOS]]
    ig = IGNORE_INDEX
    assert labels.tolist() == [[ig, 11, ig, ig], [ig, ig, ig, ig], [ig, ig, 13, ig]]


def naive_layer_norm(x: torch.Tensor, ln: torch.nn.LayerNorm) -> torch.Tensor:
    mean = x.mean(-1, keepdim=True)
    var = ((x - mean) ** 2).mean(-1, keepdim=True)
    return (x - mean) / torch.sqrt(var + ln.eps) * ln.weight + ln.bias


def naive_attention(q, k, v, attn: torch.nn.MultiheadAttention, heads: int) -> torch.Tensor:
    """Multi-head attention from ``in_proj_weight`` / ``out_proj``, one head at a time."""
    w, b = attn.in_proj_weight, attn.in_proj_bias
    width = q.shape[-1]
    qp, kp, vp = (
        x @ w[i * width : (i + 1) * width].T + b[i * width : (i + 1) * width]
        for i, x in enumerate((q, k, v))
    )
    d = width // heads
    outs = []
    for h in range(heads):
        sl = slice(h * d, (h + 1) * d)
        scores = qp[..., sl] @ kp[..., sl].transpose(-1, -2) / math.sqrt(d)
        outs.append(torch.softmax(scores, dim=-1) @ vp[..., sl])
    return torch.cat(outs, dim=-1) @ attn.out_proj.weight.T + attn.out_proj.bias


def quick_gelu(x: torch.Tensor) -> torch.Tensor:
    return x / (1 + torch.exp(-1.702 * x))


def test_the_encoder_matches_a_float64_forward_written_from_its_weights():
    """Cross-attention without residual, pre-norm blocks with residuals, final norm, head:
    written out by hand in float64 from the module's own weights."""
    torch.manual_seed(0)
    irr = ImplicitRelationReasoning(width=32, vocab_size=50, depth=2, heads=4, mask_token_id=47)
    irr = irr.double()
    with torch.no_grad():  # non-trivial norms and biases
        for p in irr.parameters():
            if p.dim() == 1:
                p.add_(0.1 * torch.randn_like(p))
    text, image = (
        torch.randn(3, 7, 32, dtype=torch.float64),
        torch.randn(3, 5, 32, dtype=torch.float64),
    )
    got = irr(text, image)
    img = naive_layer_norm(image, irr.ln_pre_i)
    x = naive_attention(naive_layer_norm(text, irr.ln_pre_t), img, img, irr.cross_attn, 4)
    for blk in irr.blocks:
        h = naive_layer_norm(x, blk.ln_1)
        x = x + naive_attention(h, h, h, blk.attn, 4)
        h = naive_layer_norm(x, blk.ln_2)
        x = (
            x
            + quick_gelu(h @ blk.c_fc.weight.T + blk.c_fc.bias) @ blk.c_proj.weight.T
            + blk.c_proj.bias
        )
    x = naive_layer_norm(x, irr.ln_post)
    dense, _, ln, fc = irr.mlm_head
    x = naive_layer_norm(quick_gelu(x @ dense.weight.T + dense.bias), ln)
    expected = x @ fc.weight.T + fc.bias
    assert got.shape == (3, 7, 50)
    torch.testing.assert_close(got, expected, rtol=1e-10, atol=1e-10)


def test_irras_initialisation_and_defaults():
    """IRRA's defaults (4 blocks, width // 64 heads, [MASK] = vocab - 3) and its weight stds:
    attention inputs width^-1/2, outputs width^-1/2 (2 depth)^-1/2, MLP inputs (2 width)^-1/2."""
    torch.manual_seed(0)
    irr = ImplicitRelationReasoning(width=512, vocab_size=49408, special_ids=(BOS, EOS))
    assert (irr.depth, irr.heads, irr.mask_token_id) == (4, 8, MASK)
    std = lambda t: float(t.detach().std())  # noqa: E731
    assert std(irr.cross_attn.in_proj_weight) == pytest.approx(512**-0.5, rel=0.01)
    assert std(irr.blocks[0].attn.out_proj.weight) == pytest.approx(512**-0.5 / 8**0.5, rel=0.01)
    assert std(irr.blocks[0].c_fc.weight) == pytest.approx(1024**-0.5, rel=0.01)
    assert std(irr.mlm_head[3].weight) == pytest.approx(512**-0.5 / 8**0.5, rel=0.01)


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("yes", "model.irr: expected true, false or a table"),
        ({"layers": 4}, "model.irr: unknown key 'layers'"),
        ({"depth": 0}, r"model.irr.depth: expected an int >= 1"),
        ({"heads": 1.5}, r"model.irr.heads: expected an int >= 0"),
    ],
)
def test_bad_irr_options_are_named(value, message):
    with pytest.raises(ValueError, match=message):
        IRROptions.parse(value)


def test_a_mask_id_among_the_special_ids_is_refused():
    with pytest.raises(ValueError, match="model.irr.mask_token_id: 49406 must lie below"):
        ImplicitRelationReasoning(
            width=16, vocab_size=49408, mask_token_id=49406, special_ids=(BOS, EOS)
        )


def tiny_clip(**keys):
    torch.manual_seed(0)
    spec = {
        "kind": "clip",
        "preset": "ViT-B-32",
        "tokenizer": "bytes",
        "config": TINY_CLIP,
        "proj_dim": 0,
        **keys,
    }
    return build_model(spec)


def test_the_model_config_switches_irr_on_and_rebuilds_it():
    """``irr = true`` adds the encoder on CLIP's projection width and vocabulary (the start and
    end ids of the text config as special ids); model.config keeps the options, which
    rebuild the same parameter names; ``false`` adds none."""
    model = tiny_clip(irr=True)
    assert model.irr.width == TINY_CLIP["projection_dim"] and model.irr.vocab_size == 49408
    assert model.irr.special_ids == (BOS, EOS) and model.irr.mask_token_id == MASK
    assert model.config["irr"] == {"depth": 4, "heads": 0, "mask_token_id": 0}
    again = build_model(model.config)
    assert again.state_dict().keys() == model.state_dict().keys()
    assert getattr(tiny_clip(), "irr", None) is None
    assert not any(k.startswith("irr.") for k in tiny_clip().state_dict())


def test_token_features_are_those_of_the_models_forward():
    """One vision pass gives the image embedding the model's forward gives, and its token 0
    projected; the text tokens at the end-of-text position are the caption embedding."""
    model = tiny_clip(irr=True).eval()
    pixels = torch.randn(2, 3, 16, 16)
    emb, tokens = clip_token_features(model.image_encoder, pixels)
    torch.testing.assert_close(emb, model.encode_images(pixels))
    assert tokens.shape == (2, 5, TINY_CLIP["projection_dim"])  # CLS + 2 x 2 patches
    captions = torch.tensor([[BOS, 97, 98, EOS, 0], [BOS, 99, EOS, 0, 0]])
    lengths = torch.tensor([4, 3])
    text_tokens = clip_text_token_features(model.text_encoder, captions, lengths)
    at_eos = text_tokens[torch.arange(2), lengths - 1]
    torch.testing.assert_close(at_eos, model.encode_texts(captions, lengths))
