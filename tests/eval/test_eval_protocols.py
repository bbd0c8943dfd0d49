"""The protocol registry (vlret.eval.protocols): the five protocols of the papers keep the
numbers, titles and errors of the tables they replace, and a new protocol is one record."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from vlret.eval import EvalProtocol, Evaluation, evaluate, get_protocol, protocol_names
from vlret.eval.protocols import register_protocol, registry
from vlret.eval.scorers import Measured, Scorer
from vlret.metrics import retrieval_metrics_from_similarity

# The tables of vlret.train.evaluate before the registry, written out as the oracle.
OLD_SPLITS = {
    "f30k": {"precomp": ("test", "dev"), "karpathy": ("test", "dev")},
    "coco1k": {"precomp": ("testall", "dev"), "karpathy": ("test", "testall", "dev")},
    "coco5k": {"precomp": ("testall", "dev"), "karpathy": ("test", "testall", "dev")},
    "msrvtt-full": {"msrvtt": ("test", "dev")},
    "msrvtt-1ka": {"msrvtt": ("test",)},
}
OLD_TITLES = {
    "f30k": "Flickr30K 1K test",
    "coco1k": "MS-COCO 5-fold 1K test",
    "coco5k": "MS-COCO 5K test",
    "msrvtt-full": "MSR-VTT full test (v2t: best of each video's captions)",
    "msrvtt-1ka": "MSR-VTT 1k-A test",
}
OLD_PAPER_SETS = {
    "f30k": ("Flickr30K 1K", ("test",), 1000, 5000),
    "coco1k": ("MS-COCO 5-fold 1K", ("testall", "test"), 5000, 25000),
    "coco5k": ("MS-COCO 5K", ("testall", "test"), 5000, 25000),
    "msrvtt-full": ("MSR-VTT full", ("test",), 2990, 59800),
    "msrvtt-1ka": ("MSR-VTT 1k-A", ("test",), 1000, 1000),
}


def test_the_five_protocols_keep_their_order_and_tables():
    assert protocol_names()[:5] == ("f30k", "coco1k", "coco5k", "msrvtt-full", "msrvtt-1ka")
    for name in OLD_TITLES:
        p = get_protocol(name)
        assert {k: tuple(v) for k, v in p.splits.items()} == OLD_SPLITS[name]
        assert p.title == OLD_TITLES[name]
        assert (p.paper_set, p.paper_splits, p.paper_images, p.paper_texts) == OLD_PAPER_SETS[name]
        assert p.folds == (5 if name == "coco1k" else 1)
        assert p.visual == ("video" if name.startswith("msrvtt") else "image")
        assert p.data_protocol == {"msrvtt-full": "full", "msrvtt-1ka": "1k-A"}.get(name)


@pytest.mark.parametrize("name", list(OLD_TITLES))
@pytest.mark.parametrize("split", ["test", "testall", "dev", None])
@pytest.mark.parametrize(
    "sizes", [(1000, 5000), (5000, 25000), (2990, 59800), (1000, 1000), (10, 50)]
)
def test_titles_are_the_old_ones(name, split, sizes):
    paper, splits, n_img, n_txt = OLD_PAPER_SETS[name]
    if split in splits and sizes == (n_img, n_txt):
        want = OLD_TITLES[name]
    else:
        items = "videos" if name.startswith("msrvtt") else "images"  # MSR-VTT: videos
        folds = f", 5 folds of {sizes[0] // 5} images" if name == "coco1k" else ""
        want = (
            f"{paper} protocol on {split or 'a'} split of {sizes[0]} {items} x {sizes[1]} texts"
            f"{folds} (not the paper's test set: {'/'.join(splits)}, {n_img} x {n_txt})"
        )
    assert get_protocol(name).title_for(split, *sizes) == want


def test_split_and_name_errors_are_the_old_ones():
    with pytest.raises(ValueError, match=r"protocol must be one of f30k, coco1k, .*got 'x'"):
        get_protocol("x")
    with pytest.raises(ValueError, match="protocol msrvtt-1ka needs msrvtt data; the checkpoint"):
        get_protocol("msrvtt-1ka").check_split("test", "precomp")
    with pytest.raises(ValueError, match=r"on precomp data evaluates the split\(s\) testall, dev"):
        get_protocol("coco5k").check_split("test", "precomp")
    get_protocol("coco5k").check_split("test", "karpathy")  # accepted


def test_records_refuse_what_they_cannot_mean():
    base = get_protocol("f30k")
    with pytest.raises(ValueError, match="relevance must be one of"):
        dataclasses.replace(base, name="t", relevance="same-image")
    with pytest.raises(ValueError, match="unknown metrics"):
        dataclasses.replace(base, name="t", metrics=("i2t_r1", "map"))
    with pytest.raises(ValueError, match="folds must be a positive integer"):
        dataclasses.replace(base, name="t", folds=0)
    with pytest.raises(ValueError, match="registered twice"):
        register_protocol(get_protocol("f30k"))
    with pytest.raises(TypeError):  # records are read-only
        get_protocol("f30k").splits["precomp"] = ("train",)  # type: ignore[index]


class _MatrixOf(Scorer):
    """A fixed score matrix (the pipeline's view of any scorer)."""

    def __init__(self, sim):
        self.sim = sim

    def measure(self, data, *, folds=1):
        assert folds == 1
        return Measured(retrieval_metrics_from_similarity(self.sim, data.txt_to_img))


class _Split:
    def __init__(self, t2i, n_img):
        self.txt_to_img, self.num_images, self.num_captions = t2i, n_img, len(t2i)


def test_a_new_protocol_is_one_record(monkeypatch):
    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))
    new = register_protocol(
        EvalProtocol(
            name="toy-1k",
            title="Toy 1K test",
            summary="a toy: 3 images x 6 captions",
            paper_set="Toy",
            paper_splits=("test",),
            paper_images=3,
            paper_texts=6,
            splits={"precomp": ("test",)},
        )
    )
    assert "toy-1k" in protocol_names() and get_protocol("toy-1k") is new
    assert new.line().startswith("toy-1k") and "precomp test" in new.line()
    t2i = torch.tensor([0, 0, 1, 1, 2, 2])
    sim = torch.randn(3, 6, generator=torch.Generator().manual_seed(0))
    result = evaluate(_MatrixOf(sim), _Split(t2i, 3), "toy-1k", split="test")
    assert isinstance(result, Evaluation) and result.protocol is new and result.split == "test"
    assert result.metrics == retrieval_metrics_from_similarity(sim, t2i)
    assert result.title() == "Toy 1K test"
    assert result.table().splitlines()[0].startswith("Toy 1K test")
    record = result.record()
    assert (record["protocol"], record["split"], record["n_images"], record["n_texts"]) == (
        "toy-1k",
        "test",
        3,
        6,
    )
    assert record["metrics"] == result.metrics.as_dict()


