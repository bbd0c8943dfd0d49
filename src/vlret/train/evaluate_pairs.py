"""Evaluation of pair-scoring (cross-attention) models: SCAN, BFAN, SGRAF.

A two-tower model gives each image and caption one vector and the score matrix is one matmul. A
cross-attention model scores each (image, caption) pair from the image's regions and the
caption's words together (SCAN Eq. 1-4), so the evaluation here

1. encodes every image's regions once and every caption's words once (:func:`encode_tokens`);
   the words are stored packed (:class:`TextTokens`: the real tokens of all captions one after
   the other, no padding), so COCO 5K's 25,000 captions take their ~290,000 tokens' worth of
   memory, not 25,000 x the longest caption's;
2. scores image blocks x caption blocks with ``model.score`` on the device
   (:func:`score_matrix`); captions are scored in order of length, each caption block padded to
   its own longest caption, and the scores land in a CPU float32 ``(N_img, N_txt)`` matrix.
   Only the requested blocks are scored: the COCO 1K protocol scores the 5 diagonal fold blocks
   (5 x 1000 x 5000 pairs, not 5000 x 25000);
3. ranks from the score matrix with :func:`vlret.metrics.retrieval_metrics_from_similarity`.

Ensembles average the members' score matrices (the papers' "*" rows: SCAN t2i + i2t, SGRAF =
SGR + SAF).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader

from ..data import RetrievalDataset
from ..metrics import retrieval_metrics_from_similarity

#: Default block of one ``model.score`` call: images x captions (memory inside the call is
#: bounded by the scorer's own ``max_elements``).
IMAGE_BLOCK = 128
TEXT_BLOCK = 1024


def _unwrap(model: nn.Module) -> nn.Module:
    return model.module if isinstance(model, nn.parallel.DistributedDataParallel) else model


def _check_device(device: torch.device | str) -> torch.device:
    try:
        return torch.device(device)
    except (RuntimeError, TypeError) as err:
        raise ValueError(f"device: {err}") from None


@dataclass(eq=False)
class TextTokens:
    """Word features of ``N`` captions, packed: caption ``j``'s ``lengths[j]`` words are rows
    ``offsets[j]:offsets[j + 1]`` of ``words (sum(lengths), D)``.

    :meth:`gather` assembles any set of captions as the padded ``(n, L, D)`` block a scorer
    takes, ``L`` being the longest caption of that set (padding rows are zero, as the word
    encoder's).
    """

    words: torch.Tensor
    lengths: torch.Tensor

    def __post_init__(self) -> None:
        if not isinstance(self.words, torch.Tensor) or self.words.dim() != 2:
            raise ValueError("words must be a 2-D tensor (total tokens, D) of packed captions")
        if (
            not isinstance(self.lengths, torch.Tensor)
            or self.lengths.dim() != 1
            or self.lengths.dtype.is_floating_point
        ):
            raise ValueError("lengths must be a 1-D integer tensor (one length per caption)")
        self.lengths = self.lengths.to(device=self.words.device, dtype=torch.long)
        if self.lengths.numel() and int(self.lengths.min()) < 1:
            raise ValueError("lengths must be >= 1 (a caption has at least one word)")
        total = int(self.lengths.sum())
        if total != self.words.shape[0]:
            raise ValueError(
                f"words has {self.words.shape[0]} rows but lengths sum to {total} tokens"
            )
        self.offsets = torch.zeros(
            len(self.lengths) + 1, dtype=torch.long, device=self.words.device
        )
        torch.cumsum(self.lengths, 0, out=self.offsets[1:])

    def __len__(self) -> int:
        return int(self.lengths.numel())

    @property
    def dim(self) -> int:
        return int(self.words.shape[1])

    def to(self, device: torch.device | str) -> TextTokens:
        return TextTokens(self.words.to(device), self.lengths.to(device))

    def gather(self, index: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """``(words (n, L, D), lengths (n,))`` of the captions ``index`` (all if ``None``), on
        this object's device, padded with zeros to the longest of them."""
        if index is None:
            index = torch.arange(len(self), device=self.words.device)
        index = index.to(device=self.words.device, dtype=torch.long)
        lengths = self.lengths.index_select(0, index)
        n = int(index.numel())
        width = int(lengths.max()) if n else 0
        steps = torch.arange(width, device=self.words.device)
        mask = steps[None, :] < lengths[:, None]
        rows = (self.offsets.index_select(0, index)[:, None] + steps[None, :]).masked_fill(~mask, 0)
        if self.words.shape[0] == 0:
            return self.words.new_zeros(n, width, self.dim), lengths
        out = self.words.index_select(0, rows.reshape(-1)).view(n, width, self.dim)
        return out.masked_fill_(~mask[:, :, None], 0.0), lengths

    def mean_pooled(self) -> torch.Tensor:
        """``(N, D)``: each caption's mean word feature (float32)."""
        owner = torch.repeat_interleave(
            torch.arange(len(self), device=self.words.device), self.lengths
        )
        sums = torch.zeros(len(self), self.dim, dtype=torch.float32, device=self.words.device)
        sums.index_add_(0, owner, self.words.float())
        return sums / self.lengths[:, None].float()


def pack_words(words: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """The real tokens of a padded ``(n, L, D)`` batch, caption after caption ``(sum, D)``."""
    lengths = lengths.to(words.device)
    mask = torch.arange(words.shape[1], device=words.device)[None, :] < lengths[:, None]
    return words[mask]


@torch.no_grad()
def encode_tokens(
    model: nn.Module,
    dataset: RetrievalDataset,
    *,
    batch_size: int = 128,
    device: torch.device | str,
    num_workers: int = 0,
) -> tuple[torch.Tensor, TextTokens]:
    """``(regions (N_img, R, D), words)``: every image's region features and every caption's
    word features from ``model.encode_images`` / ``model.encode_texts``, each image and
    caption encoded once, in float32 on the CPU (words packed, :class:`TextTokens`).

    The model is put in eval mode and its training mode restored afterwards."""
    if not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size: expected a positive integer, got {batch_size!r}")
    device = _check_device(device)
    model = _unwrap(model)
    was_training = model.training
    gen = torch.Generator().manual_seed(0)  # loaders leave the global RNG untouched
    model.eval()
    try:
        images = dataset.images()
        regions = []
        for feats, _ in DataLoader(
            images,
            batch_size=batch_size,
            collate_fn=images.collate,
            num_workers=num_workers,
            generator=gen,
        ):
            if isinstance(feats, torch.Tensor):
                feats = feats.to(device)
            regions.append(model.encode_images(feats).float().cpu())
        texts = dataset.texts()
        packed, lengths = [], []
        for caps, lens, _ in DataLoader(
            texts,
            batch_size=batch_size,
            collate_fn=texts.collate,
            num_workers=num_workers,
            generator=gen,
        ):
            if lens is None:
                raise ValueError(
                    "encode_tokens needs token ids (a dataset with a caption encoder), got raw text"
                )
            words = model.encode_texts(caps.to(device), lens.to(device))
            packed.append(pack_words(words.float(), lens).cpu())
            lengths.append(lens.cpu())
    finally:
        model.train(was_training)
    dim = regions[0].shape[-1] if regions else 0
    words = torch.cat(packed) if packed else torch.zeros(0, dim)
    lens = torch.cat(lengths) if lengths else torch.zeros(0, dtype=torch.long)
    return torch.cat(regions), TextTokens(words, lens)


def _check_blocks(blocks, n_img: int, n_txt: int) -> list[tuple[int, int, int, int]]:
    if blocks is None:
        return [(0, n_img, 0, n_txt)]
    out = []
    for b in blocks:
        if len(b) != 4 or not all(isinstance(v, int) for v in b):
            raise ValueError(f"blocks: expected (img0, img1, txt0, txt1) integer tuples, got {b!r}")
        i0, i1, t0, t1 = b
        if not (0 <= i0 <= i1 <= n_img and 0 <= t0 <= t1 <= n_txt):
            raise ValueError(f"blocks: {b!r} lies outside the {n_img} images x {n_txt} captions")
        for j0, j1, u0, u1 in out:
            if max(i0, j0) < min(i1, j1) and max(t0, u0) < min(t1, u1):
                raise ValueError(f"blocks: {b!r} and {(j0, j1, u0, u1)!r} overlap")
        out.append((i0, i1, t0, t1))
    return out


def _as_list(value, name: str, n: int) -> list:
    if isinstance(value, (torch.Tensor, TextTokens)):
        return [value] * n
    value = list(value)
    if len(value) != n:
        raise ValueError(f"{name}: one per model expected ({n}), got {len(value)}")
    return value


def _progress_bar(total: int, desc: str, enabled: bool):
    if not enabled:
        return None
    from tqdm.auto import tqdm

    return tqdm(
        total=total, desc=desc, unit="pair", unit_scale=True, dynamic_ncols=True, leave=False
    )


def _caption_blocks(
    texts: TextTokens, t0: int, t1: int, size: int
) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """Captions ``t0:t1`` in order of length, in blocks of ``size``: ``(index, words, lengths)``
    with each block padded to its own longest caption."""
    order = torch.argsort(texts.lengths[t0:t1], stable=True) + t0
    out = []
    for a in range(0, t1 - t0, size):
        index = order[a : a + size]
        words, lengths = texts.gather(index)
        out.append((index, words, lengths))
    return out


@torch.no_grad()
def score_matrix(
    models: nn.Module | Sequence[nn.Module],
    regions: torch.Tensor | Sequence[torch.Tensor],
    texts: TextTokens | Sequence[TextTokens],
    *,
    device: torch.device | str,
    blocks: Sequence[tuple[int, int, int, int]] | None = None,
    progress: bool = False,
    image_block: int = IMAGE_BLOCK,
    text_block: int = TEXT_BLOCK,
    max_elements: int | None = None,
) -> torch.Tensor:
    """``(N_img, N_txt)`` float32 CPU matrix of ``model.score`` for every image x caption pair.

    ``models``: one pair-scoring model or several (an ensemble: the mean of their matrices);
    ``regions (N_img, R, D)`` and ``texts`` from :func:`encode_tokens`, one of each per model
    when the members encode differently (each must be given its own). ``blocks``: the
    ``(img0, img1, txt0, txt1)`` ranges to score (e.g. the COCO 1K folds' diagonal blocks),
    ``None`` = all; entries outside every block are NaN. ``image_block`` x ``text_block`` pairs
    go to one ``model.score`` call (with ``max_elements`` bounding its intermediates);
    ``progress`` shows a tqdm bar in pairs with pairs/s and the ETA. Models are used in eval
    mode; their training mode is restored.
    """
    model_list = [models] if isinstance(models, nn.Module) else list(models)
    if not model_list or not all(isinstance(m, nn.Module) for m in model_list):
        raise ValueError("models: expected a model or a non-empty sequence of models")
    n = len(model_list)
    region_list = _as_list(regions, "regions", n)
    text_list = _as_list(texts, "texts", n)
    for r, t in zip(region_list, text_list, strict=True):
        if not isinstance(r, torch.Tensor) or r.dim() != 3:
            raise ValueError("regions must be a (N_img, R, D) tensor")
        if not isinstance(t, TextTokens):
            raise ValueError("texts must be TextTokens (see encode_tokens)")
        if (r.shape[0], len(t)) != (region_list[0].shape[0], len(text_list[0])):
            raise ValueError(
                "regions/texts: every model must score the same images and captions, got "
                f"{r.shape[0]} x {len(t)} and {region_list[0].shape[0]} x {len(text_list[0])}"
            )
    for name, v in (("image_block", image_block), ("text_block", text_block)):
        if not isinstance(v, int) or v < 1:
            raise ValueError(f"{name}: expected a positive integer, got {v!r}")
    device = _check_device(device)
    n_img, n_txt = region_list[0].shape[0], len(text_list[0])
    spans = _check_blocks(blocks, n_img, n_txt)
    out = torch.full((n_img, n_txt), math.nan, dtype=torch.float32)
    for i0, i1, t0, t1 in spans:
        out[i0:i1, t0:t1] = 0.0
    total = n * sum((i1 - i0) * (t1 - t0) for i0, i1, t0, t1 in spans)
    bar = _progress_bar(total, "scoring pairs", progress)
    try:
        for model, reg, txt in zip(model_list, region_list, text_list, strict=True):
            _score_into(
                out,
                _unwrap(model),
                reg,
                txt,
                spans,
                device=device,
                image_block=image_block,
                text_block=text_block,
                max_elements=max_elements,
                bar=bar,
            )
    finally:
        if bar is not None:
            bar.close()
    if n > 1:
        out /= n
    return out


def _score_into(
    out, model, regions, texts, spans, *, device, image_block, text_block, max_elements, bar
) -> None:
    """Add ``model``'s scores of the ``spans`` to ``out`` (CPU float32)."""
    was_training = model.training
    model.eval()
    try:
        texts_dev = texts.to(device)
        for i0, i1, t0, t1 in spans:
            if i0 == i1 or t0 == t1:
                continue
            cap_blocks = _caption_blocks(texts_dev, t0, t1, text_block)
            local = [(index - t0, w, ln) for index, w, ln in cap_blocks]
            for a in range(i0, i1, image_block):
                b = min(a + image_block, i1)
                reg = regions[a:b].to(device=device, dtype=torch.float32)
                row = torch.empty(b - a, t1 - t0, dtype=torch.float32, device=device)
                for index, words, lengths in local:
                    s = model.score(reg, words, lengths, max_elements=max_elements)
                    row.index_copy_(1, index, s.float())
                    if bar is not None:
                        bar.update((b - a) * int(index.numel()))
                out[a:b, t0:t1] += row.cpu()
    finally:
        model.train(was_training)


def dev_metrics_from_scores(sim: torch.Tensor, txt_to_img) -> dict[str, float]:
    """Model-selection metrics from a pair-scoring model's ``(N_img, N_txt)`` score matrix: the
    retrieval metrics, ``pos_sim`` (the mean score of the matching pairs) and
    ``hardest_neg_sim`` (the mean over every image and caption query of its hardest
    non-matching score; Unified Fig. 4), in the model's own score units (not cosines)."""
    out: dict[str, Any] = retrieval_metrics_from_similarity(sim, txt_to_img).as_dict()
    sim = sim.float()
    t2i = torch.as_tensor(txt_to_img, dtype=torch.long, device=sim.device)
    pos = t2i[None, :] == torch.arange(sim.shape[0], device=sim.device)[:, None]
    neg = sim.masked_fill(pos, -math.inf)
    hardest = torch.cat([neg.amax(dim=1), neg.amax(dim=0)])
    hardest = hardest[torch.isfinite(hardest)]  # a query without negatives has none
    out["pos_sim"] = float(sim.gather(0, t2i[None, :]).mean())
    out["hardest_neg_sim"] = float(hardest.mean()) if hardest.numel() else float("nan")
    return out
