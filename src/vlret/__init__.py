"""vlret: drop-in losses and exact evaluation protocols for vision-language retrieval."""

from . import losses, metrics, similarity
from .losses import available_losses, build_loss
from .metrics import RetrievalMetrics, coco_5fold_metrics, retrieval_metrics
from .similarity import cosine_similarity, positive_mask

__version__ = "0.1.0"

__all__ = [
    "RetrievalMetrics",
    "available_losses",
    "build_loss",
    "coco_5fold_metrics",
    "cosine_similarity",
    "losses",
    "metrics",
    "positive_mask",
    "retrieval_metrics",
    "similarity",
]
