"""Evaluation of a trained model under the papers' protocols.

========================  =====================  ==========================================
protocol                  data / split           metric
========================  =====================  ==========================================
``f30k``                  F30K ``test``          1000 images x 5000 captions
``coco5k``                COCO ``testall``       5000 images x 25000 captions
``coco1k``                COCO ``testall``       5 folds of 1000 images, averaged
``msrvtt-full``           MSR-VTT ``test``       2990 videos x 20 captions; v2t ranks the best
                                                 of a video's 20 captions (dual-encoding)
``msrvtt-1ka``            MSR-VTT ``test``       1000 videos x 1 caption (JSFUSION)
========================  =====================  ==========================================

``vlret eval --split`` is one of ``test``, ``testall`` and ``dev``, checked against the protocol
and the checkpoint's data format (:func:`check_eval_split`): ``f30k`` takes ``test`` of
precomp or Karpathy data; ``coco5k`` / ``coco1k`` take ``testall`` of precomp data (COCO's
5000 test images; precomp ``test`` is only the first 1000) or ``test`` / ``testall`` of a
Karpathy COCO JSON; the MSR-VTT protocols take ``test`` of MSR-VTT data. ``dev`` (precomp dev,
Karpathy val, MSR-VTT validate) is accepted by every protocol but ``msrvtt-1ka``, whose split
has no dev videos, for checking model selection; papers report the test splits. ``coco1k``
needs a number of images divisible by 5 (its 5 folds).

A two-tower checkpoint goes through :func:`vlret.metrics.retrieval_metrics` (or
:func:`~vlret.metrics.coco_5fold_metrics`) on L2-normalised embeddings (cosine scores): the
image-to-text rank there is already the rank of an image's best caption, which is the
dual-encoding video-to-text definition of MSR-VTT full. A pair-scoring (cross-attention)
checkpoint (``scores_pairs``: SCAN, BFAN, SGRAF) is scored pair by pair into a score matrix
(:mod:`vlret.train.evaluate_pairs`; COCO 1K: the 5 diagonal fold blocks only), ranked by
:func:`vlret.metrics.retrieval_metrics_from_similarity`.

Several checkpoints (``vlret eval A.pt B.pt``) are an ensemble: the mean of their score matrices
(cosine matrices for two-tower members), each member encoding the split with its own data
settings and vocabulary; they must evaluate the same data format and split (same images and
captions in the same order).

``shortlist=K`` (``--shortlist K``) is an opt-in, approximate protocol for pair-scoring models:
each query keeps its top ``K`` candidates by a two-tower score, which are re-ranked by the exact
pair scores; every other candidate ranks below them (among themselves by the two-tower score;
:func:`~vlret.train.evaluate_pairs.shortlist_metrics`). The two-tower score is the cosine of a
``shortlist_from`` two-tower checkpoint's embeddings, or by default the cosine of the
pair-scoring model's own mean-pooled region and word features (for an ensemble, the mean of the
members' cosines). Results say "approximate" and report the fraction of queries whose ground
truth was shortlisted, per direction. The default is always the exact protocol.

``rescore`` (``--rescore dsl | qbnorm``) is an opt-in, NON-STANDARD re-scoring of the score
matrix (:mod:`vlret.metrics.rescore`, docs/rescoring.md), for two-tower and pair-scoring models
and ensembles (of the mean matrix), not with ``shortlist``. Dual softmax uses the test matrix's
own statistics; QB-Norm re-scores text->image only, with a querybank of ``bank_size`` captions
of the data folder's ``train`` split (fixed seed) scored against the test images. COCO 1K
re-scores each fold's block on its own. Titles and JSON records say NON-STANDARD.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, Subset

from ..data import RetrievalDataset
from ..metrics import RetrievalMetrics, coco_5fold_metrics, retrieval_metrics
from ..metrics.rescore import Rescoring, draw_bank, rescored_metrics
from .builders import build_dataset, encoder_from_state, eval_data_config
from .checkpoint import load_checkpoint
from .config import config_from_dict
from .distributed import resolve_device
from .evaluate_pairs import (
    embedding_scores,
    encode_tokens,
    encoded_images,
    fold_blocks,
    mean_pooled_scores,
    metrics_from_scores,
    score_matrix,
    shortlist_metrics,
)

PROTOCOLS = ("f30k", "coco1k", "coco5k", "msrvtt-full", "msrvtt-1ka")
EVAL_SPLITS = ("test", "testall", "dev")
#: protocol -> data format -> the splits it evaluates (see the module docstring).
_COCO_SPLITS = {"precomp": ("testall", "dev"), "karpathy": ("test", "testall", "dev")}
PROTOCOL_SPLITS: dict[str, dict[str, tuple[str, ...]]] = {
    "f30k": {"precomp": ("test", "dev"), "karpathy": ("test", "dev")},
    "coco1k": _COCO_SPLITS,
    "coco5k": _COCO_SPLITS,
    "msrvtt-full": {"msrvtt": ("test", "dev")},
    "msrvtt-1ka": {"msrvtt": ("test",)},
}
_TITLES = {
    "f30k": "Flickr30K 1K test",
    "coco1k": "MS-COCO 5-fold 1K test",
    "coco5k": "MS-COCO 5K test",
    "msrvtt-full": "MSR-VTT full test (v2t: best of each video's captions)",
    "msrvtt-1ka": "MSR-VTT 1k-A test",
}
#: protocol -> (name, the papers' test splits, their number of images / videos and texts)
_PAPER_SETS: dict[str, tuple[str, tuple[str, ...], int, int]] = {
    "f30k": ("Flickr30K 1K", ("test",), 1000, 5000),
    "coco1k": ("MS-COCO 5-fold 1K", ("testall", "test"), 5000, 25000),
    "coco5k": ("MS-COCO 5K", ("testall", "test"), 5000, 25000),
    "msrvtt-full": ("MSR-VTT full", ("test",), 2990, 59800),
    "msrvtt-1ka": ("MSR-VTT 1k-A", ("test",), 1000, 1000),
}


@dataclass
class Evaluation:
    """What :func:`run_evaluation` measured: the metrics and the size of the scored split."""

    metrics: RetrievalMetrics
    n_images: int
    n_texts: int
    #: the checkpoints whose score matrices were averaged (empty or one: a single model)
    members: tuple[str, ...] = ()
    #: the approximate shortlist protocol's settings and coverage; ``None`` = exact protocol
    shortlist: dict[str, Any] | None = None
    #: the exact ``(N_img, N_txt)`` score matrix of pair-scoring models (NaN outside the COCO
    #: 1K fold blocks), kept so a caller can compute more from it without scoring again
    scores: torch.Tensor | None = None
    #: NON-STANDARD re-scoring: the JSON ``rescore`` record and the title's label; else ``None``
    rescore: dict[str, Any] | None = None
    rescore_label: str | None = None

    @property
    def approximate(self) -> bool:
        return self.shortlist is not None


def protocol_title(protocol: str, split: str | None, n_images: int, n_texts: int) -> str:
    """The table title: the paper's label only when ``split`` and the sizes are the paper's
    test set; otherwise what was actually scored, marked as not the paper's set."""
    name, splits, paper_images, paper_texts = _PAPER_SETS[check_protocol(protocol)]
    if split in splits and (n_images, n_texts) == (paper_images, paper_texts):
        return _TITLES[protocol]
    folds = f", 5 folds of {n_images // 5} images" if protocol == "coco1k" else ""
    return (
        f"{name} protocol on {split or 'a'} split of {n_images} images x {n_texts} texts{folds} "
        f"(not the paper's test set: {'/'.join(splits)}, {paper_images} x {paper_texts})"
    )


