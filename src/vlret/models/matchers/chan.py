"""CHAN: cross-modal hard aligning network (Pan, Wu and Zhang, CVPR 2023), as ppanzx/CHAN
releases it, with a bi-GRU or a BERT text side (``model.text.kind``).

Architecture (the release's ``lib/encoders.py``):

* **Regions** (:class:`CHANRegionEncoder`, the release's ``EncoderImagePrecomp``): one fully
  connected layer ``fc`` (Xavier-uniform, zero bias), then, with ``image.self_attention``
  (the release's ``--precomp_enc_type selfattention``, used by its Flickr30K bi-GRU script),
  one pre-LayerNorm residual self-attention block ``x + MHA(LN(x))`` with 8 heads and no
  feed-forward (``feedforward``), then each region L2-normalised (``x / (|x| + 1e-8)``). No
  pooling: an image stays its ``R`` regions.
* **Words**, ``text.kind = "bigru"`` (``EncoderTextBigru``): word embeddings (Xavier-uniform:
  the release's init without GloVe), a bi-GRU whose two directions are averaged, each word
  L2-normalised (vlret's :class:`~vlret.models.cross_model.WordEncoder`). The release's unused
  ``fc`` layer is not built. ``text.kind = "bert"`` (``EncoderTextBert``): a local BERT's last
  hidden state of every token, ``[CLS]`` and ``[SEP]`` included (they take part in the
  matching), projected by ``Linear(hidden, D)`` (PyTorch's default init, as the release's
  ``linear``) and L2-normalised (:class:`BertTokenEncoder`).
* **Score**: each word's best region, then a log-sum-exp over the caption's real words with
  temperature ``beta`` (:func:`~vlret.models.matchers.chan_score.chan_scores`; its docstring
  says how the scale and the padding differ from the release and why).

**Region dropout** (the release's ``--drop``: each region kept with probability 0.8 in
training, in its data loader) is ``image.region_dropout`` here, in the encoder: the kept
regions move to the front, the rows past them hold zero features (as the release's collate
pads), the self-attention block (if any) runs over the batch's longest kept count with no key
mask (the release calls it without lengths, so padding is attended to), and every padded row
then becomes a copy of the image's first kept region (before the L2 norm: a zero row's norm
has no derivative). A copy never changes a
maximum over regions, so the scores equal the release's with those regions removed, while the
output keeps the fixed ``(N, R, D)`` shape the memory bank stores. An image that would lose
every region keeps one (vlret's :func:`~vlret.models.image.region_dropout_mask`). The same
rows handle ``lengths`` (fewer real regions per image) at any time. The release's caption
augmentation (mask / replace / delete words with probability 0.2) is ``data.text_augment =
"vse_infinity"`` for the BERT side; vlret has none for a word vocabulary.

**Released checkpoints.** The README's four download links are empty: no CHAN weights are
published, so vlret has no importer for them. A file of the authors' ``train.py``
(``save_checkpoint``) holds ``{"epoch", "model", "best_rsum", "opt", "Eiters"}``, ``model``
being a LIST of four state dicts ``[img_enc, txt_enc, sim_enc, criterion]`` (the last two are
empty: neither has parameters). :meth:`CHAN.reference_names` maps every parameter of this
model to its name there (``"img_enc.fc.weight"``, ``"txt_enc.rnn.weight_ih_l0"``,
``"txt_enc.bert.encoder.layer.0..."``, ``"txt_enc.linear.weight"``) one to one, and
:meth:`CHAN.load_reference_parts` loads such a list; the names the release saves but this
model does not build are :data:`UNUSED_REFERENCE_PREFIXES` (the bi-GRU's unused ``fc``, BERT's
pooler, which CHAN never reads, and BERT's ``position_ids`` buffer).

Config schema (``vlret.models.build_model``; every key optional but ``text.path`` of a BERT
side, defaults shown):

    {"kind": "chan", "embed_dim": 1024, "beta": 0.1,
     "lse_scale": "release",                  # release | cosine
     "matmul_precision": "float32",           # float32 | bfloat16 (evaluation)
     "image": {"in_dim": 2048, "self_attention": False, "heads": 8, "region_dropout": 0.0},
     "text": {"kind": "bigru", "vocab_size": <from build_model(vocab_size=...)>,
              "word_dim": 300, "num_layers": 1}}
    text (BERT side): {"kind": "bert", "path": "<local bert-base-uncased folder>"}
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..attention import choice, positive_float, positive_int
from ..cross_model import CrossAttentionModel, RegionEncoder, WordEncoder, l2norm
from ..image import lengths_to_mask, region_dropout_mask
from ..sgraf_ops import PRECISIONS
from ..text import BertTextEncoder, check_captions, resolve_vocab_size
from .chan_score import LSE_SCALES, chan_scores

#: The valid top-level keys of a ``kind = "chan"`` model config and their defaults.
CHAN_DEFAULTS: dict[str, Any] = {
    "kind": "chan",
    "embed_dim": 1024,
    "beta": 0.1,
    "lse_scale": "release",
    "matmul_precision": "float32",
    "image": {},
    "text": {},
}
#: The ``image`` section's keys and defaults.
CHAN_IMAGE_DEFAULTS: dict[str, Any] = {
    "in_dim": 2048,
    "self_attention": False,
    "heads": 8,
    "region_dropout": 0.0,
}
#: The ``text`` section's keys and defaults, per ``text.kind``.
CHAN_TEXT_DEFAULTS: dict[str, dict[str, Any]] = {
    "bigru": {"kind": "bigru", "vocab_size": None, "word_dim": 300, "num_layers": 1},
    "bert": {"kind": "bert", "path": None},
}
#: Names the release saves that this model does not build (see the module docstring).
UNUSED_REFERENCE_PREFIXES = (
    "txt_enc.fc.",
    "txt_enc.bert.pooler.",
    "txt_enc.bert.embeddings.position_ids",
)
#: The release's ``Model.state_dict()`` list, in order.
REFERENCE_PARTS = ("img_enc", "txt_enc", "sim_enc", "criterion")


class RegionSelfAttention(nn.Module):
    """The release's ``SelfAttention``: ``x + MHA(LN(x))``, batch first, no key mask.

    Args:
        embed_dim: Size ``D`` of the regions.
        heads: Attention heads; must divide ``embed_dim``.

    Raises:
        ValueError: ``heads`` is not a positive divisor of ``embed_dim``.
    """

    def __init__(self, embed_dim: int, heads: int = 8) -> None:
        super().__init__()
        positive_int(heads, "image.heads")
        if embed_dim % heads:
            raise ValueError(f"image.heads: {heads} does not divide embed_dim {embed_dim}")
        self.ln = nn.LayerNorm(embed_dim)
        self.attn = nn.MultiheadAttention(embed_dim, heads, batch_first=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """One residual block over ``x (N, R, D)``."""
        y = self.ln(x)
        return x + self.attn(y, y, y, need_weights=False)[0]


class CHANRegionEncoder(RegionEncoder):
    """Regions ``(N, R, in_dim)`` -> ``(N, R, D)``: ``fc``, optional self-attention, L2 norm.

    vlret's :class:`~vlret.models.cross_model.RegionEncoder` (its ``fc`` is the release's, with
    the same init) with the release's optional self-attention block and region dropout; see the
    module docstring for the dropout and how padded rows are filled.

    Args:
        in_dim: Feature size of a region.
        embed_dim: Size ``D`` of the encoded regions.
        self_attention: Add the release's self-attention block (``feedforward``).
        heads: Its heads.
        region_dropout: Probability that a region is dropped in training mode, in ``[0, 1)``.

    Raises:
        ValueError: An invalid size or rate (the message names the ``image.*`` key).
    """

    def __init__(
        self,
        in_dim: int = 2048,
        embed_dim: int = 1024,
        *,
        self_attention: bool = False,
        heads: int = 8,
        region_dropout: float = 0.0,
    ) -> None:
        super().__init__(positive_int(in_dim, "image.in_dim"), positive_int(embed_dim, "embed_dim"))
        if not isinstance(self_attention, bool):
            raise ValueError(f"image.self_attention: must be true or false, got {self_attention!r}")
        if isinstance(region_dropout, bool) or not isinstance(region_dropout, (int, float)):
            raise ValueError(f"image.region_dropout: must be a number, got {region_dropout!r}")
        if not 0.0 <= region_dropout < 1.0:
            raise ValueError(f"image.region_dropout: must lie in [0, 1), got {region_dropout!r}")
        self.region_dropout = float(region_dropout)
        self.feedforward = RegionSelfAttention(embed_dim, heads) if self_attention else None

    def forward(self, features: torch.Tensor, lengths: torch.Tensor | None = None) -> torch.Tensor:
        """Encode every image's regions.

        Args:
            features: ``(N, R, in_dim)`` region features.
            lengths: ``(N,)`` real regions per image (the first ones), in ``1..R``; None: all.

        Returns:
            The ``(N, R, D)`` regions; rows of dropped or padded regions repeat a kept one.

        Raises:
            ValueError: ``features`` is not ``(N, R, in_dim)`` or ``lengths`` is out of range.
        """
        if not isinstance(features, torch.Tensor) or features.dim() != 3:
            got = tuple(features.shape) if isinstance(features, torch.Tensor) else type(features)
            raise ValueError(f"features: CHAN needs regions (N, R, {self.in_dim}), got {got}")
        if features.size(-1) != self.in_dim:
            raise ValueError(
                f"features: last dimension {features.size(-1)}, expected image.in_dim "
                f"{self.in_dim} (shape {tuple(features.shape)})"
            )
        n, r = features.shape[:2]
        features = features.to(self.fc.weight.dtype)
        keep = None
        if lengths is not None:
            lengths = torch.as_tensor(lengths, device=features.device)
            if lengths.shape != (n,):
                raise ValueError(f"lengths: expected shape ({n},), got {tuple(lengths.shape)}")
            keep = lengths_to_mask(lengths, r)
        if self.training and self.region_dropout > 0:
            full = keep if keep is not None else features.new_ones((n, r), dtype=torch.bool)
            keep = region_dropout_mask(full, self.region_dropout)
        if keep is None or bool(keep.all()):
            return l2norm(self._project(features))
        # kept regions first (stable), zero features past them, as the release's collate pads
        order = torch.sort((~keep).to(torch.uint8), dim=1, stable=True).indices
        counts = keep.sum(dim=1)
        width = int(counts.max())
        kept = features.gather(1, order[:, :width, None].expand(-1, -1, self.in_dim))
        real = lengths_to_mask(counts, width)
        out = self._project(kept.masked_fill(~real[..., None], 0.0))
        # padded rows: the first region, before the norm (a zero row's norm has no gradient)
        out = torch.where(real[..., None], out, out[:, :1])
        if width < r:
            out = torch.cat([out, out[:, :1].expand(-1, r - width, -1)], dim=1)
        return l2norm(out)

    def _project(self, features: torch.Tensor) -> torch.Tensor:
        x = self.fc(features)
        return self.feedforward(x) if self.feedforward is not None else x

    def extra_repr(self) -> str:
        return f"region_dropout={self.region_dropout}"


class BertTokenEncoder(BertTextEncoder):
    """A local BERT's last hidden state of every token, projected to ``D`` and L2-normalised
    (the release's ``EncoderTextBert``): ``(N, L)`` ids -> ``(N, max(lengths), D)``, zero at
    padding. ``[CLS]`` and ``[SEP]`` are tokens like any other.

    Args:
        path: Local directory of a ``save_pretrained`` BERT model.
        embed_dim: Size ``D`` of the token features.

    Raises:
        ValueError: ``embed_dim`` is not a positive int.
        ImportError: ``transformers`` is not installed.
        FileNotFoundError: ``path`` is not a directory.
    """

    def __init__(self, path: str | Path, *, embed_dim: int = 1024) -> None:
        super().__init__(path, embed_dim=embed_dim, pooling="cls")
        self.proj.reset_parameters()  # the release's Linear keeps PyTorch's default init

    def forward(self, captions: torch.Tensor, lengths: torch.Tensor | None = None) -> torch.Tensor:
        """Encode a padded batch of token ids token by token.

        Args:
            captions: ``(N, L)`` ids of the model's tokenizer.
            lengths: ``(N,)`` real tokens per caption; None means all ``L``.

        Returns:
            The ``(N, max(lengths), D)`` token features, zero at padding.

        Raises:
            ValueError: The batch is malformed.
        """
        captions, lengths = check_captions(captions, lengths)
        width = int(lengths.max())
        mask = lengths_to_mask(lengths.to(captions.device), width)
        hidden = self.bert(
            input_ids=captions[:, :width], attention_mask=mask.long(), return_dict=True
        ).last_hidden_state
        return l2norm(self.proj(hidden)).masked_fill(~mask[..., None], 0.0)

    def extra_repr(self) -> str:
        return f"path={str(self.path)!r}"


class CHAN(CrossAttentionModel):
    """CHAN's region and word encoders and its hard-alignment score (module docstring).

    Encoding is :class:`~vlret.models.cross_model.CrossAttentionModel`'s: one row per region
    and one per token (word, or BERT token with ``[CLS]`` / ``[SEP]``).

    Args:
        image_encoder: The region encoder.
        text_encoder: The word (bi-GRU) or token (BERT) encoder.
        beta: The log-sum-exp temperature.
        lse_scale: ``"release"`` or ``"cosine"`` (:mod:`~vlret.models.matchers.chan_score`).
        matmul_precision: ``"float32"`` or ``"bfloat16"``: the scorer's GEMM in evaluation
            (:mod:`~vlret.models.matchers.chan_score`; training computes in float32 either way).
        config: The resolved config the model was built from.

    Raises:
        ValueError: A non-positive ``beta``, an unknown ``lse_scale`` or
            ``matmul_precision``, or encoders that disagree on ``embed_dim``.
    """

    image_encoder: CHANRegionEncoder

    def __init__(
        self,
        image_encoder: CHANRegionEncoder,
        text_encoder: WordEncoder | BertTokenEncoder,
        *,
        beta: float = 0.1,
        lse_scale: str = "release",
        matmul_precision: str = "float32",
        config: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__(image_encoder, text_encoder, config=config)
        self.beta = positive_float(beta, "beta")
        self.lse_scale = choice(lse_scale, "lse_scale", LSE_SCALES)
        self.matmul_precision = choice(matmul_precision, "matmul_precision", PRECISIONS)

    def score(self, regions, words, word_lengths, *, max_elements=None) -> torch.Tensor:
        return chan_scores(
            regions,
            words,
            word_lengths,
            beta=self.beta,
            lse_scale=self.lse_scale,
            max_elements=max_elements,
            matmul_precision=self.matmul_precision,
        )

    def reference_names(self) -> dict[str, str]:
        """Map the release's parameter names (``"<part>.<name>"``, part in
        :data:`REFERENCE_PARTS`) to this model's, one to one over this model's state dict.

        Returns:
            ``{release name: this model's name}`` for every entry of ``self.state_dict()``.
        """
        names = {}
        for name in self.state_dict():
            side, rest = name.split(".", 1)
            if side == "image_encoder":
                names[f"img_enc.{rest}"] = name
            elif rest.startswith("proj."):  # BERT side: the release's `linear`
                names[f"txt_enc.linear.{rest[len('proj.') :]}"] = name
            else:
                names[f"txt_enc.{rest}"] = name
        return names

    def load_reference_parts(self, parts: Sequence[Mapping[str, torch.Tensor]]) -> None:
        """Load the release's ``model`` list ``[img_enc, txt_enc, sim_enc, criterion]``.

        Args:
            parts: The four state dicts of a release checkpoint's ``"model"`` entry.

        Raises:
            ValueError: Not four parts, a parameter missing or of the wrong shape, or a name
                this model does not know (outside :data:`UNUSED_REFERENCE_PREFIXES`).
        """
        if not isinstance(parts, Sequence) or len(parts) != len(REFERENCE_PARTS):
            raise ValueError(f"parts: expected the list {list(REFERENCE_PARTS)}")
        given = {
            f"{p}.{k}": v
            for p, part in zip(REFERENCE_PARTS, parts, strict=True)
            for k, v in part.items()
        }
        names, own = self.reference_names(), self.state_dict()
        unknown = [
            k for k in given if k not in names and not k.startswith(UNUSED_REFERENCE_PREFIXES)
        ]
        if unknown:
            raise ValueError(f"parts: {unknown[0]} is not a parameter of this CHAN model")
        state = {}
        for ref, name in names.items():
            if ref not in given:
                raise ValueError(f"parts: {ref} is missing (this model has {name})")
            value = torch.as_tensor(given[ref])
            if value.shape != own[name].shape:
                raise ValueError(
                    f"parts: {ref} has shape {tuple(value.shape)}, expected "
                    f"{tuple(own[name].shape)}"
                )
            state[name] = value
        self.load_state_dict(state)


def _section(name: str, given: Any, defaults: Mapping[str, Any], what: str) -> dict[str, Any]:
    if not isinstance(given, Mapping):
        raise ValueError(f"{name}: must be a dict, got {type(given).__name__}")
    unknown = sorted(set(given) - set(defaults))
    if unknown:
        raise ValueError(
            f"{name}.{unknown[0]}: unknown key for {what}; valid keys: {sorted(defaults)}"
        )
    return {**copy.deepcopy(dict(defaults)), **copy.deepcopy(dict(given))}


def build_chan_model(top: Mapping[str, Any], *, vocab_size: int | None = None) -> CHAN:
    """Build the model of a ``chan`` config (top level merged over :data:`CHAN_DEFAULTS`).

    Args:
        top: The config, its top level already merged over the defaults (``build_model``).
        vocab_size: ``len(vocabulary)`` for the bi-GRU side; may instead be ``text.vocab_size``.

    Returns:
        The :class:`CHAN` model; ``model.config`` holds the resolved config.

    Raises:
        ValueError: An unknown key or an invalid value (the message names the key), or no
            vocabulary size for a bi-GRU side.
        FileNotFoundError: A BERT side's ``text.path`` is not a directory.
    """
    cfg = copy.deepcopy(dict(top))
    embed_dim = positive_int(cfg["embed_dim"], "embed_dim")
    image_cfg = _section("image", cfg["image"], CHAN_IMAGE_DEFAULTS, "CHAN's region encoder")
    text_given = cfg["text"]
    if not isinstance(text_given, Mapping):
        raise ValueError(f"text: must be a dict, got {type(text_given).__name__}")
    kind = choice(text_given.get("kind", "bigru"), "text.kind", tuple(CHAN_TEXT_DEFAULTS))
    text_cfg = _section("text", text_given, CHAN_TEXT_DEFAULTS[kind], f"a {kind} text side")
    image = CHANRegionEncoder(
        image_cfg["in_dim"],
        embed_dim,
        self_attention=image_cfg["self_attention"],
        heads=image_cfg["heads"],
        region_dropout=image_cfg["region_dropout"],
    )
    text: WordEncoder | BertTokenEncoder
    if kind == "bigru":
        text_cfg["vocab_size"] = resolve_vocab_size(
            text_cfg["vocab_size"], vocab_size, "CHAN's bi-GRU text side"
        )
        for key in ("word_dim", "num_layers"):
            positive_int(text_cfg[key], f"text.{key}")
        text = WordEncoder(
            text_cfg["vocab_size"],
            word_dim=text_cfg["word_dim"],
            embed_dim=embed_dim,
            num_layers=text_cfg["num_layers"],
            bidirectional=True,
        )
        nn.init.xavier_uniform_(text.embed.weight)  # the release's init without GloVe
    else:
        path = text_cfg["path"]
        if not isinstance(path, (str, Path)) or not str(path):
            raise ValueError(
                f"text.path: a BERT text side needs a local BERT folder (save_pretrained), "
                f"got {path!r}"
            )
        text_cfg["path"] = str(path)
        text = BertTokenEncoder(path, embed_dim=embed_dim)
    cfg["image"], cfg["text"] = image_cfg, text_cfg
    options = {k: cfg[k] for k in ("beta", "lse_scale", "matmul_precision")}
    return CHAN(image, text, config=cfg, **options)


__all__ = [
    "CHAN",
    "CHAN_DEFAULTS",
    "CHAN_IMAGE_DEFAULTS",
    "CHAN_TEXT_DEFAULTS",
    "REFERENCE_PARTS",
    "UNUSED_REFERENCE_PREFIXES",
    "BertTokenEncoder",
    "CHANRegionEncoder",
    "RegionSelfAttention",
    "build_chan_model",
]
