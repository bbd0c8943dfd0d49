"""DIME (Qu, Liu, Wu, Gao, Nie, SIGIR 2021): dynamic modality interaction over a frozen BERT.

Read from the authors' release (LgQu/DIME: ``models/VisNet.py`` ``EncoderImagePrecomp``,
``models/TextNet.py`` ``EncoderText``, ``models/InteractionModule.py`` and the cells, see
:mod:`~vlret.models.matchers.dime_interaction`).

* Image side (:class:`DIMEImageEncoder`): ``fc`` (2048 -> D, Xavier-uniform, zero bias); each
  region ``F.normalize``'d; the global vector is the mean of the projected regions, passed
  through ``bn`` (BatchNorm1d) for ``direction = "t2i"`` only, then normalised. ``bn`` exists
  in both directions (the release saves it); for i2t its parameters are frozen (unused).
* Text side (:class:`DIMETextEncoder`): a FROZEN local Hugging Face BERT (no parameter trains;
  its dropout is active in training mode, as the release's ``train_start`` leaves it) over the
  caption cut to ``max_words`` tokens (the first ``max_words - 2`` word pieces between
  ``[CLS]`` and ``[SEP]``) and zero-padded to exactly ``max_words``; from its last layer ``H``:
  ``fc`` (H -> D) and three 1-D convolutions ``convs1`` (K = 1, 2, 3 tokens, padded with one
  zero row at the end for K = 2, one at each end for K = 3, ReLU); word vectors
  ``normalize(mapping(concat_K conv_K) + fc(H))``, sentence vector ``normalize(mapping(concat_K
  maxpool conv_K) + mean fc(H))``, both over ALL ``max_words`` positions, padding included
  (the release's: the padded positions' BERT states are not zero).
* The interaction and score: :class:`~vlret.models.matchers.dime_interaction.DIMEInteraction`.

**Rows of the encoded tensors** (the :class:`~vlret.models.pair_scorer.PairScorer` contract):
``encode_images`` gives ``(N, 1 + R, D)``: row 0 the global image vector, rows 1..R the
regions. ``encode_texts`` gives ``(N, 1 + max_words, D)``: row 0 the sentence vector, rows
``1..max_words`` the token positions; ``token_lengths(lengths)`` is ``1 + min(lengths,
max_words)`` for i2t (the sentence row and the real tokens, CMRC's context; rows past it are
never read, so evaluation may drop them) and ``1 + max_words`` for every caption for t2i (whose
scores read every padded position).

**Path regulariser:** ``L_path`` (trade-off 0.5: the squared difference of the mapped path
probabilities' cosines and frozen BERT's mean-pooled caption vectors' cosines) is the
``"dime"`` training procedure's (:mod:`vlret.train.procedures.dime`), for a model with
``path_hidden`` set (128 in the release; its ``path_mapping`` trains only there). **Not
reproduced:** the release's extra random negatives (``--extra_stc 1`` for i2t, ``--extra_img
1`` for t2i); vlret trains DIME on the batch's own pairs.

Config schema (``build_model``; defaults shown; ``text.path`` is required)::

    {"kind": "dime", "embed_dim": 256, "direction": "i2t",   # i2t | t2i
     "lambda_softmax": 4.0,                                   # release README: 4 i2t, 9 t2i
     "max_words": 32, "router_hidden": 512, "imrc_hidden": 512, "imrc_heads": 16,
     "path_hidden": None,                                     # 128: the path regulariser's
     "image": {"in_dim": 2048}, "text": {"kind": "bert", "path": "<local BERT folder>"}}
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ..attention import choice, positive_float, positive_int
from ..cross_model import RegionEncoder
from ..image import lengths_to_mask
from ..pair_scorer import PairScoringModel
from ..sgraf_ops import batch_norm
from ..text import check_captions, check_local_dir, import_transformers
from .dime_interaction import DIME_DIRECTIONS, NORMALIZE_EPS, DIMEInteraction

#: The valid top-level keys of a ``kind = "dime"`` model config and their defaults (the
#: release's argparse defaults: embed_size 256, lambda_softmax_CMRC 4, max_words 32,
#: hid_router 512, hid_IMRC 512, num_head_IMRC 16; path_hidden 128 where the path
#: regulariser trains).
DIME_DEFAULTS: dict[str, Any] = {
    "kind": "dime",
    "embed_dim": 256,
    "direction": "i2t",
    "lambda_softmax": 4.0,
    "max_words": 32,
    "router_hidden": 512,
    "imrc_hidden": 512,
    "imrc_heads": 16,
    "path_hidden": None,
    "image": {},
    "text": {},
}
DIME_IMAGE_DEFAULTS: dict[str, Any] = {"in_dim": 2048}
DIME_TEXT_DEFAULTS: dict[str, Any] = {"kind": "bert", "path": None}
#: The convolution widths of the text side's 1-D CNN.
KERNELS = (1, 2, 3)


class DIMEImageEncoder(RegionEncoder):
    """Regions ``(N, R, in_dim)`` -> ``(N, 1 + R, D)``: the global vector, then the regions.

    Args:
        in_dim: Feature size of a region.
        embed_dim: ``D``.
        direction: ``"t2i"`` passes the global vector through ``bn``.
    """

    def __init__(self, in_dim: int = 2048, embed_dim: int = 256, *, direction: str = "i2t"):
        super().__init__(in_dim, embed_dim)
        self.direction = choice(direction, "direction", DIME_DIRECTIONS)
        self.bn = nn.BatchNorm1d(embed_dim)
        if self.direction == "i2t":  # saved by the release, never used in i2t
            self.bn.requires_grad_(False)

    def forward(self, features: torch.Tensor, lengths: torch.Tensor | None = None) -> torch.Tensor:
        """Encode a batch of images (the same checks as :class:`RegionEncoder`)."""
        if not isinstance(features, torch.Tensor) or features.dim() != 3:
            got = tuple(features.shape) if isinstance(features, torch.Tensor) else type(features)
            raise ValueError(f"features must be region features (N, R, {self.in_dim}), got {got}")
        if features.size(-1) != self.in_dim:
            raise ValueError(
                f"features have last dimension {features.size(-1)}; expected in_dim={self.in_dim}"
            )
        if lengths is not None and bool((torch.as_tensor(lengths) != features.size(1)).any()):
            raise ValueError("lengths: DIME takes a fixed number of regions per image")
        x = self.fc(features.to(self.fc.weight.dtype))
        img = x.mean(dim=1)
        if self.direction == "t2i":
            img = batch_norm(img, self.bn)  # no buffer saved for backward (pair_bank)
        img = F.normalize(img, dim=-1, eps=NORMALIZE_EPS)
        return torch.cat([img[:, None], F.normalize(x, dim=-1, eps=NORMALIZE_EPS)], dim=1)


class DIMETextEncoder(nn.Module):
    """Token ids -> ``(N, 1 + max_words, D)``: the sentence vector, then the token vectors.

    Args:
        path: Local folder of a ``save_pretrained`` BERT (its tokenizer encodes the captions).
        embed_dim: ``D``.
        max_words: Tokens per caption, ``[CLS]`` and ``[SEP]`` included (32).

    Raises:
        FileNotFoundError: ``path`` is not a folder.
        ImportError: ``transformers`` is not installed.
    """

    def __init__(self, path: str | Path, *, embed_dim: int = 256, max_words: int = 32) -> None:
        super().__init__()
        transformers = import_transformers("DIME's text side")
        self.path = check_local_dir(path, "a BERT model")
        self.bert = transformers.BertModel.from_pretrained(
            str(self.path), local_files_only=True, add_pooling_layer=False
        ).float()
        self.bert.requires_grad_(False)  # frozen, as the release's freeze_layers
        self.embed_dim, self.max_words = embed_dim, max_words
        hidden = self.bert.config.hidden_size
        if max_words > self.bert.config.max_position_embeddings:
            raise ValueError(
                f"max_words: {max_words} exceeds the BERT's max_position_embeddings "
                f"{self.bert.config.max_position_embeddings}"
            )
        self.fc = nn.Linear(hidden, embed_dim)
        self.convs1 = nn.ModuleList(nn.Conv2d(1, embed_dim, (k, hidden)) for k in KERNELS)
        self.mapping = nn.Linear(len(KERNELS) * embed_dim, embed_dim)

    def token_ids(
        self, captions: torch.Tensor, lengths: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The release's ``(N, max_words)`` ids and real-token counts: a caption longer than
        ``max_words`` keeps its first ``max_words - 1`` ids and its last one (``[SEP]``);
        padding is id 0 (``[PAD]`` in BERT's vocabularies)."""
        captions, lengths = check_captions(captions, lengths)
        n, width, m = captions.shape[0], captions.shape[1], self.max_words
        ids = captions.new_zeros(n, m)
        keep = min(width, m)
        ids[:, :keep] = captions[:, :keep]
        lengths = lengths.to(captions.device)
        long = lengths > m
        if bool(long.any()):
            ids[long, m - 1] = captions[long, lengths[long] - 1]
        lengths = lengths.clamp(max=m)
        ids = ids.masked_fill(~lengths_to_mask(lengths, m), 0)
        return ids, lengths

    def forward(self, captions: torch.Tensor, lengths: torch.Tensor | None = None) -> torch.Tensor:
        """Encode a padded batch of BERT token ids (``[CLS] ... [SEP]``)."""
        return self.encode(captions, lengths)[0]

    def encode(
        self, captions: torch.Tensor, lengths: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The encoded captions and the path regulariser's label vectors: BERT's last layer
        averaged over all ``max_words`` positions, detached and L2-normalised
        (``EncoderText.forward``'s ``bert_emb``)."""
        captions, lengths = check_captions(captions, lengths)
        ids, lengths = self.token_ids(captions, lengths)
        mask = lengths_to_mask(lengths, self.max_words)
        hidden = self.bert(
            input_ids=ids, attention_mask=mask.long(), token_type_ids=torch.zeros_like(ids)
        ).last_hidden_state.to(self.fc.weight.dtype)
        x = hidden.unsqueeze(1)  # (N, 1, max_words, H)
        convs = [
            torch.relu(conv(F.pad(x, (0, 0, (k - 1) // 2, k // 2)))).squeeze(3)
            for k, conv in zip(KERNELS, self.convs1, strict=True)
        ]  # (N, D, max_words) each
        x_emb = self.fc(hidden)
        words = self.mapping(torch.cat(convs, dim=1).transpose(1, 2)) + x_emb
        pooled = torch.cat([c.amax(dim=2) for c in convs], dim=1)
        sentence = self.mapping(pooled) + x_emb.mean(dim=1)
        out = torch.cat([sentence[:, None], words], dim=1)
        label = F.normalize(hidden.detach().mean(dim=1), dim=-1, eps=NORMALIZE_EPS)
        return F.normalize(out, dim=-1, eps=NORMALIZE_EPS), label

    def extra_repr(self) -> str:
        return f"path={str(self.path)!r}, max_words={self.max_words}"


class DIME(PairScoringModel):
    """DIME as a :class:`~vlret.models.pair_scorer.PairScoringModel` (see the module docstring
    for the rows of the encoded tensors).

    Args:
        image_encoder: :class:`DIMEImageEncoder`.
        text_encoder: :class:`DIMETextEncoder`.
        interaction: :class:`~vlret.models.matchers.dime_interaction.DIMEInteraction`.
        config: The resolved config the model was built from.
    """

    image_encoder: DIMEImageEncoder
    text_encoder: DIMETextEncoder

    def __init__(
        self,
        image_encoder: DIMEImageEncoder,
        text_encoder: DIMETextEncoder,
        interaction: DIMEInteraction,
        *,
        config: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__(image_encoder, text_encoder, config=config)
        self.interaction = interaction

    @property
    def direction(self) -> str:
        """``"i2t"`` or ``"t2i"``."""
        return self.interaction.direction

    def encode_images(
        self, features: torch.Tensor, lengths: torch.Tensor | None = None
    ) -> torch.Tensor:
        """``(N, R, in_dim)`` -> ``(N, 1 + R, D)`` (row 0: the global image vector)."""
        return self.image_encoder(features, lengths)

    def encode_texts(self, captions: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        """``(N, L)`` BERT ids -> ``(N, 1 + max_words, D)`` (row 0: the sentence vector)."""
        return self.text_encoder(captions, lengths)

    def token_lengths(self, lengths: torch.Tensor) -> torch.Tensor:
        """Rows a caption needs: ``1 + min(lengths, max_words)`` (i2t), ``1 + max_words`` (t2i)."""
        lengths = torch.as_tensor(lengths, dtype=torch.long)
        m = self.text_encoder.max_words
        if self.direction == "t2i":
            return torch.full_like(lengths, 1 + m)
        return 1 + lengths.clamp(max=m)

    def score(
        self,
        regions: torch.Tensor,
        words: torch.Tensor,
        word_lengths: torch.Tensor,
        *,
        max_elements: int | None = None,
        paths_out: list[torch.Tensor] | None = None,
    ) -> torch.Tensor:
        """The ``(n_img, n_cap)`` scores (see :meth:`DIMEInteraction.scores`).

        Args:
            regions: ``(n_img, 1 + R, D)`` from :meth:`encode_images`.
            words: ``(n_cap, 1 + L, D)`` from :meth:`encode_texts`.
            word_lengths: :meth:`token_lengths` of the captions.
            max_elements: Bound on a block's largest intermediate.
            paths_out: Where given, the ``(n_img, n_cap, 36)`` path probabilities are
                appended (the ``"dime"`` procedure's path loss).

        Raises:
            ValueError: The rows do not fit the layout above (a t2i caption without all
                ``max_words`` positions, a width or length out of range).
        """
        if regions.dim() != 3 or words.dim() != 3 or regions.shape[1] < 2:
            raise ValueError(
                "regions and words must be DIME's encodings (N, 1 + R, D) and (N, 1 + L, D), "
                f"got {tuple(regions.shape)} and {tuple(words.shape)}"
            )
        rows = torch.as_tensor(word_lengths, dtype=torch.long, device=words.device)
        if rows.shape != (words.shape[0],) or bool(
            (rows < 2).any() | (rows > words.shape[1]).any()
        ):
            raise ValueError(
                f"word_lengths: expected {words.shape[0]} values in 2..{words.shape[1]} "
                "(token_lengths: the sentence row plus the tokens)"
            )
        full = 1 + self.text_encoder.max_words
        if self.direction == "t2i" and (words.shape[1] != full or bool((rows != full).any())):
            raise ValueError(
                f"word_lengths: a t2i DIME reads all {full} rows of each caption (every padded "
                "position), got fewer; encode with encode_texts and token_lengths"
            )
        dtype = torch.promote_types(regions.dtype, words.dtype)
        regions, words = regions.to(dtype), words.to(dtype)
        return self.interaction.scores(
            regions[:, 0],
            regions[:, 1:],
            words[:, 0],
            words[:, 1:],
            rows - 1,
            max_elements=max_elements,
            paths_out=paths_out,
        )


def _section(name: str, given: Any, defaults: dict[str, Any]) -> dict[str, Any]:
    if not isinstance(given, Mapping):
        raise ValueError(f"{name}: must be a dict, got {type(given).__name__}")
    unknown = sorted(set(given) - set(defaults))
    if unknown:
        raise ValueError(
            f"{name}.{unknown[0]}: unknown key for a dime model; valid keys: {sorted(defaults)}"
        )
    return {**copy.deepcopy(defaults), **copy.deepcopy(dict(given))}


def build_dime_model(top: Mapping[str, Any], *, vocab_size: int | None = None) -> DIME:
    """Build the model of a ``dime`` config (its top level merged over :data:`DIME_DEFAULTS`).

    Args:
        top: The config.
        vocab_size: Unused (the BERT folder fixes the vocabulary); accepted for the
            ``build_model`` contract.

    Returns:
        The :class:`DIME` model; ``model.config`` holds the resolved config.

    Raises:
        ValueError: An unknown key or an invalid value (the message names the key).
        FileNotFoundError: ``text.path`` is not a folder.
    """
    del vocab_size  # BERT's own vocabulary
    cfg = copy.deepcopy(dict(top))
    unknown = sorted(set(cfg) - set(DIME_DEFAULTS))
    if unknown:
        raise ValueError(
            f"{unknown[0]}: unknown key for a dime model; valid keys: {sorted(DIME_DEFAULTS)}"
        )
    cfg = {**copy.deepcopy(DIME_DEFAULTS), **cfg}
    image_cfg = _section("image", cfg["image"], DIME_IMAGE_DEFAULTS)
    text_cfg = _section("text", cfg["text"], DIME_TEXT_DEFAULTS)
    if text_cfg["kind"] != "bert":
        raise ValueError(
            f"text.kind: DIME's text side is a BERT ('bert'), got {text_cfg['kind']!r}"
        )
    if not isinstance(text_cfg["path"], (str, Path)) or not str(text_cfg["path"]):
        raise ValueError("text.path: DIME needs a local BERT folder (save_pretrained output)")
    text_cfg["path"] = str(text_cfg["path"])
    dim = positive_int(cfg["embed_dim"], "embed_dim")
    heads = positive_int(cfg["imrc_heads"], "imrc_heads")
    if dim % heads:
        raise ValueError(f"imrc_heads: {heads} does not divide embed_dim {dim}")
    direction = choice(cfg["direction"], "direction", DIME_DIRECTIONS)
    max_words = positive_int(cfg["max_words"], "max_words")
    path_hidden = cfg["path_hidden"]
    if max_words < 2:
        raise ValueError(f"max_words: must hold [CLS] and [SEP] (>= 2), got {max_words}")
    interaction = DIMEInteraction(
        dim,
        direction=direction,
        lambda_softmax=positive_float(cfg["lambda_softmax"], "lambda_softmax"),
        router_hidden=positive_int(cfg["router_hidden"], "router_hidden"),
        imrc_hidden=positive_int(cfg["imrc_hidden"], "imrc_hidden"),
        imrc_heads=heads,
        path_hidden=None if path_hidden is None else positive_int(path_hidden, "path_hidden"),
    )
    image = DIMEImageEncoder(
        positive_int(image_cfg["in_dim"], "image.in_dim"), dim, direction=direction
    )
    text = DIMETextEncoder(text_cfg["path"], embed_dim=dim, max_words=max_words)
    cfg["image"], cfg["text"] = image_cfg, text_cfg
    return DIME(image, text, interaction, config=cfg)


__all__ = [
    "DIME",
    "DIME_DEFAULTS",
    "DIME_IMAGE_DEFAULTS",
    "DIME_TEXT_DEFAULTS",
    "DIMEImageEncoder",
    "DIMETextEncoder",
    "build_dime_model",
]
