"""CaptionTfidf against a dense scikit-learn computation written out naively."""

from __future__ import annotations

import random

import numpy as np
import pytest
import scipy.sparse as sp
import torch
from sklearn.exceptions import NotFittedError
from sklearn.feature_extraction.text import CountVectorizer, TfidfTransformer
from sklearn.metrics.pairwise import cosine_similarity

from vlret.semantic import CaptionTfidf

WORDS = (
    "man woman dog cat riding skateboard street red bus kitchen table pizza two people "
    "standing next to the a of on in with white large small field grass frisbee playing"
).split()


def make_corpus(n_images: int, seed: int = 0, str_ids: bool = False) -> dict:
    rng = random.Random(seed)
    corpus = {}
    for i in range(n_images):
        topic = rng.sample(WORDS, 6)
        caps = []
        for _ in range(rng.randint(1, 5)):  # images with different caption counts
            words = [rng.choice(topic) if rng.random() < 0.7 else rng.choice(WORDS)]
            words += [rng.choice(topic if rng.random() < 0.6 else WORDS) for _ in range(7)]
            caps.append(" ".join(words).capitalize() + " .")
        corpus[f"img{i}" if str_ids else i * 7] = caps
    return corpus


def dense_oracle(corpus: dict, ids_a: list, ids_b: list, ngram_range=(1, 1)) -> np.ndarray:
    """Dense TF-IDF of every caption, full caption cosine matrix, then Q_a x Q_b block means."""
    texts, owner = [], []
    for img_id, caps in corpus.items():
        for c in caps:
            texts.append(c)
            owner.append(img_id)
    counts = CountVectorizer(ngram_range=ngram_range).fit_transform(texts)
    dense = TfidfTransformer().fit_transform(counts).toarray()
    cos = cosine_similarity(dense)
    out = np.zeros((len(ids_a), len(ids_b)))
    for r, a in enumerate(ids_a):
        for c, b in enumerate(ids_b):
            pa = [p for p, o in enumerate(owner) if o == a]
            pb = [q for q, o in enumerate(owner) if o == b]
            out[r, c] = sum(cos[p, q] for p in pa for q in pb) / (len(pa) * len(pb))
    return out


@pytest.mark.parametrize("ngram_range", [(1, 1), (1, 4)])
@pytest.mark.parametrize("str_ids", [False, True])
def test_similarity_matches_dense_sklearn(ngram_range, str_ids):
    corpus = make_corpus(40, seed=1, str_ids=str_ids)
    tfidf = CaptionTfidf(ngram_range=ngram_range).fit(corpus)
    keys = list(corpus)
    rng = random.Random(2)
    ids_a = [rng.choice(keys) for _ in range(9)] + [keys[0], keys[0]]  # duplicates allowed
    ids_b = [rng.choice(keys) for _ in range(6)]
    got = tfidf.similarity(ids_a, ids_b, dtype=torch.float64)
    assert got.shape == (len(ids_a), len(ids_b))
    np.testing.assert_allclose(
        got.numpy(), dense_oracle(corpus, ids_a, ids_b, ngram_range), atol=1e-12
    )


def test_square_batch_symmetric_and_tensor_ids():
    corpus = make_corpus(30, seed=3)
    tfidf = CaptionTfidf().fit(corpus)
    keys = list(corpus)[:12]
    by_list = tfidf.similarity(keys)
    by_tensor = tfidf.similarity(torch.tensor(keys))
    assert by_list.dtype == torch.float32
    torch.testing.assert_close(by_list, by_tensor)
    torch.testing.assert_close(by_list, by_list.t())
    np.testing.assert_allclose(by_list.numpy(), dense_oracle(corpus, keys, keys), atol=1e-6)


def test_single_caption_self_similarity_is_one_and_disjoint_is_zero():
    tfidf = CaptionTfidf().fit(
        {"x": ["red bus on the street"], "y": ["two cats sleeping"], "z": ["red bus parked"]}
    )
    sim = tfidf.similarity(["x", "y", "z"], dtype=torch.float64)
    assert sim[0, 0].item() == pytest.approx(1.0)
    assert sim[0, 1].item() == 0.0
    assert 0 < sim[0, 2].item() < 1


def test_released_code_defaults_drop_one_letter_words_and_lowercase():
    tfidf = CaptionTfidf().fit({1: ["A Dog runs"], 2: ["a dog RUNS"], 3: ["cats x"]})
    assert tfidf.vocabulary_size == 3  # "dog", "runs", "cats": no "a" or "x"
    assert tfidf.similarity([1], [2]).item() == pytest.approx(1.0)


def test_fit_returns_self_and_stays_sparse():
    tfidf = CaptionTfidf()
    assert tfidf.fit(make_corpus(10)) is tfidf
    assert sp.issparse(tfidf.image_vectors)
    assert tfidf.image_vectors.shape == (10, tfidf.vocabulary_size)
    assert tfidf.n_images == 10 and 0 in tfidf and 1 not in tfidf


def test_caption_similarity_matches_dense_sklearn():
    corpus = make_corpus(20, seed=4)
    tfidf = CaptionTfidf(ngram_range=(1, 2)).fit(corpus)
    texts = [c for caps in corpus.values() for c in caps]
    counts = CountVectorizer(ngram_range=(1, 2)).fit(texts)
    transformer = TfidfTransformer().fit(counts.transform(texts))
    batch = texts[:7] + ["completely unseen words only"]
    dense = transformer.transform(counts.transform(batch)).toarray()
    got = tfidf.caption_similarity(batch, dtype=torch.float64).numpy()
    np.testing.assert_allclose(got[:7, :7], cosine_similarity(dense[:7]), atol=1e-12)
    assert np.all(got[7] == 0)  # unknown words: zero vector, similarity 0


