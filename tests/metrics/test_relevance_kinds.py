"""The relevance kinds (vlret.metrics.relevance_kinds): each kind's ids give exactly the relevant
pairs of its definition (checked against a matrix built pair by pair), the registry resolves
names and refuses unknown ones, and the capabilities are what the harness relies on."""

from __future__ import annotations

import pytest
import torch

from vlret.metrics import (
    RETRIEVAL_METRIC_KEYS,
    AnyCaptionOfVideo,
    ClassLabel,
    ImageOfCaption,
    Relevance,
    RetrievalMetrics,
    SameIdentity,
    get_relevance,
    relevance_names,
)


def _mask(query_ids: torch.Tensor, gallery_ids: torch.Tensor) -> torch.Tensor:
    return query_ids[:, None] == gallery_ids[None, :]


def test_registry_names_and_objects() -> None:
    assert relevance_names() == (
        "image-of-caption",
        "any-caption-of-video",
        "same-identity",
        "class-label",
    )
    for name in relevance_names():
        kind = get_relevance(name)
        assert kind.name == name and str(kind) == name
        assert get_relevance(kind) is kind
    with pytest.raises(ValueError, match="relevance must be one of image-of-caption"):
        get_relevance("same-image")


@pytest.mark.parametrize("kind", [ImageOfCaption(), AnyCaptionOfVideo()])
def test_caption_kinds_relate_a_caption_to_its_own_image(kind: Relevance) -> None:
    t2i = torch.tensor([0, 0, 1, 2, 2, 2])
    want = torch.zeros(3, 6, dtype=torch.bool)  # (images, captions), pair by pair
    for j, i in enumerate(t2i.tolist()):
        want[i, j] = True
    q, g = kind.ids("i2t", {"txt_to_img": t2i})
    assert torch.equal(_mask(q, g), want)
    q, g = kind.ids("t2i", {"txt_to_img": t2i})
    assert torch.equal(_mask(q, g), want.t())
    # an image without a caption (the last one) is counted when n_images says so
    q, _ = kind.ids("i2t", {"txt_to_img": t2i, "n_images": 4})
    assert q.tolist() == [0, 1, 2, 3]


def test_same_identity_relates_items_of_one_person() -> None:
    images, captions = torch.tensor([7, 3, 7]), torch.tensor([3, 7, 7, 3])
    want = torch.tensor([[images[i] == captions[j] for j in range(4)] for i in range(3)])
    kind = SameIdentity()
    q, g = kind.ids("t2i", {"image_ids": images, "caption_ids": captions})
    assert torch.equal(_mask(q, g), want.t())
    q, g = kind.ids("i2t", {"image_ids": images, "caption_ids": captions})
    assert torch.equal(_mask(q, g), want)


def test_class_label_relates_an_image_to_its_class() -> None:
    q, g = ClassLabel().ids("i2c", {"labels": [2, 0, 2], "n_classes": 4})
    assert _mask(q, g).tolist() == [
        [False, False, True, False],
        [True, False, False, False],
        [False, False, True, False],
    ]


def test_bad_direction_and_labels_are_one_line_errors() -> None:
    with pytest.raises(ValueError, match="direction must be one of i2c, got 't2i'"):
        ClassLabel().ids("t2i", {"labels": [0], "n_classes": 1})
    with pytest.raises(ValueError, match="needs the label 'caption_ids'"):
        SameIdentity().ids("t2i", {"image_ids": [1]})
    with pytest.raises(ValueError, match="txt_to_img must be a 1-D integer tensor"):
        ImageOfCaption().ids("t2i", {"txt_to_img": torch.zeros(3)})
    with pytest.raises(ValueError, match="n_classes must be a positive integer"):
        ClassLabel().ids("i2c", {"labels": [0], "n_classes": 0})


def test_capabilities() -> None:
    caption, video = get_relevance("image-of-caption"), get_relevance("any-caption-of-video")
    person, label = get_relevance("same-identity"), get_relevance("class-label")
    assert caption.captions and video.captions and not person.captions and not label.captions
    assert person.identities and not (caption.identities or video.identities or label.identities)
    assert label.classes and not (caption.classes or person.classes)
    assert caption.clip_benchmark and video.clip_benchmark
    assert not (person.clip_benchmark or label.clip_benchmark)
    assert caption.rescoring and caption.shortlists and not (person.rescoring or person.shortlists)
    assert (caption.visual, video.visual, person.visual) == ("image", "video", "image")
    assert caption.metrics == video.metrics and "rsum" in caption.metrics
    assert person.metrics[0] == "identity_t2i_r1" and label.metrics[0] == "acc1"


def test_retrieval_metric_keys_are_the_fields_of_retrieval_metrics() -> None:
    fields = tuple(k for k in RetrievalMetrics.__dataclass_fields__ if k != "folds")
    assert RETRIEVAL_METRIC_KEYS == fields == get_relevance("image-of-caption").metrics
