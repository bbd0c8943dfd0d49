"""The person-search protocols (cuhk-pedes, icfg-pedes, rstpreid) through the one evaluation
pipeline: a tiny precomputed-feature data set with person identities, a VSE model, and the
identity metrics checked against a naive ranking written in tests/test_metrics_identity.py."""

from __future__ import annotations

import json

import pytest
import torch
from test_metrics_identity import close, naive

from vlret.data.dataset import RetrievalDataset
from vlret.eval import (
    EnsembleScorer,
    TwoTowerScorer,
    encode_dataset,
    eval_splits,
    evaluate,
    get_protocol,
    protocol_names,
)
from vlret.eval.protocols import IDENTITY_METRICS, default_protocol
from vlret.eval.protocols.person import PERSON_SPLITS
from vlret.metrics import IdentityMetrics
from vlret.models import build_model
from vlret.run.evaluate import dev_metrics, protocol_metrics

PERSONS = ("cuhk-pedes", "icfg-pedes", "rstpreid")
VSE = {
    "image": {"kind": "precomp", "in_dim": 16, "pooling": "max", "region_dropout": 0.0},
    "text": {"kind": "gru", "word_dim": 12, "bidirectional": True, "pooling": "last"},
    "embed_dim": 8,
}
WORDS = "a man woman in red blue black white shirt jacket bag shoes carrying walking".split()


class WordIds:
    """A caption encoder over :data:`WORDS` (ids from 1; 0 pads)."""

    pad_id = 0

    def encode(self, text: str) -> list[int]:
        return [WORDS.index(w) + 1 for w in text.split()]


class PersonFeatures(RetrievalDataset):
    """Precomputed region features of a few pedestrians' pictures, two captions each, with the
    raw person id of every picture (ids as an annotation file writes them, not 0..N-1)."""

    def __init__(self, persons: list[int], *, seed: int, identities: bool = True) -> None:
        g = torch.Generator().manual_seed(seed)
        self.features = torch.randn(len(persons), 3, 16, generator=g)
        self.image_ids = [f"p{p}/{i}.jpg" for i, p in enumerate(persons)]
        self.txt_to_img = torch.arange(len(persons)).repeat_interleave(2)
        picks = torch.randint(len(WORDS), (len(self.txt_to_img), 5), generator=g)
        self.captions = [" ".join(WORDS[int(k)] for k in row) for row in picks]
        self.encoder = WordIds()
        self.image_identity = torch.tensor(persons) if identities else None

    def image(self, index: int) -> torch.Tensor:
        return self.features[index]


def _world(seed: int = 0, identities: bool = True):
    persons = [11, 11, 11, 4, 4, 30, 30, 30, 30, 7]  # 4 persons, 1 to 4 pictures each
    data = PersonFeatures(persons, seed=seed, identities=identities)
    torch.manual_seed(seed)
    model = build_model(VSE, vocab_size=len(WORDS) + 1)
    return data, model


def _oracle(model, data) -> tuple[dict, dict]:
    img, txt = encode_dataset(model, data, normalize=True)
    sim = txt.double() @ img.double().t()
    # the scores' float32 rounding (~1e-7) cannot reorder them: no two are that close
    gaps = sim.sort(dim=1).values.diff(dim=1)
    assert float(gaps.min()) > 1e-5 and float(sim.t().sort(dim=1).values.diff(dim=1).min()) > 1e-5
    img_ids = data.image_identity
    txt_ids = img_ids[data.txt_to_img]
    return naive(sim, txt_ids, img_ids), naive(sim.t(), img_ids, txt_ids)


def test_person_protocols_are_registered_as_data():
    assert set(PERSONS) <= set(protocol_names())
    assert protocol_names()[-1] == "zeroshot-classification"
    sizes = {"cuhk-pedes": (3074, 6156, 1000), "icfg-pedes": (19848, 19873, 1000)}
    sizes["rstpreid"] = (1000, 2000, 200)
    for name in PERSONS:
        p = get_protocol(name)
        assert p.relevance == "same-identity" and p.metrics == IDENTITY_METRICS
        assert (p.paper_images, p.paper_texts, p.paper_identities) == sizes[name]
        assert default_protocol(name) is p and p.paper_splits == ("test",)
        assert set(p.splits) == {name}
        assert set(p.splits[name]) <= set(PERSON_SPLITS[name]) - {"train"}
        assert p.title_for("test", *sizes[name][:2]) == p.title
        assert "not the paper's test set" in p.title_for("val", 10, 20)
    assert get_protocol("cuhk-pedes").splits["cuhk-pedes"] == ("test", "val")
    icfg = get_protocol("icfg-pedes")
    assert icfg.splits["icfg-pedes"] == ("test",)
    assert "no validation split" in icfg.note and "no validation split" in icfg.line()
    with pytest.raises(
        ValueError, match=r"icfg-pedes data evaluates the split\(s\) test, not 'val'"
    ):
        icfg.check_split("val", "icfg-pedes")
    with pytest.raises(ValueError, match="needs cuhk-pedes data"):
        get_protocol("cuhk-pedes").check_split("test", "precomp")
    assert "val" in eval_splits()
    assert len(IDENTITY_METRICS) == 10 and IDENTITY_METRICS[0] == "identity_t2i_r1"


