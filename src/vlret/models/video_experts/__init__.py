"""Multi-expert video retrieval models: Collaborative Experts (CE, Liu et al. BMVC 2019) and
the Multi-modal Transformer (MMT, Gabeur et al. ECCV 2020), the two video systems of the
Unified loss paper's Table 4.

Both read per-video expert features (:class:`vlret.data.ExpertBatch`; any expert may be
missing for any video), embed a video as one L2-normalised vector per expert and a caption as
one vector per expert plus mixture logits, and score a pair as the caption-weighted sum of the
per-expert cosines, the weights a softmax renormalised over the experts the video has. They
are pair scorers (:class:`~vlret.models.PairScorer`): the trainer hands their batch score
matrix to any loss's ``from_similarity``.

* :mod:`~vlret.models.video_experts.common`: context gating, gated embedding units, masked
  NetVLAD, the mixture scoring and :class:`MultiExpertModel`;
* :mod:`~vlret.models.video_experts.ce`: :class:`CollaborativeExperts`;
* :mod:`~vlret.models.video_experts.mmt`: :class:`MultiModalTransformer`;
* :mod:`~vlret.models.video_experts.build`: the ``[model] kind = "ce" | "mmt"`` configs.
"""

from .build import (
    VIDEO_EXPERT_KINDS,
    VIDEO_EXPERT_MODEL_DEFAULTS,
    build_video_expert_model,
)
from .ce import CETextEncoder, CEVideoEncoder, CollaborativeExperts, CollaborativeGating
from .common import (
    ContextGating,
    ExpertInputs,
    GatedEmbeddingUnit,
    MultiExpertModel,
    NetVLAD,
    gather_experts,
    mixture_scores,
    mixture_weights,
)
from .mmt import MMTTextEncoder, MMTVideoEncoder, MultiModalTransformer

__all__ = [
    "VIDEO_EXPERT_KINDS",
    "VIDEO_EXPERT_MODEL_DEFAULTS",
    "CETextEncoder",
    "CEVideoEncoder",
    "CollaborativeExperts",
    "CollaborativeGating",
    "ContextGating",
    "ExpertInputs",
    "GatedEmbeddingUnit",
    "MMTTextEncoder",
    "MMTVideoEncoder",
    "MultiExpertModel",
    "MultiModalTransformer",
    "NetVLAD",
    "build_video_expert_model",
    "gather_experts",
    "mixture_scores",
    "mixture_weights",
]
