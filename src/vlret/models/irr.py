"""IRRA's implicit relation reasoning (IRR; Jiang & Ye, CVPR 2023, Sec. 3.2): a cross-modal
encoder that reads a masked caption against the image's tokens and predicts the masked words.

``[model] irr = true`` (a ``kind = "clip"`` model; or a table of the options below) adds
:class:`ImplicitRelationReasoning` to the model as ``model.irr``; the loss part ``mlm``
(``[loss] name = "sdm+mlm+id"``, :mod:`vlret.losses.mlm`) trains it, through the ``"irr"``
training procedure (:mod:`vlret.train.procedures.irr`), which masks each batch's captions with
:func:`mask_caption_tokens` and runs :func:`irr_forward`. Readings of IRRA's code
(``model/build.py``, ``datasets/bases.py``, ``utils/options.py``):

* **Inputs.** The image tokens are every output token of CLIP's vision tower after its last
  layer norm and ``visual_projection`` (IRRA's ``image_feats``, CLS included); the text tokens
  are every output token of the text tower run on the *masked* caption, after its final layer
  norm and ``text_projection`` (IRRA's ``encode_text(mlm_ids)``). Both are ``width`` wide:
  CLIP's projection width (512 for ViT-B/16), before any added ``proj_dim`` layer.
* **Encoder.** One multi-head cross-attention (queries: the layer-normed text tokens; keys and
  values: the layer-normed image tokens; ``width // 64`` heads) *without* a residual, then
  ``depth`` (4) pre-norm transformer blocks of CLIP's form (attention, then a ``4 x width``
  MLP with QuickGELU, each with its residual; no attention mask), then a layer norm.
* **Head.** ``Linear(width, width)``, QuickGELU, layer norm, ``Linear(width, vocab_size)``:
  a score for every token id at every position.
* **Initialisation** (IRRA's): with ``scale = width ** -0.5``, the attention input projections
  ``N(0, scale^2)``, the attention output and MLP output projections
  ``N(0, (scale * (2 * depth) ** -0.5)^2)``, the MLP input and the head's dense layer
  ``N(0, (2 * width) ** -1)``, the head's output layer like the output projections; biases and
  layer norms at torch's defaults.
* **Masking** (:func:`mask_caption_tokens`): BERT's rule as IRRA's dataset applies it to each
  caption token independently: with probability 0.15 a token is chosen (its label is the
  original id); a chosen token becomes ``[MASK]`` with probability 0.8, a uniformly random id
  in ``[1, mask_token_id)`` with probability 0.1, and stays itself with probability 0.1.
  Never chosen: padding, the start and end tokens, ids ``0`` and ``>= mask_token_id`` (IRRA's
  ``0 < token < 49405``). A caption of which no token was chosen gets its first eligible
  token masked (IRRA: position 1, the token after the start token).
* **The [MASK] id.** IRRA's tokenizer drops the last BPE merge and puts ``<|mask|>`` at its
  id (49405 of 49408), before the start and end ids: ``mask_token_id`` defaults to
  ``vocab_size - 3`` and must lie below the start and end ids (so a random replacement is
  never one of them). A Hugging Face CLIP tokenizer has no mask token; id 49405 is then
  the merge IRRA gave up, as in IRRA.

Differences from IRRA: the masking draws come from a generator seeded per step (the
procedure's), not from Python's global ``random`` in the data-loader workers; the weights stay
float32 (IRRA converts the whole model, this encoder included, to float16:
``train.amp`` chooses the arithmetic here).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any, cast

import torch
from torch import nn

#: Label of a position that is not predicted (``torch.nn.functional.cross_entropy``'s default
#: ``ignore_index``).
IGNORE_INDEX = -100
#: IRRA's masking probabilities: a token is chosen with ``MASK_PROB``; a chosen one becomes
#: ``[MASK]`` with ``MASK_SHARE``, a random id with ``RANDOM_SHARE``, else stays itself.
MASK_PROB = 0.15
MASK_SHARE = 0.8
RANDOM_SHARE = 0.1


@dataclass(frozen=True, kw_only=True)
class IRROptions:
    """``[model] irr``'s table (``irr = true``: these defaults, IRRA's ``utils/options.py``).

    Attributes:
        depth: Transformer blocks after the cross-attention (IRRA's ``cmt_depth``, 4).
        heads: Attention heads; 0 means ``width // 64`` (IRRA's, 8 for ViT-B/16's 512).
        mask_token_id: The ``[MASK]`` id; 0 means ``vocab_size - 3`` (IRRA's ``<|mask|>``).
    """

    depth: int = 4
    heads: int = 0
    mask_token_id: int = 0

    @classmethod
    def parse(cls, value: Any) -> IRROptions | None:
        """``model.irr`` as options: ``false`` / None -> None, ``true`` -> the defaults, a
        table -> those keys over the defaults.

        Raises:
            ValueError: Another type, an unknown key or a value that is not a non-negative
                int (``depth`` at least 1), named ``model.irr.<key>``.
        """
        if value is None or value is False:
            return None
        if value is True:
            return cls()
        if not isinstance(value, Mapping):
            raise ValueError(f"model.irr: expected true, false or a table, got {value!r}")
        known = [f.name for f in fields(cls)]
        unknown = sorted(set(value) - set(known))
        if unknown:
            raise ValueError(f"model.irr: unknown key {unknown[0]!r}; valid keys: {known}")
        for key, v in value.items():
            low = 1 if key == "depth" else 0
            if isinstance(v, bool) or not isinstance(v, int) or v < low:
                raise ValueError(f"model.irr.{key}: expected an int >= {low}, got {v!r}")
        return cls(**dict(value))

    def as_config(self) -> dict[str, int]:
        """The table ``model.config["irr"]`` keeps (what rebuilds the model)."""
        return {f.name: getattr(self, f.name) for f in fields(self)}


class QuickGELU(nn.Module):
    """``x * sigmoid(1.702 x)``, CLIP's activation (IRRA's encoder and head use it)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.sigmoid(1.702 * x)


class _Block(nn.Module):
    """CLIP's pre-norm residual block: ``x + attn(ln_1(x))``, then ``x + mlp(ln_2(x))``."""

    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(width)
        self.attn = nn.MultiheadAttention(width, heads, batch_first=True)
        self.ln_2 = nn.LayerNorm(width)
        self.c_fc = nn.Linear(width, 4 * width)
        self.act = QuickGELU()
        self.c_proj = nn.Linear(4 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.ln_1(x)
        x = x + self.attn(h, h, h, need_weights=False)[0]
        return x + self.c_proj(self.act(self.c_fc(self.ln_2(x))))


class ImplicitRelationReasoning(nn.Module):
    """IRRA's cross-modal encoder and MLM head (module docstring).

    Args:
        width: Width of the token features (CLIP's projection width).
        vocab_size: Token ids the head scores (the text tower's vocabulary).
        depth: Transformer blocks after the cross-attention.
        heads: Attention heads (``width`` must be a multiple); 0 means ``width // 64``.
        mask_token_id: The ``[MASK]`` id, below ``special_ids``.
        special_ids: Ids never chosen for masking besides padding (the start and end ids).

    Raises:
        ValueError: A width the heads do not divide, or a ``mask_token_id`` outside
            ``[1, vocab_size)`` or not below every special id.
    """

    def __init__(
        self,
        *,
        width: int,
        vocab_size: int,
        depth: int = 4,
        heads: int = 0,
        mask_token_id: int = 0,
        special_ids: tuple[int, ...] = (),
    ) -> None:
        super().__init__()
        heads = heads or max(width // 64, 1)
        if width % heads:
            raise ValueError(f"model.irr.heads: {heads} heads do not divide the width {width}")
        mask_token_id = mask_token_id or vocab_size - 3
        if not 1 <= mask_token_id < vocab_size:
            raise ValueError(
                f"model.irr.mask_token_id: {mask_token_id} is outside the vocabulary "
                f"[1, {vocab_size})"
            )
        if any(s <= mask_token_id for s in special_ids):
            raise ValueError(
                f"model.irr.mask_token_id: {mask_token_id} must lie below the start and end "
                f"ids {sorted(special_ids)} (IRRA's layout: random replacements are drawn "
                "below [MASK])"
            )
        self.width, self.vocab_size, self.depth, self.heads = width, vocab_size, depth, heads
        self.mask_token_id = int(mask_token_id)
        self.special_ids = tuple(int(s) for s in special_ids)
        self.cross_attn = nn.MultiheadAttention(width, heads, batch_first=True)
        self.ln_pre_t = nn.LayerNorm(width)
        self.ln_pre_i = nn.LayerNorm(width)
        self.blocks = nn.ModuleList(_Block(width, heads) for _ in range(depth))
        self.ln_post = nn.LayerNorm(width)
        self.mlm_head = nn.Sequential(
            nn.Linear(width, width), QuickGELU(), nn.LayerNorm(width), nn.Linear(width, vocab_size)
        )
        self._init_weights()

    def _init_weights(self) -> None:
        scale = self.width**-0.5
        attn_std, proj_std = scale, scale * (2 * self.depth) ** -0.5
        fc_std = (2 * self.width) ** -0.5
        blocks = [cast(_Block, b) for b in self.blocks]
        for attn in (self.cross_attn, *(b.attn for b in blocks)):
            nn.init.normal_(attn.in_proj_weight, std=attn_std)
            nn.init.normal_(attn.out_proj.weight, std=proj_std)
        for block in blocks:
            nn.init.normal_(block.c_fc.weight, std=fc_std)
            nn.init.normal_(block.c_proj.weight, std=proj_std)
        dense, fc = cast(nn.Linear, self.mlm_head[0]), cast(nn.Linear, self.mlm_head[3])
        nn.init.normal_(dense.weight, std=fc_std)
        nn.init.normal_(fc.weight, std=proj_std)

    def forward(self, text_tokens: torch.Tensor, image_tokens: torch.Tensor) -> torch.Tensor:
        """The ``(B, L, vocab_size)`` scores of every position of the masked captions.

        Args:
            text_tokens: ``(B, L, width)`` token features of the masked captions.
            image_tokens: ``(B, N, width)`` token features of their images.

        Raises:
            ValueError: Shapes that are not ``(B, *, width)`` of one batch.
        """
        for name, t in (("text_tokens", text_tokens), ("image_tokens", image_tokens)):
            if t.dim() != 3 or t.shape[-1] != self.width:
                raise ValueError(f"{name} must be (B, n, {self.width}), got {tuple(t.shape)}")
        if text_tokens.shape[0] != image_tokens.shape[0]:
            raise ValueError(
                f"text_tokens and image_tokens must have one batch, got {text_tokens.shape[0]} "
                f"and {image_tokens.shape[0]}"
            )
        image = self.ln_pre_i(image_tokens)
        x = self.cross_attn(self.ln_pre_t(text_tokens), image, image, need_weights=False)[0]
        for block in self.blocks:
            x = block(x)
        return self.mlm_head(self.ln_post(x))


def mask_caption_tokens(
    captions: torch.Tensor,
    lengths: torch.Tensor,
    *,
    mask_token_id: int,
    special_ids: tuple[int, ...] = (),
    generator: torch.Generator | None = None,
    prob: float = MASK_PROB,
    mask_share: float = MASK_SHARE,
    random_share: float = RANDOM_SHARE,
) -> tuple[torch.Tensor, torch.Tensor]:
    """IRRA's masking of a padded batch of token ids (module docstring, "Masking").

    Args:
        captions: ``(B, L)`` long token ids.
        lengths: ``(B,)`` valid tokens per caption (the rest is padding).
        mask_token_id: The ``[MASK]`` id; only ids in ``[1, mask_token_id)`` are chosen, and
            random replacements are drawn there.
        special_ids: Ids never chosen (the start and end tokens).
        generator: The draws' generator (on the captions' device); None: torch's global one.
        prob: Probability that a token is chosen.
        mask_share: Probability that a chosen token becomes ``[MASK]``.
        random_share: Probability that a chosen token becomes a random id.

    Returns:
        ``(masked, labels)``: the ids with the replacements, and ``(B, L)`` labels holding the
        original id at each chosen position and :data:`IGNORE_INDEX` elsewhere.

    Raises:
        ValueError: Shapes or probabilities out of range.
    """
    if captions.dim() != 2 or lengths.shape != (captions.shape[0],):
        raise ValueError(
            f"captions must be (B, L) and lengths (B,), got {tuple(captions.shape)} and "
            f"{tuple(lengths.shape)}"
        )
    if not (0 < prob <= 1 and mask_share >= 0 and random_share >= 0):
        raise ValueError(f"prob must be in (0, 1] and the shares >= 0, got {prob}")
    if mask_share + random_share > 1:
        raise ValueError(f"mask_share + random_share must be <= 1, got {mask_share + random_share}")
    ids = captions.long()
    positions = torch.arange(ids.shape[1], device=ids.device)
    eligible = (positions < lengths.to(ids.device).unsqueeze(1)) & (ids > 0)
    eligible &= ids < mask_token_id
    for special in special_ids:
        eligible &= ids != special
    u = torch.rand(ids.shape, generator=generator, device=ids.device, dtype=torch.float64)
    chosen = eligible & (u < prob)
    v = u / prob  # uniform on [0, 1) given chosen, as IRRA's prob /= 0.15
    to_mask = chosen & (v < mask_share)
    to_random = chosen & (v >= mask_share) & (v < mask_share + random_share)
    random_ids = torch.randint(1, mask_token_id, ids.shape, generator=generator, device=ids.device)
    masked = torch.where(to_mask, torch.full_like(ids, mask_token_id), ids)
    masked = torch.where(to_random, random_ids, masked)
    # a caption with nothing chosen: its first eligible token is masked (IRRA's position 1)
    none = ~chosen.any(dim=1) & eligible.any(dim=1)
    if bool(none.any()):
        first = eligible.long().argmax(dim=1)
        rows = none.nonzero().flatten()
        chosen[rows, first[rows]] = True
        masked[rows, first[rows]] = mask_token_id
    labels = torch.where(chosen, ids, torch.full_like(ids, IGNORE_INDEX))
    return masked, labels


def clip_token_features(
    image_encoder: Any, pixel_values: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(embedding, tokens)`` of a CLIP image encoder from ONE pass of its vision tower: the
    ``(N, embed_dim)`` embedding its forward returns, and the ``(N, T, width)`` features of
    every output token after the last layer norm and ``visual_projection`` (IRRA's
    ``image_feats``; token 0 projected is what the embedding's added layer reads)."""
    out = image_encoder.vision_model(pixel_values=pixel_values, return_dict=True)
    tokens = image_encoder.visual_projection(
        image_encoder.vision_model.post_layernorm(out.last_hidden_state)
    )
    return image_encoder.embed_proj(tokens[:, 0]), tokens


def clip_text_token_features(
    text_encoder: Any, captions: torch.Tensor, lengths: torch.Tensor
) -> torch.Tensor:
    """The ``(B, L, width)`` features of every token of a CLIP text encoder's captions, after
    the final layer norm and ``text_projection`` (IRRA's ``encode_text`` of the masked ids);
    padding is masked by ``lengths`` as in the encoder's forward."""
    positions = torch.arange(captions.size(1), device=captions.device)
    mask = (positions.unsqueeze(0) < lengths.to(captions.device).unsqueeze(1)).long()
    out = text_encoder.text_model(input_ids=captions, attention_mask=mask, return_dict=True)
    return text_encoder.text_projection(out.last_hidden_state)


def irr_forward(
    model: Any, batch: Any, masked: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One training forward of a CLIP model with IRR: ``(img_emb, txt_emb, mlm_logits)``.

    The images go through the vision tower once (their embedding and their tokens); the
    captions through the text tower as in the model's forward, and the ``masked`` captions
    (:func:`mask_caption_tokens`) once more for their tokens, which ``model.irr`` reads
    against the image tokens.

    Args:
        model: A :class:`~vlret.models.RetrievalModel` of kind ``clip`` with ``irr`` set.
        batch: A :class:`~vlret.data.RetrievalBatch` of pixels and CLIP token ids.
        masked: ``(B, L)`` the batch's captions after masking.

    Raises:
        ValueError: The model has no IRR encoder or the batch no pixels.
    """
    irr = getattr(model, "irr", None)
    if irr is None:
        raise ValueError(
            'the loss part "mlm" needs IRRA\'s cross-modal encoder: set model.irr = true '
            '(a kind = "clip" model)'
        )
    features = batch.features
    if not isinstance(features, torch.Tensor) or features.dim() != 4:
        raise ValueError("IRR reads pixels: the batch's features must be (B, 3, H, W)")
    img_emb, image_tokens = clip_token_features(model.image_encoder, features)
    txt_emb = model.encode_texts(batch.captions, batch.lengths)
    text_tokens = clip_text_token_features(model.text_encoder, masked, batch.lengths)
    logits = irr(text_tokens, image_tokens)
    if getattr(model, "normalize", False):
        img_emb = torch.nn.functional.normalize(img_emb, dim=-1)
    return img_emb, txt_emb, logits


def build_irr(options: IRROptions, text_config: Any, width: int) -> ImplicitRelationReasoning:
    """``model.irr`` of a CLIP whose text tower has ``text_config`` (its ``vocab_size``, start
    and end ids) and whose projections are ``width`` wide."""
    specials = tuple(
        int(i)
        for i in (getattr(text_config, "bos_token_id", None), text_config.eos_token_id)
        if i is not None
    )
    return ImplicitRelationReasoning(
        width=width,
        vocab_size=int(text_config.vocab_size),
        depth=options.depth,
        heads=options.heads,
        mask_token_id=options.mask_token_id,
        special_ids=specials,
    )


__all__ = [
    "IGNORE_INDEX",
    "MASK_PROB",
    "MASK_SHARE",
    "RANDOM_SHARE",
    "IRROptions",
    "ImplicitRelationReasoning",
    "QuickGELU",
    "build_irr",
    "clip_text_token_features",
    "clip_token_features",
    "irr_forward",
    "mask_caption_tokens",
]
