"""MS-COCO: the 5K test (5000 images x 25000 captions) and the 5-fold 1K test (the same split in
5 folds of 1000 images, metrics averaged). Precomp data holds the 5000 test images in
``testall`` (its ``test`` is only the first 1000); a Karpathy COCO JSON in ``test``."""

from .registry import EvalProtocol, register_protocol

_SPLITS = {"precomp": ("testall", "dev"), "karpathy": ("test", "testall", "dev")}
_PAPER = {
    "paper_splits": ("testall", "test"),
    "paper_images": 5000,
    "paper_texts": 25000,
    "splits": _SPLITS,
}

COCO1K = register_protocol(
    EvalProtocol(
        name="coco1k",
        title="MS-COCO 5-fold 1K test",
        summary="MS-COCO testall: 5 folds of 1000 images, averaged",
        paper_set="MS-COCO 5-fold 1K",
        folds=5,
        fold_set="COCO testall",
        unfolded="coco5k",
        **_PAPER,  # type: ignore[arg-type]
    )
)
COCO5K = register_protocol(
    EvalProtocol(
        name="coco5k",
        title="MS-COCO 5K test",
        summary="MS-COCO testall: 5000 images x 25000 captions",
        paper_set="MS-COCO 5K",
        **_PAPER,  # type: ignore[arg-type]
    )
)