def test_evaluate_refuses_a_relevance_it_does_not_rank(monkeypatch):
    # (same-identity is ranked since the person-search protocols: tests/test_eval_person.py)
    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))
    register_protocol(
        dataclasses.replace(
            get_protocol("f30k"),
            name="ids",
            relevance="class-label",
            metrics=("acc1",),
            default_for=(),
        )
    )
    with pytest.raises(ValueError, match="relevance 'class-label' is not ranked"):
        evaluate(_MatrixOf(torch.eye(2)), _Split(torch.tensor([0, 1]), 2), "ids")


def test_splits_and_defaults_are_read_from_the_registry(monkeypatch):
    import vlret.train
    from vlret.analysis.compare import CompareError, eval_settings
    from vlret.eval import default_protocol, eval_splits

    # val: the person-search protocols' validation split
    assert eval_splits() == ("test", "testall", "dev", "val")
    assert [default_protocol(f).name for f in ("precomp", "karpathy", "msrvtt")] == [
        "f30k",
        "f30k",
        "msrvtt-full",
    ]
    assert default_protocol("webdataset") is None
    with pytest.warns(DeprecationWarning, match="vlret.train.PROTOCOLS is deprecated"):
        assert vlret.train.PROTOCOLS == protocol_names()
    for fmt, want in (("precomp", "f30k"), ("msrvtt", "msrvtt-full")):
        assert eval_settings({"data": {"format": fmt}}, {}).protocol == want
    with pytest.raises(CompareError, match=r"compare.protocol: expected one of f30k, .*got 'x'"):
        eval_settings({}, {"protocol": "x"})
    # zero-shot classification ranks classes, not captions: vlret eval runs it, compare does not
    with pytest.raises(CompareError, match=r"rstpreid, got 'zeroshot-classification'$"):
        eval_settings({}, {"protocol": "zeroshot-classification"})
    with pytest.raises(CompareError, match="no protocol is the default for data.format 'odd'"):
        eval_settings({"data": {"format": "odd"}}, {})

    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))
    late = dataclasses.replace(
        get_protocol("coco5k"), name="late", splits={"odd": ("holdout",)}, default_for=("odd",)
    )
    register_protocol(late)  # registered after the import of every module above
    assert eval_splits()[-1] == "holdout"
    assert eval_settings({"data": {"format": "odd"}}, {}).protocol == "late"
    with pytest.warns(DeprecationWarning):
        assert vlret.train.PROTOCOLS[-1] == "late"
    with pytest.raises(ValueError, match="late is already the default for odd data"):
        register_protocol(dataclasses.replace(late, name="later"))
    with pytest.raises(ValueError, match="default_for names precomp, a format whose splits"):
        dataclasses.replace(late, name="t", default_for=("precomp",))
