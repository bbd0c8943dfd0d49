"""PairScoringModel: the one batch forward of every pair-scoring model (SCAN, BFAN, SGRAF, CE,
MMT), checked on a toy scorer against a naive loop."""

from types import SimpleNamespace

import pytest
import torch
from torch import nn

from vlret.models import (
    CollaborativeExperts,
    CrossAttentionModel,
    MultiExpertModel,
    PairScorer,
    PairScoringModel,
)


class MeanDot(PairScoringModel):
    """Images are ``(N, R, D)`` rows as given; a caption's rows are its token embeddings, two
    rows per token (so ``token_lengths`` is not ``lengths``); the score is the mean over the
    caption's real rows of the best image row's dot product."""

    def __init__(self, *, config=None):
        super().__init__(nn.Identity(), nn.Embedding(10, 3), config=config)

    def encode_images(self, features, lengths=None):
        return self.image_encoder(features)

    def encode_texts(self, captions, lengths):
        return self.text_encoder(captions).repeat_interleave(2, dim=1)

    def token_lengths(self, lengths):
        return 2 * torch.as_tensor(lengths)

    def score(self, regions, words, word_lengths, *, max_elements=None):
        dots = torch.einsum("ird,cwd->icrw", regions, words).amax(2)
        keep = torch.arange(words.shape[1]) < word_lengths[:, None]
        return (dots * keep).sum(-1) / word_lengths


def toy_batch():
    g = torch.Generator().manual_seed(0)
    return SimpleNamespace(
        features=torch.randn(3, 4, 3, generator=g, dtype=torch.float64),
        captions=torch.tensor([[1, 2, 3], [4, 5, 0], [6, 0, 0]]),
        lengths=torch.tensor([3, 2, 1]),
    )


def naive(model, b, repeat=1):
    """Every (image, caption) pair scored alone, in float64 loops."""
    emb = model.text_encoder.weight.detach().double()
    out = torch.zeros(3, 3 * repeat, dtype=torch.float64)
    for i in range(3):
        for c in range(3 * repeat):
            cap = c % 3
            rows = [emb[t] for t in b.captions[cap, : b.lengths[cap]] for _ in range(2)]
            best = [max(float(r @ w) for r in b.features[i]) for w in rows]
            out[i, c] = sum(best) / len(best)
    return out


def test_forward_encodes_and_scores_with_the_caption_rows():
    model = MeanDot().double()
    b = toy_batch()
    assert isinstance(model, PairScorer)
    torch.testing.assert_close(model(b).detach(), naive(model, b), rtol=0, atol=1e-12)


def test_gather_texts_gets_the_encoded_rows_and_their_counts():
    model = MeanDot().double()
    b = toy_batch()
    seen = {}

    def twice(texts, rows):
        seen["rows"] = rows.tolist()
        seen["shape"] = tuple(texts.shape)
        return torch.cat([texts, texts]), torch.cat([rows, rows])

    sim = model(b, gather_texts=twice)
    assert seen == {"rows": [6, 4, 2], "shape": (3, 6, 3)}
    torch.testing.assert_close(sim.detach(), naive(model, b, repeat=2), rtol=0, atol=1e-12)


def test_a_bad_batch_is_refused_by_name():
    with pytest.raises(ValueError, match="'lengths'"):
        MeanDot()(SimpleNamespace(features=torch.zeros(1, 1, 3), captions=torch.zeros(1, 1)))


def test_repr_shows_the_settings_not_the_config_sections():
    config = {"kind": "toy", "image": {}, "text": {}, "width": 3}
    model = MeanDot(config=config)
    assert "width=3" in repr(model) and "kind" not in repr(model) and "image=" not in repr(model)
    model.config["text"]["x"] = 1  # the model holds its own deep copy
    assert config["text"] == {}


def test_both_families_share_the_base():
    assert issubclass(CrossAttentionModel, PairScoringModel)
    assert issubclass(MultiExpertModel, PairScoringModel)
    assert CollaborativeExperts.config_sections == ("kind", "experts", "text")


def test_a_model_missing_an_interface_method_says_so_when_scoring():
    class NoScore(MeanDot):
        score = PairScoringModel.score  # the interface's own, not implemented

    with pytest.raises(NotImplementedError):
        NoScore().double()(toy_batch())
