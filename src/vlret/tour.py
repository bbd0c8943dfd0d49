"""`vlret demo` without ``--preset``: every registered loss on one seeded batch (value and
gradient norm), then the retrieval metrics of a seeded toy problem (a few seconds)."""

from __future__ import annotations

import time
from collections.abc import Callable

import torch
from torch import nn

from .losses import available_losses, build_loss, loss_capabilities, loss_class, loss_parameters
from .losses.aoq import OFFLINE_EMBEDDINGS, OFFLINE_SCORES
from .metrics import coco_5fold_metrics, retrieval_metrics

_OBJECTS = ("dog", "cat", "horse", "bicycle", "kite", "boat", "pizza", "train", "clock", "bench")
_COLOURS = ("red", "blue", "green", "white", "black", "yellow")
_PLACES = ("street", "beach", "kitchen", "park", "field", "table", "river")


def demo_batch(batch_size: int, dim: int, seed: int):
    """Paired embeddings in which every 4th text is a second caption of the previous image."""
    g = torch.Generator().manual_seed(seed)
    img_ids = torch.arange(batch_size) - (torch.arange(batch_size) % 4 == 3).long()
    latent = torch.randn(batch_size, dim, generator=g)
    img = latent[img_ids] + 2.5 * torch.randn(batch_size, dim, generator=g)
    txt = latent[img_ids] + 2.5 * torch.randn(batch_size, dim, generator=g)
    return img, txt, img_ids


def demo_captions(img_ids: torch.Tensor, seed: int) -> dict[int, list[str]]:
    """Five template captions per image id, sharing objects and places across images."""
    g = torch.Generator().manual_seed(seed + 1)

    def pick(words):
        return words[int(torch.randint(len(words), (1,), generator=g))]

    captions = {}
    for image in sorted(set(img_ids.tolist())):
        obj, colour, place = pick(_OBJECTS), pick(_COLOURS), pick(_PLACES)
        captions[image] = [
            f"a {colour} {obj} in the {place}",
            f"the {obj} near a {pick(_OBJECTS)} on the {place}",
            f"{colour} {obj} standing by the {place}",
            f"a photo of a {obj}",
            f"there is a {pick(_COLOURS)} {pick(_OBJECTS)} at the {place}",
        ]
    return captions


def build_demo_loss(name: str, img_ids: torch.Tensor, seed: int, dim: int) -> nn.Module:
    """The registered loss with its defaults; a loss that ``needs_semantics`` (VSL) gets a
    TF-IDF fitted on the demo captions, and one that classifies identities (``id``) a
    classifier over the batch's ids on ``dim``-wide embeddings."""
    if loss_capabilities(name).needs_semantics:
        from .semantic import CaptionTfidf  # the ``vsl`` extra

        return build_loss(name, semantic=CaptionTfidf().fit(demo_captions(img_ids, seed)))
    if "num_classes" in loss_parameters(name):
        return build_loss(name, num_classes=int(img_ids.max()) + 1, dim=dim)
    return build_loss(name)


def offline_stand_ins(name: str, img: torch.Tensor, txt: torch.Tensor) -> dict[str, torch.Tensor]:
    """A loss that takes offline negatives besides the batch (AOQ's mined captions and images):
    the batch's own items shifted by 1-4 rows stand in for them (detached, as a separate encoder
    pass would give them); no extra inputs for the others."""
    if loss_capabilities(name).similarity_inputs != OFFLINE_SCORES:
        return {}
    sources = (txt, img, img, txt)  # OFFLINE_EMBEDDINGS' order: caption, image, image, caption
    return {
        key: torch.roll(emb, 1 + i, 0).detach()
        for i, (key, emb) in enumerate(zip(OFFLINE_EMBEDDINGS, sources, strict=True))
    }


def token_losses() -> list[str]:
    """The registered losses that score a cross-modal encoder's predictions of masked caption
    tokens (IRRA's ``mlm``), not embeddings: the tour has no encoder to run them on."""
    return [n for n in available_losses() if loss_capabilities(n).masked_language]


