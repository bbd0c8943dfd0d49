"""Building the run's loss from its ``[loss]`` section: what each loss's capabilities ask of the
harness (a TF-IDF over the training captions, the model's embedding width, the number of training
identities), filled in before :func:`vlret.losses.build_loss` (used by :class:`Trainer`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from ..data import RetrievalDataset
from .config import ConfigError, RunConfig

if TYPE_CHECKING:
    from ..losses._base import PairLoss


def train_captions_by_image(dataset: RetrievalDataset) -> dict[int, list[str]]:
    """Captions of each training image keyed by image index (a loss's CaptionTfidf)."""
    out: dict[int, list[str]] = {i: [] for i in range(dataset.num_images)}
    for text, img in zip(dataset.captions, dataset.txt_to_img.tolist(), strict=True):
        out[img].append(text)
    return out


def semantic_captions(config: RunConfig, train_set: RetrievalDataset) -> dict[int, list[str]]:
    """The captions a loss's CaptionTfidf is fitted on, keyed by training image index: those of
    ``data.semantic_captions`` when set (a captions file of the training split, read with the
    checks of :func:`vlret.data.captioning_files.read_captions_file`), else the training
    captions (:func:`train_captions_by_image`)."""
    path = config.data.semantic_captions
    if path is None:
        return train_captions_by_image(train_set)
    from ..data.captioning_files import read_captions_file

    file = read_captions_file(
        path,
        num_images=train_set.num_images,
        split=config.data.train_split,
        key="data.semantic_captions",
    )
    k = file.captions_per_image
    return {i: list(file.captions[i * k : (i + 1) * k]) for i in range(train_set.num_images)}


def build_run_loss(
    config: RunConfig, train_set: RetrievalDataset | None, *, model: nn.Module | None = None
) -> PairLoss:
    """The configured loss, given what its capabilities say it needs
    (:func:`vlret.losses.loss_capabilities`).

    A loss that ``needs_semantics`` gets a CaptionTfidf fitted on the train captions, or on
    ``data.semantic_captions`` (:func:`semantic_captions`; keyed by image index, the ids the
    trainer passes); one that ``needs_embed_dim`` gets the model's
    ``embed_dim`` unless the config sets it. A loss that declares ``num_classes`` and ``dim``
    (the ``id`` classifier) gets, unless the config sets them, the number of training
    identities (the distinct ``image_identity`` values of the training set, i.e. its relabelled
    ``RetrievalBatch.identity`` values; without identities, its number of images: the ids are
    then the image indices) and the embedding width (the built ``model``'s ``embed_dim``
    attribute when ``model`` is given, else the config's ``model.embed_dim`` or
    ``model.proj_dim``). A combination (``"sdm+id"``) fills each part's table the same way.

    Raises:
        ValueError: The loss needs the training captions (or identities) and ``train_set`` is
            None.
        ConfigError: The loss cannot be built from its section (keyed ``loss``), or it needs an
            embedding width that neither the loss's table nor the model gives.
    """
    from ..losses import build_loss, loss_class

    params = dict(config.loss.params)
    parts = getattr(loss_class(config.loss.name), "part_names", ())
    for part in parts:  # a combination: each part's own table
        table = params.get(part)
        params[part] = _filled_loss_params(
            part, dict(table or {}), config, train_set, model, f"loss.{part}"
        )
    if not parts:
        params = _filled_loss_params(config.loss.name, params, config, train_set, model, "loss")
    try:
        return build_loss(config.loss.name, **params)
    except (ValueError, TypeError) as err:
        given = ", ".join(f"{k}={v!r}" for k, v in config.loss.params.items())
        raise ConfigError(config.source, "loss", f"{config.loss.name}({given}): {err}") from None


def _filled_loss_params(
    name: str,
    params: dict[str, Any],
    config: RunConfig,
    train_set: RetrievalDataset | None,
    model: nn.Module | None,
    key: str,
) -> dict[str, Any]:
    """``params`` of the registered loss ``name`` with what the harness builds for it (see
    :func:`build_run_loss`); ``key`` is its config table (``loss`` or ``loss.<part>``)."""
    from ..losses import loss_capabilities, loss_parameters

    needs = loss_capabilities(name, params)
    if needs.needs_semantics:
        if train_set is None:
            raise ValueError(f"loss {name!r} needs the training captions to fit its CaptionTfidf")
        from ..semantic import CaptionTfidf

        params["semantic"] = CaptionTfidf().fit(semantic_captions(config, train_set))
    if needs.needs_embed_dim and "embed_dim" not in params:
        embed_dim = config.model.get("embed_dim")
        if not isinstance(embed_dim, int):
            raise ConfigError(
                config.source,
                f"{key}.embed_dim",
                "needed by the memory queue (or set model.embed_dim)",
            )
        params["embed_dim"] = embed_dim
    declared = loss_parameters(name)
    if "num_classes" in declared and params.get("num_classes") is None:
        if train_set is None:
            raise ValueError(f"loss {name!r} needs the training set to count its identities")
        identity = getattr(train_set, "image_identity", None)
        if identity is not None:
            params["num_classes"] = int(torch.unique(torch.as_tensor(identity)).numel())
        elif isinstance(getattr(train_set, "num_images", None), int):
            params["num_classes"] = train_set.num_images  # each image its own class (its index)
        else:
            raise ConfigError(
                config.source,
                f"{key}.num_classes",
                f"the number of training identities of loss {name!r}: this training set does "
                "not count them, set it",
            )
    if "dim" in declared and params.get("dim") is None:
        dims = (
            getattr(model, "embed_dim", None),
            config.model.get("embed_dim"),
            config.model.get("proj_dim"),
        )
        # proj_dim = 0: no added layer, the width is the model's own (known once it is built)
        dim = next(
            (d for d in dims if isinstance(d, int) and not isinstance(d, bool) and d > 0), None
        )
        if dim is None:
            raise ConfigError(
                config.source,
                f"{key}.dim",
                "the embedding width of the identity classifier: set it (or model.embed_dim)",
            )
        params["dim"] = dim
    return params
