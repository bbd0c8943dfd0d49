"""CVSE: consensus-aware visual-semantic embedding (Wang et al., ECCV 2020), a two-tower model
whose pair scores are one GEMM.

Each image and each caption is encoded on its own into three L2-normalised ``D``-vectors
(the authors' release ``BruceW91/CVSE``, ``model_CVSE.py``):

* instance: the image's regions (``fc`` + ``l2norm``) or the caption's bi-GRU words (embedding
  dropout 0.4) pooled by self-attention guided by their mean
  (:class:`~vlret.models.matchers.cvse_layers.VisualSelfAttention`,
  :class:`~vlret.models.matchers.cvse_layers.TextSelfAttention`);
* consensus: a softmax (temperature 10) over ``C`` concepts of the instance vector against a
  concept table that a two-layer GCN computes over the concepts' co-occurrence graph
  (:class:`~vlret.models.matchers.cvse_layers.ConceptGCN`,
  :class:`~vlret.models.matchers.cvse_layers.ConsensusLevel`); the caption side mixes in the
  caption's own concept labels at ratio ``concept_label_ratio`` (0.35 F30K, 0.4 COCO);
* fused: ``l2norm(alpha * instance + (1 - alpha) * consensus)``, ``alpha = fuse_train``
  (0.85) in training mode and ``fuse_eval`` (0.85 F30K, 0.9 COCO) in evaluation mode.

:meth:`CVSE.encode_images` and :meth:`CVSE.encode_texts` return these as the rows
``[instance, consensus, fused]`` of ``(N, 3, D)`` (``token_lengths`` is 3 for every caption),
and :meth:`CVSE.score` is the release's ``i2t_sep_sim`` / ``t2i_sep_sim``:
``weight_fused * <fused, fused> + (1 - weight_fused) * <consensus, consensus>`` (0.95), one
matrix product of ``[0.95 fused, 0.05 consensus]`` with ``[fused, consensus]`` per block.

Caption concept labels are computed inside the model from the token ids: the buffer
``concept_of_id`` maps each vocabulary id to its concept (or -1), and a caption's label vector
is 1 at the concepts its real tokens ARE (surface form), so ``encode_texts(captions, lengths)``
needs nothing else. The release differs here, in two ways vlret does not follow: in training a
caption gets its IMAGE's labels (the union over the image's captions, from
``all_<ds>_concept_label.json``), and at test time the caption's WordNet lemmas are matched
(the first concept of a lemma only) and the labels completed by a transductive two-pass KNN
over the whole test gallery. vlret labels every caption, in training and evaluation, from its
own tokens (inductive, as the statistics of :mod:`~vlret.models.matchers.cvse_concepts` are
counted; WordNet's data is not installable offline), and that is what ``vlret eval`` scores;
the release's two-pass completion over a whole test split (on vlret's labels) is
:func:`~vlret.models.matchers.cvse_knn.two_pass_scores`.

The concept inputs come from a folder written by ``vlret cvse-concepts`` (``concepts``): the
processed adjacency (:func:`~vlret.models.matchers.cvse_concepts.gen_a_concept` of its
``<ds>_adj_concepts.pkl``), the concept list and the vocabulary map. The concept word vectors
``(C, concept_dim)`` (the release's GloVe-840B vectors, not available offline) are
``concept_vectors``: ``"random"`` (a fixed N(0, 1) buffer drawn from seed 0), ``"learned"``
(a parameter started there) or the path of a ``(C, concept_dim)`` ``.npy`` file (a buffer).
All of them are in the model's state dict, so a checkpoint carries them. The word embeddings
start as vlret's :class:`~vlret.models.cross_model.WordEncoder`'s (uniform ±0.1; the release
copies GloVe rows, its ``random_init`` is Xavier), whose word features are normalised with the
SCAN lineage's eps 1e-8; every CVSE layer uses the release's 1e-12.

Training: ``forward(batch)`` is the ``(B, B)`` score a single loss takes; the release's
multi-level objective (3 x triplet on fused, 5 x on instance, 1 x on consensus, 2 x KL of the
concept distributions) is the ``cvse`` training procedure (:mod:`vlret.train.procedures.cvse`).

No trained weights were published (the release links none). A release checkpoint would be
``{"epoch", "model": [8 state dicts: img_enc, txt_enc, V_self_atten_enhance,
T_self_atten_enhance, V_consensus_level_embedding, T_consensus_level_embedding, C_GCN,
Multi_feature_fusing], "best_rsum", "opt", "Eiters"}``; :meth:`CVSE.reference_names` maps
vlret's names to ``"<list index>.<release name>"`` and :meth:`CVSE.state_from_reference`
reads such a list (the Linear layers' ``embedding_k.0.*`` aliases, the unused ``fc2_2``,
``fc4``, ``embedding_2_2``, ``joint_att_emb``, ``adj_O_P`` and ``adj_O_M`` dropped), so no
importer is offered.

Config schema (``vlret.models.build_model``; defaults shown)::

    {"kind": "cvse", "embed_dim": 1024,
     "concepts": <folder from vlret cvse-concepts>,      # required
     "concept_vectors": "random",                         # random | learned | <.npy path>
     "concept_dim": 300, "gcn_hidden": None,              # None: embed_dim // 2 (512)
     "num_regions": 36, "dropout": 0.4,                   # the self-attentions' dropout
     "concept_temperature": 10.0, "concept_label_ratio": 0.35,
     "fuse_train": 0.85, "fuse_eval": 0.85, "weight_fused": 0.95,
     "image": {"in_dim": 2048},
     "text": {"vocab_size": ..., "word_dim": 300, "num_layers": 1,
              "bidirectional": True, "dropout": 0.4}}
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import torch

from ..attention import DEFAULT_MAX_ELEMENTS, check_tokens, positive_int
from ..cross_model import RegionEncoder, WordEncoder
from ..image import lengths_to_mask
from ..pair_scorer import PairScoringModel
from .cvse_build import ConceptInputs, build_parts
from .cvse_layers import ConceptGCN, ConsensusLevel, TextSelfAttention, VisualSelfAttention, l2norm

#: The valid top-level keys of a ``kind = "cvse"`` model config and their defaults.
CVSE_DEFAULTS: dict[str, Any] = {
    "kind": "cvse",
    "embed_dim": 1024,
    "concepts": None,
    "concept_vectors": "random",
    "concept_dim": 300,
    "gcn_hidden": None,
    "num_regions": 36,
    "dropout": 0.4,
    "concept_temperature": 10.0,
    "concept_label_ratio": 0.35,
    "fuse_train": 0.85,
    "fuse_eval": 0.85,
    "weight_fused": 0.95,
    "image": {},
    "text": {},
}
#: Rows of an encoded image or caption.
INSTANCE, CONSENSUS, FUSED = 0, 1, 2
ROWS = 3
#: The release's list index of each vlret sub-module in a checkpoint's ``model`` list.
_REFERENCE_PARTS = {
    "image_encoder": (0, None),
    "text_encoder": (1, None),
    "visual_attention": (2, VisualSelfAttention),
    "text_attention": (3, TextSelfAttention),
    "visual_consensus": (4, ConsensusLevel),
    "text_consensus": (5, ConsensusLevel),
    "gcn": (6, ConceptGCN),
}


class CVSELevels(NamedTuple):
    """One side's encodings: three ``(N, D)`` vectors and the ``(N, C)`` concept weights."""

    instance: torch.Tensor
    consensus: torch.Tensor
    fused: torch.Tensor
    weights: torch.Tensor

    def rows(self) -> torch.Tensor:
        """``(N, 3, D)``: ``[instance, consensus, fused]``."""
        return torch.stack((self.instance, self.consensus, self.fused), dim=1)