def check_protocol(protocol: str) -> str:
    if protocol not in PROTOCOLS:
        raise ValueError(f"protocol must be one of {', '.join(PROTOCOLS)}, got {protocol!r}")
    return protocol


def check_eval_split(protocol: str, split: str, data_format: str) -> None:
    """Raise ``ValueError`` unless ``protocol`` evaluates ``split`` of ``data_format`` data."""
    check_protocol(protocol)
    by_format = PROTOCOL_SPLITS[protocol]
    if data_format not in by_format:
        raise ValueError(
            f"protocol {protocol} needs {' or '.join(by_format)} data; the checkpoint was "
            f"trained on {data_format} data"
        )
    if split not in by_format[data_format]:
        raise ValueError(
            f"protocol {protocol} on {data_format} data evaluates the split(s) "
            f"{', '.join(by_format[data_format])}, not {split!r}"
        )


def _unwrap(model: nn.Module) -> nn.Module:
    return model.module if isinstance(model, nn.parallel.DistributedDataParallel) else model


@torch.no_grad()
def encode_dataset(
    model: nn.Module,
    dataset: RetrievalDataset,
    *,
    batch_size: int = 256,
    device: torch.device | str = "cpu",
    normalize: bool = True,
    num_workers: int = 0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(img_emb (N_img, E), txt_emb (N_txt, E))`` in float32 on the CPU, each image encoded
    once. The model is put in eval mode and restored afterwards."""
    model = _unwrap(model)
    was_training = model.training
    # Loaders with their own generator leave the global torch RNG untouched (exact resume).
    gen = torch.Generator().manual_seed(0)
    model.eval()
    try:
        img_parts = encoded_images(model, dataset, batch_size, device, num_workers, gen)
        texts = dataset.texts()
        txt_parts = []
        for caps, lengths, _ in DataLoader(
            texts,
            batch_size=batch_size,
            collate_fn=texts.collate,
            num_workers=num_workers,
            generator=gen,
        ):
            if isinstance(caps, torch.Tensor):
                caps = caps.to(device)
            encoded = cast(Any, model).encode_texts(caps, lengths)  # a vlret model's method
            txt_parts.append(encoded.float().cpu())
    finally:
        model.train(was_training)
    img, txt = torch.cat(img_parts), torch.cat(txt_parts)
    if normalize:
        img, txt = F.normalize(img, dim=1), F.normalize(txt, dim=1)
    return img, txt


def dev_metrics(
    img_emb: torch.Tensor, txt_emb: torch.Tensor, txt_to_img: torch.Tensor
) -> dict[str, float]:
    """Model-selection metrics: the retrieval metrics of the model's own scores, plus
    ``pos_sim``, the mean cosine of the matching (image, caption) pairs, and
    ``hardest_neg_sim``, the mean over every image and caption query of its hardest
    non-matching cosine (Unified Fig. 4)."""
    out = retrieval_metrics(img_emb, txt_emb, txt_to_img).as_dict()
    # Cosines whatever loss.normalize says; the scores above are the model's own.
    sim = F.normalize(img_emb.float(), dim=1) @ F.normalize(txt_emb.float(), dim=1).t()
    pos = txt_to_img[None, :] == torch.arange(sim.shape[0])[:, None]
    neg = sim.masked_fill(pos, -math.inf)
    hardest = torch.cat([neg.amax(dim=1), neg.amax(dim=0)])
    hardest = hardest[torch.isfinite(hardest)]  # a query without negatives has none
    out["pos_sim"] = float(sim[pos].mean())
    out["hardest_neg_sim"] = float(hardest.mean()) if hardest.numel() else float("nan")
    return out


def protocol_metrics(
    img_emb: torch.Tensor, txt_emb: torch.Tensor, txt_to_img: torch.Tensor, protocol: str
) -> RetrievalMetrics:
    """Metrics of ``protocol`` from normalised embeddings (see the module table)."""
    check_protocol(protocol)
    if protocol == "coco1k":
        n_img = img_emb.shape[0]
        if n_img % 5:
            raise ValueError(
                f"coco1k averages 5 folds of equal size (COCO testall: 5 x 1000 images); "
                f"this split has {n_img} images, not divisible by 5 (use coco5k)"
            )
        return coco_5fold_metrics(img_emb, txt_emb, txt_to_img, n_folds=5)
    return retrieval_metrics(img_emb, txt_emb, txt_to_img)


def format_metrics_table(
    metrics: RetrievalMetrics, protocol: str, *, title: str | None = None
) -> str:
    """The paper-style table: R@1/5/10 both directions, rsum, medr (and each COCO fold);
    ``title`` defaults to the protocol's paper label (see :func:`protocol_title`)."""
    visual = "video" if protocol.startswith("msrvtt") else "image"
    lines = [metrics.format_table(title if title is not None else _TITLES[protocol], visual=visual)]
    for k, fold in enumerate(metrics.folds):
        row = fold.format_table().splitlines()[-1]
        lines.append(f"{row}   (fold {k + 1})")
    return "\n".join(lines)


def metrics_json(
    metrics: RetrievalMetrics, *, protocol: str, split: str, **extra: Any
) -> dict[str, Any]:
    """JSON record: the foundation's key names under ``metrics`` (and per fold under ``folds``)."""
    out: dict[str, Any] = {"protocol": protocol, "split": split, **extra}
    out["metrics"] = metrics.as_dict()
    if metrics.folds:
        out["folds"] = [f.as_dict() for f in metrics.folds]
    return out


def load_trained_model(
    checkpoint: str | Path, *, device: torch.device | str = "cpu"
) -> tuple[nn.Module, Any, Any]:
    """``(model, config, caption encoder)`` rebuilt from a training checkpoint."""
    from ..models import build_model

    state = load_checkpoint(checkpoint)
    if "config" not in state or "encoder" not in state:
        raise ValueError(f"{checkpoint}: not a `vlret train` checkpoint (no config or encoder)")
    config = config_from_dict(state["config"], source=f"{checkpoint} (stored config)")
    encoder = encoder_from_state(state["encoder"])
    model = build_model(config.model, vocab_size=state.get("vocab_size"))
    model.load_state_dict(state["model"])
    return model.to(device).eval(), config, encoder


def evaluate_checkpoint(
    checkpoint: str | Path | Sequence[str | Path],
    *,
    data: str | Path,
    split: str,
    protocol: str,
    batch_size: int = 256,
    device: str = "auto",
    **options: Any,
) -> RetrievalMetrics:
    """The metrics of :func:`run_evaluation` (``options``: its ``shortlist``, ...)."""
    return run_evaluation(
        checkpoint,
        data=data,
        split=split,
        protocol=protocol,
        batch_size=batch_size,
        device=device,
        **options,
    ).metrics


def run_evaluation(
    checkpoint: str | Path | Sequence[str | Path],
    *,
    data: str | Path,
    split: str,
    protocol: str,
    batch_size: int = 256,
    device: str = "auto",
    shortlist: int | None = None,
    shortlist_from: str | Path | None = None,
    progress: bool = False,
    rescore: Rescoring | str | None = None,
) -> Evaluation:
    """Load ``checkpoint``, encode ``split`` of the data folder ``data`` and score ``protocol``.

    ``checkpoint``: one checkpoint, or several for an ensemble (the mean of their score
    matrices, see the module docstring). ``data`` replaces the training data paths (for
    Karpathy data: the JSON and the image folder under it, see
    :func:`~vlret.train.builders.eval_data_config`); a missing folder raises
    ``FileNotFoundError``, a split the protocol does not evaluate ``ValueError``. ``shortlist``
    / ``shortlist_from``: the approximate protocol (module docstring); ``progress``: a tqdm bar
    while pairs are scored; ``rescore``: a NON-STANDARD re-scoring (a method name takes its
    defaults; module docstring)."""
    check_protocol(protocol)
    if split not in EVAL_SPLITS:
        raise ValueError(f"split must be one of {', '.join(EVAL_SPLITS)}, got {split!r}")
    if not Path(data).exists():
        raise FileNotFoundError(f"{data}: missing; expected the data folder of the test split")
    if batch_size < 1:
        raise ValueError(f"batch_size: expected a positive integer, got {batch_size!r}")
    checkpoints = [checkpoint] if isinstance(checkpoint, str | Path) else list(checkpoint)
    if not checkpoints:
        raise ValueError("checkpoint: expected at least one checkpoint")
    if shortlist is not None and (
        isinstance(shortlist, bool) or not isinstance(shortlist, int) or shortlist < 1
    ):
        raise ValueError(f"shortlist: expected a positive number of candidates, got {shortlist!r}")
    if shortlist_from is not None and shortlist is None:
        raise ValueError("shortlist_from: only used with shortlist (the candidates kept, K)")
    if isinstance(rescore, str):
        rescore = Rescoring(rescore)
    if rescore is not None and not isinstance(rescore, Rescoring):
        raise ValueError(f"rescore: expected a Rescoring or a method name, got {rescore!r}")
    if rescore is not None and shortlist is not None:
        raise ValueError(
            "rescore re-scores the full score matrix; it does not combine with shortlist"
        )
    try:
        dev = resolve_device(device)
    except ValueError as err:
        raise ValueError(f"device: {err}") from None
    names = tuple(str(c) for c in checkpoints)
    members = [_load_member(c, protocol, split, dev) for c in checkpoints]
    formats = {m[1].data.format for m in members}
    if len(formats) > 1:
        named = ", ".join(
            f"{c} {m[1].data.format}" for c, m in zip(checkpoints, members, strict=True)
        )
        raise ValueError(f"the ensemble's checkpoints were trained on different data: {named}")
    pairs = [getattr(m[0], "scores_pairs", False) for m in members]
    if len(members) == 1 and not pairs[0] and shortlist is None and rescore is None:
        model, config, encoder = members[0]
        dataset = _eval_dataset(model, config, encoder, data, split, protocol)
        normalize = config.loss.params.get("normalize", True)
        img, txt = encode_dataset(
            model, dataset, batch_size=batch_size, device=dev, normalize=normalize
        )
        metrics = protocol_metrics(img, txt, dataset.txt_to_img, protocol)
        return Evaluation(metrics, int(img.shape[0]), int(txt.shape[0]), members=names)
    if shortlist is not None and not all(pairs):
        two_tower = [str(c) for c, p in zip(checkpoints, pairs, strict=True) if not p]
        raise ValueError(
            f"shortlist re-ranks pair scores; {', '.join(two_tower)} is a two-tower model, "
            "whose exact evaluation is already one matrix product (drop --shortlist)"
        )
    datasets = [_eval_dataset(*m, data, split, protocol) for m in members]
    for name, ds in zip(names[1:], datasets[1:], strict=True):
        _check_same_split(names[0], datasets[0], name, ds, split)
    t2i = datasets[0].txt_to_img
    n_img, n_txt = datasets[0].num_images, datasets[0].num_captions
    blocks = fold_blocks(t2i, 5) if protocol == "coco1k" else None
    options: dict[str, Any] = {"batch_size": batch_size, "device": dev}
    if shortlist is None:
        sim: torch.Tensor | None = None
        for (model, config, _), ds in zip(members, datasets, strict=True):
            scores = _member_scores(model, config, ds, blocks, progress=progress, **options)
            sim = scores if sim is None else sim.add_(scores)
        assert sim is not None  # one member at least
        sim /= len(members)
        if rescore is None:
            metrics = metrics_from_scores(sim, t2i, blocks=blocks)
            return Evaluation(metrics, n_images=n_img, n_texts=n_txt, members=names, scores=sim)
        bank = _bank_scores(members, datasets, data, protocol, rescore, **options)
        metrics, info = rescored_metrics(sim, t2i, rescore, bank_sim=bank, blocks=blocks)
        return Evaluation(
            metrics,
            n_img,
            n_txt,
            members=names,
            scores=sim,
            rescore=rescore.record(info),
            rescore_label=rescore.label(info),
        )
    tokens = [encode_tokens(m[0], ds, **options) for m, ds in zip(members, datasets, strict=True)]
    if shortlist_from is None:
        source = "cosine of the mean-pooled region and word features"
        pooled = sum(mean_pooled_scores(r, t, blocks=blocks) for r, t in tokens)
        tt = cast(torch.Tensor, pooled) / len(tokens)  # a sum of one tensor or more
    else:
        source = f"cosine of the two-tower checkpoint {shortlist_from}"
        model, config, encoder = _load_member(shortlist_from, protocol, split, dev)
        if getattr(model, "scores_pairs", False) or config.data.format not in formats:
            raise ValueError(
                f"shortlist_from: {shortlist_from} must be a two-tower checkpoint trained on "
                f"{formats.pop()} data"
            )
        ds = _eval_dataset(model, config, encoder, data, split, protocol)
        _check_same_split(names[0], datasets[0], str(shortlist_from), ds, split)
        tt = _member_scores(model, config, ds, blocks, **options)
    result = shortlist_metrics(
        [m[0] for m in members],
        [r for r, _ in tokens],
        [t for _, t in tokens],
        t2i,
        tt,
        k=shortlist,
        device=dev,
        blocks=blocks,
        progress=progress,
    )
    info = {
        "k": shortlist,
        "k_i2t": result.k_i2t,
        "k_t2i": result.k_t2i,
        "source": source,
        "i2t_ground_truth_in_shortlist": result.i2t_in_shortlist,
        "t2i_ground_truth_in_shortlist": result.t2i_in_shortlist,
        "pairs_scored": result.pairs_scored,
    }
    return Evaluation(result.metrics, n_img, n_txt, members=names, shortlist=info)


def _load_member(
    checkpoint: str | Path, protocol: str, split: str, device: torch.device | str
) -> tuple[nn.Module, Any, Any]:
    model, config, encoder = load_trained_model(checkpoint, device=device)
    try:
        check_eval_split(protocol, split, config.data.format)
    except ValueError as err:
        raise ValueError(f"{checkpoint}: {err}") from None
    return model, config, encoder


def _eval_dataset(model, config, encoder, data, split: str, protocol: str) -> RetrievalDataset:
    data_cfg = eval_data_config(config.data, data)
    ds_protocol = {"msrvtt-1ka": "1k-A", "msrvtt-full": "full"}.get(protocol)
    transform = getattr(model, "image_transform", None)
    return build_dataset(data_cfg, split, encoder, protocol=ds_protocol, image_transform=transform)


def _check_same_split(name_a: str, a: RetrievalDataset, name_b: str, b: RetrievalDataset, split):
    """Ensemble members must score the same images and captions, in the same order."""
    size_a, size_b = (a.num_images, a.num_captions), (b.num_images, b.num_captions)
    if size_a != size_b:
        raise ValueError(
            f"{name_a} and {name_b} see different {split} splits: {size_a[0]} x {size_a[1]} "
            f"and {size_b[0]} x {size_b[1]} images x texts (check their data settings)"
        )
    same_ids = list(a.image_ids) == list(b.image_ids)
    if not same_ids or not torch.equal(
        torch.as_tensor(a.txt_to_img), torch.as_tensor(b.txt_to_img)
    ):
        raise ValueError(
            f"{name_a} and {name_b} see the {split} split's images or captions in another order"
        )


def _member_scores(
    model, config, dataset, blocks, *, batch_size, device, progress=False
) -> torch.Tensor:
    """One checkpoint's score matrix (only ``blocks``): pair scores, or a two-tower model's
    dot products (cosines unless its loss set ``normalize = false``)."""
    if getattr(model, "scores_pairs", False):
        regions, texts = encode_tokens(model, dataset, batch_size=batch_size, device=device)
        return score_matrix(model, regions, texts, device=device, blocks=blocks, progress=progress)
    normalize = config.loss.params.get("normalize", True)
    img, txt = encode_dataset(
        model, dataset, batch_size=batch_size, device=device, normalize=normalize
    )
    return embedding_scores(img, txt, blocks=blocks)


class _BankView:
    """The test images with the querybank's training captions as texts (for scoring them)."""

    def __init__(self, test: RetrievalDataset, train: RetrievalDataset, index: torch.Tensor):
        self.test, self.captions, self.index = test, train.texts(), index.tolist()

    def images(self):
        return self.test.images()

    def texts(self) -> Subset:
        view = Subset(self.captions, self.index)
        view.collate = self.captions.collate  # type: ignore[attr-defined]
        return view


def _bank_scores(members, datasets, data, protocol, rescore: Rescoring, **options):
    """QB-Norm's querybank scores ``(N_bank, N_img)``: ``rescore.bank_size`` captions of the
    ``train`` split (fixed seed) against the test images (ensembles: the members' mean)."""
    if not rescore.needs_bank:
        return None
    bank, index = None, None
    for (model, config, encoder), ds in zip(members, datasets, strict=True):
        try:
            train = _eval_dataset(model, config, encoder, data, "train", protocol)
        except (FileNotFoundError, ValueError) as err:
            msg = f"rescore qbnorm: the querybank is the train split's captions: {err}"
            raise ValueError(msg) from None
        if index is None:
            n_train = train.num_captions
            index = draw_bank(n_train, size=rescore.bank_size, seed=rescore.bank_seed)
        elif train.num_captions != n_train:
            raise ValueError("rescore qbnorm: the ensemble's members see different train splits")
        view = _BankView(ds, train, index)
        scores = _member_scores(model, config, view, None, **options).t()
        bank = scores if bank is None else bank.add_(scores)
    assert bank is not None  # one member at least
    return bank / len(members)


def evaluation_title(result: Evaluation, protocol: str, split: str) -> str:
    """:func:`protocol_title`, plus the ensemble's members and the approximate protocol."""
    title = protocol_title(protocol, split, result.n_images, result.n_texts)
    if len(result.members) > 1:
        members = ", ".join(result.members)
        title += f"\nensemble of {len(result.members)} (mean of score matrices): {members}"
    if result.shortlist is not None:
        info = result.shortlist
        capped = ""
        if min(info["k_i2t"], info["k_t2i"]) < info["k"]:  # fewer candidates than K
            capped = f" (at most the candidates: i2t {info['k_i2t']}, t2i {info['k_t2i']})"
        title += (
            f"\napproximate protocol (not the exact evaluation): top-{info['k']}{capped} "
            "shortlists by "
            f"the {info['source']}, re-ranked by exact scores; ground truth shortlisted for "
            f"{100 * info['i2t_ground_truth_in_shortlist']:.1f}% of i2t and "
            f"{100 * info['t2i_ground_truth_in_shortlist']:.1f}% of t2i queries"
        )
    if result.rescore_label is not None:
        title = f"{result.rescore_label}\n{title}"
    return title


def evaluation_record(result: Evaluation, *, protocol: str, split: str) -> dict[str, Any]:
    """The ``--json`` record: :func:`metrics_json` with the checkpoint(s), title, sizes,
    ``approximate``, (approximate protocol) ``shortlist``, (re-scored) ``standard: false`` and
    ``rescore``."""
    names: dict[str, Any] = {"checkpoint": result.members[0]} if len(result.members) == 1 else {}
    if len(result.members) > 1:
        names = {"checkpoints": list(result.members), "ensemble": "mean of score matrices"}
    extra: dict[str, Any] = {"approximate": result.approximate}
    if result.shortlist is not None:
        extra["shortlist"] = dict(result.shortlist)
    if result.rescore is not None:
        extra.update(standard=False, rescore=dict(result.rescore))
    return metrics_json(
        result.metrics,
        protocol=protocol,
        split=split,
        **names,
        title=evaluation_title(result, protocol, split),
        n_images=result.n_images,
        n_texts=result.n_texts,
        **extra,
    )