def test_errors_are_clear():
    tfidf = CaptionTfidf()
    with pytest.raises(NotFittedError, match="not fitted"):
        tfidf.similarity([0])
    assert issubclass(NotFittedError, ValueError)
    with pytest.raises(ValueError, match="captions must be a mapping"):
        tfidf.fit([["a caption"]])
    with pytest.raises(ValueError, match="captions is empty"):
        tfidf.fit({})
    with pytest.raises(ValueError, match=r"captions\[3\] has no captions"):
        tfidf.fit({1: ["dog runs"], 3: []})
    with pytest.raises(ValueError, match=r"captions\[1\] must be a list"):
        tfidf.fit({1: "dog runs"})
    with pytest.raises(ValueError, match=r"captions\[1\]\[1\] is empty"):
        tfidf.fit({1: ["dog runs", "   "]})
    with pytest.raises(ValueError, match="no token the vectorizer keeps.*'A .'.*image 2"):
        tfidf.fit({1: ["dog runs"], 2: ["A ."]})
    with pytest.raises(ValueError, match="ngram_range"):
        CaptionTfidf(ngram_range=(2, 1))
    tfidf.fit({1: ["dog runs"], 2: ["cat sleeps"]})
    with pytest.raises(ValueError, match=r"img_ids_a: 2 id\(s\) are not in the fitted.*\[5, 6\]"):
        tfidf.similarity([1, 5, 6])
    with pytest.raises(ValueError, match="img_ids_b: 1 id"):
        tfidf.similarity([1], ["1"])
    with pytest.raises(ValueError, match="img_ids_a must be 1-D"):
        tfidf.similarity(torch.ones(2, 2, dtype=torch.long))
    with pytest.raises(ValueError, match=r"captions_a\[0\] is empty"):
        tfidf.caption_similarity([""])
    with pytest.raises(ValueError, match=r"^txt_ids: 1 id\(s\) are not in the fitted"):
        tfidf.similarity([1], [7], names=("img_ids", "txt_ids"))
    with pytest.raises(ValueError, match=r"^img_ids: 1 id\(s\)"):
        tfidf.similarity([7], names=("img_ids", "txt_ids"))


@pytest.mark.parametrize("ngram_range", [(1, 1), (1, 3)])
def test_save_load_round_trip(tmp_path, ngram_range):
    corpus = make_corpus(25, seed=5)
    corpus.update(make_corpus(5, seed=6, str_ids=True))  # int and str ids side by side
    tfidf = CaptionTfidf(ngram_range=ngram_range).fit(corpus)
    out = tfidf.save(tmp_path / "tfidf")
    assert sorted(p.name for p in out.iterdir()) == sorted(
        [CaptionTfidf.META_FILE, CaptionTfidf.VECTORS_FILE]
    )
    loaded = CaptionTfidf.load(out)
    assert loaded.ngram_range == ngram_range and loaded.n_images == 30
    assert loaded.vocabulary_size == tfidf.vocabulary_size
    keys = list(corpus)
    assert all(k in loaded for k in keys) and "img0" in loaded and "0" not in loaded
    for ids in (keys, keys[::-1][:7]):
        torch.testing.assert_close(
            loaded.similarity(ids, keys, dtype=torch.float64),
            tfidf.similarity(ids, keys, dtype=torch.float64),
            rtol=0,
            atol=0,
        )
    captions = [c for caps in list(corpus.values())[:6] for c in caps] + ["unseen words only"]
    torch.testing.assert_close(
        loaded.caption_similarity(captions, dtype=torch.float64),
        tfidf.caption_similarity(captions, dtype=torch.float64),
        rtol=0,
        atol=0,
    )
    assert (loaded.image_vectors != tfidf.image_vectors).nnz == 0


def test_save_load_errors(tmp_path):
    with pytest.raises(NotFittedError):
        CaptionTfidf().save(tmp_path / "unfitted")
    with pytest.raises(ValueError, match="int or str image ids only.*tuple"):
        CaptionTfidf().fit({(1, 2): ["dog runs"]}).save(tmp_path / "tuple")
    out = CaptionTfidf().fit({1: ["dog runs"], "b": ["cat sleeps"]}).save(tmp_path / "ok")
    meta_file = out / CaptionTfidf.META_FILE
    meta = meta_file.read_text()
    meta_file.write_text(meta.replace('"version": 1', '"version": 99'))
    with pytest.raises(ValueError, match="unsupported CaptionTfidf format version 99"):
        CaptionTfidf.load(out)
    meta_file.write_text(meta.replace('"ids": [1, "b"]', '"ids": [1]'))
    with pytest.raises(ValueError, match="inconsistent saved CaptionTfidf"):
        CaptionTfidf.load(out)
    meta_file.write_text('{"format": "something else"}')
    with pytest.raises(ValueError, match="is not a saved CaptionTfidf"):
        CaptionTfidf.load(out)
    with pytest.raises(FileNotFoundError):
        CaptionTfidf.load(tmp_path / "missing")