class CVSE(PairScoringModel):
    """CVSE (see the module docstring).

    Args:
        image_encoder: Region projection (its ``fc``; the normalisation is CVSE's).
        text_encoder: The bi-GRU word encoder.
        concepts: The concept graph, vectors and vocabulary map.
        num_regions: Regions per image.
        dropout: The self-attentions' dropout in training.
        gcn_hidden: Size of the GCN's first layer.
        concept_temperature: The concept softmax's factor.
        concept_label_ratio: The caption labels' share ``beta``.
        fuse_train: ``alpha`` in training mode.
        fuse_eval: ``alpha`` in evaluation mode.
        weight_fused: The fused vectors' share of the score.
        config: The resolved config.
    """

    image_encoder: RegionEncoder
    text_encoder: WordEncoder
    gcn: ConceptGCN
    concept_of_id: torch.Tensor

    def __init__(
        self,
        image_encoder: RegionEncoder,
        text_encoder: WordEncoder,
        *,
        concepts: ConceptInputs,
        num_regions: int = 36,
        dropout: float = 0.4,
        gcn_hidden: int = 512,
        concept_temperature: float = 10.0,
        concept_label_ratio: float = 0.35,
        fuse_train: float = 0.85,
        fuse_eval: float = 0.85,
        weight_fused: float = 0.95,
        config: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__(image_encoder, text_encoder, config=config)
        dim = image_encoder.embed_dim
        self.num_regions = num_regions
        self.visual_attention = VisualSelfAttention(dim, num_regions, dropout)
        self.text_attention = TextSelfAttention(dim, dropout)
        self.gcn = ConceptGCN(
            concepts.adjacency, concepts.vectors, gcn_hidden, dim, learned=concepts.learned
        )
        self.visual_consensus = ConsensusLevel(dim, concept_temperature)
        self.text_consensus = ConsensusLevel(dim, concept_temperature, concept_label_ratio)
        self.register_buffer("concept_of_id", concepts.concept_of_id.clone())
        self.fuse_train, self.fuse_eval = fuse_train, fuse_eval
        self.weight_fused = weight_fused

    @property
    def embed_dim(self) -> int:
        """Size ``D`` of every vector."""
        return self.image_encoder.embed_dim

    @property
    def num_concepts(self) -> int:
        """Number ``C`` of concepts."""
        return int(self.gcn.adj_all.shape[0])

    @property
    def alpha(self) -> float:
        """The instance vector's share of the fused one in the current mode."""
        return self.fuse_train if self.training else self.fuse_eval

    def _fuse(self, instance: torch.Tensor, consensus: torch.Tensor) -> torch.Tensor:
        return l2norm(self.alpha * instance + (1.0 - self.alpha) * consensus)

    def image_levels(self, features: torch.Tensor, lengths: Any = None) -> CVSELevels:
        """Encode images: ``(N, R, in_dim)`` regions -> their :class:`CVSELevels`.

        Raises:
            ValueError: Not ``(N, num_regions, in_dim)`` regions, or varying region counts.
        """
        if isinstance(features, torch.Tensor) and features.dim() == 3:
            if features.shape[1] != self.num_regions:
                raise ValueError(
                    f"features have {features.shape[1]} regions per image; CVSE's region "
                    f"BatchNorm takes num_regions={self.num_regions}"
                )
        # the region encoder's checks and projection, normalised with the release's eps
        _check_regions(self.image_encoder, features, lengths)
        regions = l2norm(self.image_encoder.fc(features.to(self.image_encoder.fc.weight.dtype)))
        instance = self.visual_attention(regions)
        consensus, weights = self.visual_consensus(instance, self.gcn())
        return CVSELevels(instance, consensus, self._fuse(instance, consensus), weights)

    def caption_labels(self, captions: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        """``(N, C)`` 0/1 labels: the concepts a caption's real tokens are (surface form)."""
        mask = lengths_to_mask(lengths.to(captions.device), captions.shape[1])
        ids = captions.clamp(0, self.concept_of_id.shape[0] - 1)
        concept = self.concept_of_id[ids].masked_fill(~mask, -1)
        labels = torch.zeros(
            captions.shape[0],
            self.num_concepts + 1,
            device=captions.device,
            dtype=self.gcn.gc1.dtype,
        )
        labels.scatter_(1, concept + 1, 1.0)  # column 0 collects the non-concepts
        return labels[:, 1:]

    def text_levels(
        self, captions: torch.Tensor, lengths: torch.Tensor, *, labels: torch.Tensor | None = None
    ) -> CVSELevels:
        """Encode captions: ``(N, L)`` ids with ``lengths`` -> their :class:`CVSELevels`.

        ``labels``: ``(N, C)`` concept labels to mix in instead of the captions' own
        (:meth:`caption_labels`; the release's completed test labels,
        :mod:`~vlret.models.matchers.cvse_knn`).
        """
        words = self.text_encoder(captions, lengths)
        lengths = torch.as_tensor(lengths).to(words.device)
        mask = lengths_to_mask(lengths, words.shape[1])
        instance = self.text_attention(words, mask)
        if labels is None:
            labels = self.caption_labels(captions.to(words.device), lengths)
        elif labels.shape != (captions.shape[0], self.num_concepts):
            raise ValueError(
                f"labels: shape {tuple(labels.shape)}, expected ({captions.shape[0]}, "
                f"{self.num_concepts})"
            )
        consensus, weights = self.text_consensus(instance, self.gcn(), labels.to(words.dtype))
        return CVSELevels(instance, consensus, self._fuse(instance, consensus), weights)

    def encode_images(self, features: torch.Tensor, lengths: Any = None) -> torch.Tensor:
        """``(N, 3, D)``: each image's ``[instance, consensus, fused]`` vectors."""
        return self.image_levels(features, lengths).rows()

    def encode_texts(self, captions: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        """``(N, 3, D)``: each caption's ``[instance, consensus, fused]`` vectors."""
        return self.text_levels(captions, lengths).rows()

    def token_lengths(self, lengths: torch.Tensor) -> torch.Tensor:
        """Three rows per caption, whatever its length (:class:`PairScorer`)."""
        return torch.full_like(torch.as_tensor(lengths), ROWS)

    def score(
        self,
        regions: torch.Tensor,
        words: torch.Tensor,
        word_lengths: torch.Tensor,
        *,
        max_elements: int | None = None,
    ) -> torch.Tensor:
        """``weight_fused * <fused, fused> + (1 - weight_fused) * <consensus, consensus>``.

        Args:
            regions: ``(n_img, 3, D)`` from :meth:`encode_images`.
            words: ``(n_cap, 3, D)`` from :meth:`encode_texts`.
            word_lengths: ``(n_cap,)``, 3 each.
            max_elements: The most scores one product writes (default 2**24): captions are
                taken in blocks of ``max_elements // n_img``.

        Returns:
            The ``(n_img, n_cap)`` scores.

        Raises:
            ValueError: Inputs that are not encoded CVSE rows.
        """
        lengths = check_tokens(regions, words, word_lengths)
        if regions.shape[1] != ROWS or words.shape[1] != ROWS or bool((lengths != ROWS).any()):
            raise ValueError(
                f"CVSE scores rows [instance, consensus, fused]: regions and words need 3 rows "
                f"each, got {regions.shape[1]} and {words.shape[1]}"
            )
        w = self.weight_fused
        img = torch.cat((w * regions[:, FUSED], (1.0 - w) * regions[:, CONSENSUS]), dim=1)
        txt = torch.cat((words[:, FUSED], words[:, CONSENSUS]), dim=1)
        limit = (
            DEFAULT_MAX_ELEMENTS
            if max_elements is None
            else positive_int(max_elements, "max_elements")
        )
        step = max(1, limit // max(1, img.shape[0]))
        if step >= txt.shape[0]:
            return img @ txt.t()
        return torch.cat([img @ txt[s : s + step].t() for s in range(0, txt.shape[0], step)], 1)

    def reference_names(self) -> dict[str, str]:
        """Own state-dict name -> ``"<index>.<name>"`` in the release's list of 8 state dicts.

        ``gcn.vectors`` (the release reads its GloVe vectors from a file) and
        ``concept_of_id`` (vlret's vocabulary map) have none.
        """
        names: dict[str, str] = {}
        for own in self.state_dict():
            part, _, rest = own.partition(".")
            if part not in _REFERENCE_PARTS:
                continue
            index, module = _REFERENCE_PARTS[part]
            if module is None:  # the encoders: fc, embed, rnn keep the release's names
                names[own] = f"{index}.{rest}"
            elif rest in module.reference_names():
                names[own] = f"{index}.{module.reference_names()[rest]}"
        return names

    def state_from_reference(self, parts: Sequence[Mapping[str, torch.Tensor]]) -> dict[str, Any]:
        """This model's state dict from a release checkpoint's ``model`` list.

        Args:
            parts: The 8 state dicts.

        Returns:
            A state dict for ``load_state_dict`` (``gcn.vectors`` and ``concept_of_id`` kept
            from this model).

        Raises:
            ValueError: Not 8 parts, a missing entry or a shape that differs (named).
        """
        if len(parts) != 8:
            raise ValueError(
                f"a CVSE checkpoint's model list holds 8 state dicts, got {len(parts)}"
            )
        own = self.state_dict()
        out = dict(own)
        for name, ref in self.reference_names().items():
            index, _, key = ref.partition(".")
            part = parts[int(index)]
            if key not in part:
                raise ValueError(f"model[{index}] lacks {key!r} (for {name})")
            value = torch.as_tensor(part[key])
            if value.shape != own[name].shape:
                raise ValueError(
                    f"model[{index}].{key}: shape {tuple(value.shape)}, expected "
                    f"{tuple(own[name].shape)} (for {name})"
                )
            out[name] = value.to(own[name].dtype)
        return out


def _check_regions(encoder: RegionEncoder, features: Any, lengths: Any) -> None:
    """The region encoder's input checks (its forward would normalise with eps 1e-8)."""
    if not isinstance(features, torch.Tensor) or features.dim() != 3:
        got = tuple(features.shape) if isinstance(features, torch.Tensor) else type(features)
        raise ValueError(f"features must be region features (N, R, {encoder.in_dim}), got {got}")
    if features.size(-1) != encoder.in_dim:
        raise ValueError(
            f"features have last dimension {features.size(-1)}; expected in_dim={encoder.in_dim}"
        )
    if lengths is not None and bool((torch.as_tensor(lengths) != features.size(1)).any()):
        raise ValueError("lengths: CVSE takes a fixed number of regions per image")


def build_cvse_model(top: Mapping[str, Any], *, vocab_size: int | None = None) -> PairScoringModel:
    """Build the model of a ``cvse`` config (top level merged over :data:`CVSE_DEFAULTS`).

    Args:
        top: The config.
        vocab_size: ``len(vocabulary)``; may instead be given as ``text.vocab_size``.

    Returns:
        The :class:`CVSE` model; ``model.config`` holds the resolved config.

    Raises:
        ValueError: An unknown key, an invalid value or unreadable concept files (the
            message names the key).
        FileNotFoundError: The concept folder or a file of it is missing.
    """
    cfg = copy.deepcopy(dict(top))
    image, text, concepts, options = build_parts(cfg, vocab_size=vocab_size)
    return CVSE(image, text, concepts=concepts, config=cfg, **options)


__all__ = [
    "CONSENSUS",
    "CVSE",
    "CVSE_DEFAULTS",
    "FUSED",
    "INSTANCE",
    "CVSELevels",
    "build_cvse_model",
]
