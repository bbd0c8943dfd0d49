"""Word attention over an image's regions for the pair-scoring models (SCAN, BFAN, SGRAF), as
in the qualitative figures of SCAN, VSL (Fig. 3) and AdaCL (Figs. 4, 5 and 8).

For a pair (image, caption) the model's own encoders give the regions ``v_1..v_R`` and the
caption's word features ``e_1..e_L`` (one per token, ``<start>`` and ``<end>`` included); the
word ``k`` attends over the regions with the models' shared step
(:func:`vlret.models.attention.attention_weights`, SCAN Eq. 1-2): raw scores ``<e_k, v_j>``,
LeakyReLU(0.1), each region's scores L2-normalised over the caption's words, a softmax over
the regions with the model's ``lambda_softmax``. The weights of a word sum to 1 over the
regions. BFAN then re-assigns them with its focal rule (``focal``: kept weights divided by
their sum); ``focal=False`` shows the softmax before it.

Choices: SCAN ``direction="i2t"`` scores regions attending over words; the report still shows
the word-to-region step (the one the papers draw) with that model's ``lambda_softmax``. An
ensemble shows its first pair-scoring member's attention.

The word shown (:func:`pick_word`): ``word`` (case-insensitive, its first occurrence) when the
caption has it; otherwise the content word (not a special token, a stopword nor punctuation)
whose attention is most peaked (largest weight on one region), the first such word on ties.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from ...models import PairScorer
from ...models.attention import attention_weights

#: words never picked by default: function words of English captions
STOPWORDS = frozenset(
    "a an the of on in at to with and or is are was were be been being by for from as its it "
    "this that these those there their his her he she they them some two three one while near "
    "into onto over under up down out off next has have"
    "".split()
)


@dataclass
class WordAttention:
    """One word's attention over the regions of one image, for one (image, caption) pair."""

    image: int
    caption: int
    #: the caption's tokens as the model reads them, and the index of the word shown
    tokens: list[str]
    word: int
    #: ``(R,)`` weights over the regions (sum 1)
    weights: list[float]
    #: ``"top-1"`` (the query's first retrieved pair) or ``"ground truth"``
    role: str
    #: the word asked for (``--word``) was not in the caption, the default one is shown
    fallback: bool = False


def pair_model(scorer: Any) -> torch.nn.Module | None:
    """The pair-scoring model behind a scorer (an ensemble: its first pair-scoring member),
    or ``None`` for two-tower models."""
    from ...eval import EnsembleScorer, PairModelScorer

    if isinstance(scorer, PairModelScorer):
        return scorer.model
    if isinstance(scorer, EnsembleScorer):
        for member in scorer.scorers:
            if isinstance(member, PairModelScorer):
                return member.model
    return None


def _lambda(model: Any) -> float:
    inner = getattr(model, "scorer", None)  # SGRAF's similarity encoder holds it
    value = getattr(model, "lambda_softmax", getattr(inner, "lambda_softmax", None))
    if value is None:
        raise ValueError(f"{type(model).__name__} has no lambda_softmax: no word attention")
    return float(value)


def focal_reassign(weights: torch.Tensor, focal: str) -> torch.Tensor:
    """BFAN's focal step on ``(..., R)`` weights: keep region ``i`` when ``sum_j (x_i - x_j)
    > 0`` (``equal``) or ``sum_j (x_i - x_j) sqrt(x_j) > 0`` (``prob``), divide the kept by
    their sum; a row where none passes keeps its largest weights (as
    :func:`~vlret.models.cross_attention.bfan_scores`)."""
    diff = weights.unsqueeze(-1) - weights.unsqueeze(-2)  # (..., i, j) = x_i - x_j
    if focal == "prob":
        diff = diff * weights.sqrt().unsqueeze(-2)
    keep = diff.sum(dim=-1) > 0
    none = ~keep.any(dim=-1, keepdim=True)
    keep = keep | (none & (weights == weights.amax(dim=-1, keepdim=True)))
    kept = weights * keep
    return kept / kept.sum(dim=-1, keepdim=True)


def word_weights(
    model: Any, regions: torch.Tensor, words: torch.Tensor, *, focal: bool = True
) -> torch.Tensor:
    """``(L, R)`` attention of each of one caption's ``words (L, D)`` over one image's
    ``regions (R, D)`` (module docstring), in float64."""
    raw = words.double() @ regions.double().t()
    weights = attention_weights(
        raw, query_mask=None, context_mask=None, lambda_softmax=_lambda(model)
    )
    rule = getattr(model, "focal", None)
    if focal and isinstance(rule, str):
        weights = focal_reassign(weights, rule)
    return weights


