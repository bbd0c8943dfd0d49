"""Zero-shot classification (CLIP_benchmark's protocol; AdaCL Table 10): each image of a
class-labelled set (:mod:`vlret.data.classification`) against a classifier built from the class
names and prompt templates, reporting ``acc1``, ``acc5`` and ``mean_per_class_recall``
(fractions). Its task (:mod:`vlret.eval.tasks.zeroshot`) runs it through ``vlret eval
--protocol zeroshot-classification``, with the machinery of ``vlret zeroshot``
(:mod:`vlret.eval.zeroshot`): the eight sets of AdaCL Table 10 on their official test splits, an
``imagefolder`` on its test split (``vlret zeroshot --split`` takes any split a set has). Its
one data format is ``classification`` (a ``ClassificationSet``, whatever its on-disk
layout)."""

from ...metrics import ZEROSHOT_METRICS
from .registry import EvalProtocol, register_protocol

ZEROSHOT_CLASSIFICATION = register_protocol(
    EvalProtocol(
        name="zeroshot-classification",
        title="Zero-shot classification",
        summary="zero-shot classification of a class set (--dataset): acc1, acc5, mean per-class "
        "recall",
        paper_set="AdaCL Table 10 (zero-shot classification)",
        paper_splits=("test",),
        # one protocol over several sets: no single size (paper_texts: the classes)
        paper_images=0,
        paper_texts=0,
        splits={"classification": ("test",)},
        relevance="class-label",
        metrics=ZEROSHOT_METRICS,
    )
)