def loss_rows(
    batch_size: int = 64, dim: int = 128, seed: int = 0
) -> list[tuple[str, float, float]]:
    """(name, loss value, gradient norm w.r.t. both embeddings) for every registered loss that
    scores embeddings (:func:`token_losses` score a cross-modal encoder's masked tokens)."""
    rows = []
    for name in available_losses():
        if loss_capabilities(name).masked_language:
            continue
        img, txt, img_ids = demo_batch(batch_size, dim, seed)
        img.requires_grad_(True)
        txt.requires_grad_(True)
        loss = build_demo_loss(name, img_ids, seed, dim)
        loss.train()
        value = loss(img, txt, img_ids=img_ids, **offline_stand_ins(name, img, txt))
        value.backward()
        grad_norm = torch.cat([img.grad.flatten(), txt.grad.flatten()]).norm()
        rows.append((name, float(value.detach()), float(grad_norm)))
    return rows


def synthetic_problem(n_img: int, per_image: int, dim: int, noise: float, seed: int):
    """Unit-norm image embeddings; each caption is its image plus Gaussian noise."""
    g = torch.Generator().manual_seed(seed)
    img = torch.nn.functional.normalize(torch.randn(n_img, dim, generator=g), dim=1)
    txt_to_img = torch.arange(n_img).repeat_interleave(per_image)
    txt = img[txt_to_img] + noise * torch.randn(len(txt_to_img), dim, generator=g) / dim**0.5
    return img, torch.nn.functional.normalize(txt, dim=1), txt_to_img


def run_demo(seed: int = 0, print_fn: Callable[[str], None] = print) -> None:
    start = time.perf_counter()
    print_fn("vlret demo: every registered loss on one seeded batch (B=64, D=128,")
    print_fn("every 4th text a second caption of the previous image, masked as a positive)\n")
    print_fn(f"{'loss':<18} {'paper':<40} {'value':>10} {'|grad|':>9}")
    for name, value, grad in loss_rows(seed=seed):
        paper = getattr(loss_class(name), "paper", "")[:40]
        print_fn(f"{name:<18} {paper:<40} {value:>10.4f} {grad:>9.4f}")
    if token_losses():
        names = ", ".join(token_losses())
        print_fn(f"(not shown: {names}, scored on a cross-modal encoder's masked caption tokens)")

    print_fn("\nSynthetic retrieval: 1000 images x 5 captions, D=256, caption = image + noise")
    print_fn("(recalls in %, ties count against the query)\n")
    print_fn(
        f"{'setting':<22} {'i2t R@1':>7} {'R@5':>6} {'R@10':>6} {'t2i R@1':>8} "
        f"{'R@5':>6} {'R@10':>6} {'rsum':>7}"
    )

    def line(label, m):
        print_fn(
            f"{label:<22} {m.i2t_r1:7.1f} {m.i2t_r5:6.1f} {m.i2t_r10:6.1f} {m.t2i_r1:8.1f} "
            f"{m.t2i_r5:6.1f} {m.t2i_r10:6.1f} {m.rsum:7.1f}"
        )

    for noise in (2.0, 4.0, 8.0):
        img, txt, t2i = synthetic_problem(1000, 5, 256, noise, seed)
        line(f"noise {noise:g}", retrieval_metrics(img, txt, t2i))
    g = torch.Generator().manual_seed(seed)
    _, _, t2i = synthetic_problem(1000, 5, 256, 1.0, seed)
    line(
        "random embeddings",
        retrieval_metrics(
            torch.randn(1000, 256, generator=g), torch.randn(5000, 256, generator=g), t2i
        ),
    )
    line(
        "collapsed (all equal)",
        retrieval_metrics(torch.ones(1000, 256), torch.ones(5000, 256), t2i),
    )
    img, txt, t2i = synthetic_problem(5000, 5, 256, 6.0, seed)
    line("5K, noise 6", retrieval_metrics(img, txt, t2i))
    line("5-fold 1K, noise 6", coco_5fold_metrics(img, txt, t2i))
    print_fn(f"\ndone in {time.perf_counter() - start:.1f} s")


# --------------------------------------------------------------------------------------------
# The comparison demo on a synthetic world
# --------------------------------------------------------------------------------------------