def test_unknown_identity_metric_refused():
    p = get_protocol("rstpreid")
    with pytest.raises(ValueError, match=r"unknown metrics \['rsum'\]"):
        type(p)(**{**p.__dict__, "name": "x", "metrics": ("rsum",), "splits": dict(p.splits)})


def test_two_tower_evaluation_matches_the_oracle_both_ways(tmp_path):
    data, model = _world()
    result = evaluate(TwoTowerScorer(model), data, "cuhk-pedes", split="test")
    assert isinstance(result.metrics, IdentityMetrics)
    t2i, i2t = _oracle(model, data)
    assert close(result.metrics.t2i, t2i) and close(result.metrics.i2t, i2t)
    assert result.metrics.identities == 4 and (result.n_images, result.n_texts) == (10, 20)
    table = result.table().splitlines()
    assert table[0].startswith("CUHK-PEDES protocol on test split of 10 images x 20 texts")
    assert table[-3].split() == ["task", "R1", "R5", "R10", "mAP", "mINP"]
    assert table[-2].split()[0] == "t2i" and table[-1].split()[0] == "i2t"
    assert float(table[-2].split()[1]) == pytest.approx(t2i["r1"], abs=0.005)
    record = json.loads(json.dumps(result.record()))
    assert record["protocol"] == "cuhk-pedes" and record["split"] == "test"
    assert record["n_identities"] == 4 and record["title"] == result.title()
    assert set(record["metrics"]) == set(IDENTITY_METRICS)
    assert record["metrics"]["identity_i2t_minp"] == pytest.approx(i2t["minp"], abs=1e-9)


def test_matrix_scorer_route_agrees_with_the_embedding_route():
    data, model = _world(seed=11)
    by_embeddings = evaluate(TwoTowerScorer(model), data, "rstpreid", split="val")
    by_matrix = evaluate(EnsembleScorer([TwoTowerScorer(model)]), data, "rstpreid", split="val")
    assert by_matrix.scores is not None and by_matrix.scores.shape == (10, 20)
    assert close(by_matrix.metrics.t2i, by_embeddings.metrics.t2i)
    assert close(by_matrix.metrics.i2t, by_embeddings.metrics.i2t)
    t2i, i2t = _oracle(model, data)
    assert close(by_matrix.metrics.t2i, t2i) and close(by_matrix.metrics.i2t, i2t)


def test_a_data_set_without_identities_is_one_line_error():
    data, model = _world(identities=False)
    with pytest.raises(ValueError, match="protocol icfg-pedes ranks by person identity") as err:
        evaluate(TwoTowerScorer(model), data, "icfg-pedes", split="test")
    assert "image_identity is None" in str(err.value) and "\n" not in str(err.value)


def test_image_identity_of_the_wrong_length_is_refused():
    data, model = _world()
    data.image_identity = data.image_identity[:-1]
    with pytest.raises(ValueError, match=r"image_identity must hold one id per image \(10\)"):
        evaluate(TwoTowerScorer(model), data, "cuhk-pedes", split="test")


def test_dev_metrics_add_the_identity_metrics():
    data, model = _world(seed=5)
    img, txt = encode_dataset(model, data, normalize=True)
    plain = dev_metrics(img, txt, data.txt_to_img)
    out = dev_metrics(img, txt, data.txt_to_img, image_identity=data.image_identity)
    assert set(out) == set(plain) | set(IDENTITY_METRICS)
    assert all(out[k] == plain[k] for k in plain)
    t2i, i2t = _oracle(model, data)
    assert close({k: out[f"identity_t2i_{k}"] for k in t2i}, t2i)
    assert close({k: out[f"identity_i2t_{k}"] for k in i2t}, i2t)


def test_protocol_metrics_refuses_identity_protocols():
    with pytest.raises(ValueError, match="protocol cuhk-pedes: relevance 'same-identity'"):
        protocol_metrics(torch.rand(2, 4), torch.rand(2, 4), torch.tensor([0, 1]), "cuhk-pedes")


@pytest.mark.parametrize(("option", "value"), [("rescore", "dsl"), ("shortlist", 5)])
def test_run_evaluation_refuses_rescore_and_shortlist_under_identity(tmp_path, option, value):
    from vlret.run.evaluate import run_evaluation

    with pytest.raises(ValueError, match=f"{option}: protocol rstpreid ranks by person identity"):
        run_evaluation(
            tmp_path / "missing.pt",
            data=tmp_path,
            split="test",
            protocol="rstpreid",
            **{option: value},
        )
