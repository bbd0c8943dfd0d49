"""Encoders into the joint embedding space, and the two-tower retrieval model.

* :mod:`~vlret.models.image`: region / vector features -> FC projection -> max, mean or GPO
  pooling (VSE++ (BUTD), VSE-infinity), with VSE-infinity's region dropout.
* :mod:`~vlret.models.text`: word embeddings + (bi-)GRU, or a local Hugging Face BERT.
* :mod:`~vlret.models.video`: frame features with the same poolings.
* :mod:`~vlret.models.clip`: a local ``CLIPModel`` with added embedding layers (Unified paper
  B.1.2; the towers in :mod:`~vlret.models.clip_towers`, the folder's processor and tokenizer
  files read by :mod:`~vlret.models.clip_folder`), a randomly initialised one from a preset
  (``ViT-B-32``) with its byte tokenizer, and CLIP preprocessing with PIL and numpy.
* :mod:`~vlret.models.backbones`: ResNet / ViT image towers (``transformers``) from local
  directories or presets (``resnet-152``, ``vit-b-16``), then an FC (VSE++ from pixels).
* :mod:`~vlret.models.cross_attention`, :mod:`~vlret.models.sgraf`: the pair scorers of SCAN,
  BFAN and SGRAF; :mod:`~vlret.models.cross_model`: the models around them (reference region
  and word encoders), which return a score matrix (:class:`~vlret.models.pair_scorer.PairScorer`;
  their shared module base is :class:`~vlret.models.pair_scorer.PairScoringModel`).
* :mod:`~vlret.models.video_experts`: the multi-expert video models CE and MMT (pair
  scorers over per-expert embeddings with renormalised mixture weights).
* :mod:`~vlret.models.retrieval`: :class:`RetrievalModel` and :func:`build_model`.

Models never import losses; embeddings are not normalised by default (the losses normalise).
``transformers`` and ``pillow`` (``pip install vlret[hf]``) are imported only when a BERT or
CLIP encoder is built or an image is preprocessed.
"""

from .backbones import BACKBONE_PRESETS, BackboneImageEncoder, build_backbone_encoder
from .clip import (
    CLIP_MEAN,
    CLIP_PRESETS,
    CLIP_STD,
    CLIPByteTokenizer,
    CLIPImageTransform,
    build_clip,
    load_clip,
)
from .clip_towers import CLIPImageEncoder, CLIPTextEncoder
from .cross_model import (
    BFAN,
    SCAN,
    SGRAF,
    CrossAttentionModel,
    RegionEncoder,
    WordEncoder,
    build_cross_model,
)
from .image import GPO, POOLINGS, ImageEncoder, MaskedPooling, lengths_to_mask, sinusoidal_positions
from .pair_scorer import PairScorer, PairScoringModel
from .retrieval import IMAGE_DEFAULTS, MODEL_DEFAULTS, TEXT_DEFAULTS, RetrievalModel, build_model
from .text import BertTextEncoder, GRUTextEncoder
from .video import VideoEncoder
from .video_experts import (
    CollaborativeExperts,
    MultiExpertModel,
    MultiModalTransformer,
    build_video_expert_model,
)

__all__ = [
    "BACKBONE_PRESETS",
    "CLIP_PRESETS",
    "BackboneImageEncoder",
    "CLIPByteTokenizer",
    "build_backbone_encoder",
    "build_clip",
    "PairScorer",
    "PairScoringModel",
    "BFAN",
    "SCAN",
    "SGRAF",
    "CrossAttentionModel",
    "RegionEncoder",
    "WordEncoder",
    "build_cross_model",
    "CollaborativeExperts",
    "MultiExpertModel",
    "MultiModalTransformer",
    "build_video_expert_model",
    "CLIP_MEAN",
    "CLIP_STD",
    "GPO",
    "IMAGE_DEFAULTS",
    "MODEL_DEFAULTS",
    "POOLINGS",
    "TEXT_DEFAULTS",
    "BertTextEncoder",
    "CLIPImageEncoder",
    "CLIPImageTransform",
    "CLIPTextEncoder",
    "GRUTextEncoder",
    "ImageEncoder",
    "MaskedPooling",
    "RetrievalModel",
    "VideoEncoder",
    "build_model",
    "lengths_to_mask",
    "load_clip",
    "sinusoidal_positions",
]
