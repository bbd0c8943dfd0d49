"""Text-based person search (AdaCL appendix A.5, Tables 7-9; IRRA's evaluation): CUHK-PEDES,
ICFG-PEDES and RSTPReid.

Each caption (a description of a pedestrian) queries the whole gallery of the split's images;
every image of the caption's person identity is a correct answer
(:func:`~vlret.metrics.identity_retrieval_metrics`: R@1, R@5, R@10, mAP, mINP in percent, ties
against the query). Image-to-text is reported too: each image queries the split's captions,
every caption of its person is relevant. The data format of each set has the protocol's name
(``data.format = "cuhk-pedes"``) and its official splits: ``train``, ``val``, ``test``, except
ICFG-PEDES, which has no validation split (``train`` and ``test`` only).

Paper test sets (the sizes IRRA's data statistics give): CUHK-PEDES 1,000 identities, 3,074
images, 6,156 captions; ICFG-PEDES 1,000 identities, 19,848 images, 19,873 captions; RSTPReid
200 identities, 1,000 images, 2,000 captions.

Checkpoint selection: IRRA selects checkpoints on the test split by default
(``--val_dataset test``), one reason its reproductions fall short of the paper (IRRA#45). Here a
run selects on ``val``; on ICFG-PEDES, which has none, only a ``test`` the user names
(``data.dev_split = "test"``; :func:`vlret.run.config_checks.check_person_search`).
"""

from __future__ import annotations

from ...metrics import SameIdentity
from .registry import IDENTITY_METRICS, EvalProtocol, register_protocol

#: The official splits of each person-search format (ICFG-PEDES has no validation split).
PERSON_SPLITS = {
    "cuhk-pedes": ("train", "val", "test"),
    "icfg-pedes": ("train", "test"),
    "rstpreid": ("train", "val", "test"),
}


def _person(
    name: str,
    title: str,
    paper: tuple[int, int, int],
    evaluated: tuple[str, ...],
    note: str = "",
) -> EvalProtocol:
    identities, images, captions = paper
    return register_protocol(
        EvalProtocol(
            name=name,
            title=f"{title} test (text-based person search)",
            summary=(
                f"{title} test: {captions} captions x {images} images of {identities} persons, "
                "relevant = same identity, R@1/5/10 mAP mINP both ways"
            ),
            paper_set=title,
            paper_splits=("test",),
            paper_images=images,
            paper_texts=captions,
            paper_identities=identities,
            splits={name: evaluated},
            relevance=SameIdentity.name,
            metrics=IDENTITY_METRICS,
            default_for=(name,),
            note=note,
        )
    )


CUHK_PEDES = _person("cuhk-pedes", "CUHK-PEDES", (1000, 3074, 6156), ("test", "val"))
ICFG_PEDES = _person(
    "icfg-pedes",
    "ICFG-PEDES",
    (1000, 19848, 19873),
    ("test",),
    note="no validation split: select checkpoints on test only by naming it",
)
RSTPREID = _person("rstpreid", "RSTPReid", (200, 1000, 2000), ("test", "val"))


__all__ = ["CUHK_PEDES", "ICFG_PEDES", "PERSON_SPLITS", "RSTPREID"]
