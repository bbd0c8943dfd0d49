"""Flickr30K 1K test: 1000 images x 5000 captions (VSE++, SCAN, VSE-infinity)."""

from .registry import EvalProtocol, register_protocol

F30K = register_protocol(
    EvalProtocol(
        name="f30k",
        title="Flickr30K 1K test",
        summary="Flickr30K test: 1000 images x 5000 captions",
        paper_set="Flickr30K 1K",
        paper_splits=("test",),
        paper_images=1000,
        paper_texts=5000,
        splits={"precomp": ("test", "dev"), "karpathy": ("test", "dev")},
        default_for=("precomp", "karpathy"),
    )
)