def token_labels(encoder: Any, ids: torch.Tensor) -> list[str]:
    """The text of each token id: a vocabulary's words, a Hugging Face tokenizer's tokens, or
    the id itself."""
    values = [int(i) for i in ids]
    idx2word = getattr(encoder, "idx2word", None)
    if idx2word is not None:
        return [str(idx2word[i]) if 0 <= i < len(idx2word) else str(i) for i in values]
    tokenizer = getattr(encoder, "tokenizer", None)
    convert = getattr(tokenizer, "convert_ids_to_tokens", None)
    if convert is not None:
        return [str(t) for t in convert(values)]
    return [str(i) for i in values]


def _special(token: str) -> bool:
    return (token.startswith("<") and token.endswith(">")) or (
        token.startswith("[") and token.endswith("]")
    )


def pick_word(tokens: list[str], weights: torch.Tensor, word: str | None) -> tuple[int, bool]:
    """``(index of the word shown, fallback)``: ``word``'s first occurrence, else the most
    peaked content word (module docstring); ``fallback`` when ``word`` was asked and absent."""
    if word is not None:
        wanted = word.lower()
        for k, token in enumerate(tokens):
            if token.lower().lstrip("Ġ▁#") == wanted:
                return k, False
    content = [
        k
        for k, t in enumerate(tokens)
        if not _special(t) and t.lower() not in STOPWORDS and any(c.isalnum() for c in t)
    ]
    if not content:
        content = [k for k, t in enumerate(tokens) if not _special(t)] or list(range(len(tokens)))
    peaks = weights.amax(dim=1)
    best = max(content, key=lambda k: (float(peaks[k]), -k))
    return best, word is not None


@torch.no_grad()
def pair_attention(
    model: Any,
    dataset: Any,
    image: int,
    caption: int,
    *,
    word: str | None = None,
    role: str = "top-1",
) -> WordAttention:
    """The attention of one word of ``caption`` over the regions of ``image`` (both indices
    of ``dataset``), encoded by ``model``'s own encoders in eval mode on its device."""
    if not isinstance(model, PairScorer) or not isinstance(model, torch.nn.Module):
        raise ValueError(f"{type(model).__name__} does not score pairs: no word attention")
    device = next(iter(model.parameters())).device
    was_training = model.training
    model.eval()
    try:
        feats = dataset.image(image)
        feats = feats[None].to(device) if isinstance(feats, torch.Tensor) else [feats]
        regions = model.encode_images(feats)[0].float().cpu()
        ids = dataset.caption(caption)
        if not isinstance(ids, torch.Tensor):
            raise ValueError("word attention needs token ids (a dataset with a caption encoder)")
        length = torch.tensor([len(ids)], device=device)
        words = model.encode_texts(ids[None].to(device), length)
        n_rows = int(model.token_lengths(length.cpu())[0])
        words = words[0, :n_rows].float().cpu()
    finally:
        model.train(was_training)
    weights = word_weights(model, regions, words)
    tokens = token_labels(dataset.encoder, ids)[:n_rows]
    k, fallback = pick_word(tokens, weights, word)
    return WordAttention(
        image, caption, tokens, k, [float(w) for w in weights[k]], role, fallback=fallback
    )


def query_attention(
    model: Any, dataset: Any, facts: Any, *, word: str | None = None
) -> list[WordAttention]:
    """A query's attention maps: its top-1 pair and, when that is not a ground truth, the pair
    with its best ground truth (text->image: the caption's words over each image; image->text:
    each retrieved caption's words over the query image)."""
    pairs: list[tuple[int, str]] = []
    if facts.top:
        pairs.append((facts.top[0].index, "top-1"))
    if facts.ground_truth and (not facts.top or not facts.top[0].relevant):
        pairs.append((facts.ground_truth[0].index, "ground truth"))
    out = []
    for item, role in pairs:
        image, caption = (item, facts.index) if facts.direction == "t2i" else (facts.index, item)
        out.append(pair_attention(model, dataset, image, caption, word=word, role=role))
    return out


__all__ = [
    "STOPWORDS",
    "WordAttention",
    "focal_reassign",
    "pair_attention",
    "pair_model",
    "pick_word",
    "query_attention",
    "token_labels",
    "word_weights",
]
