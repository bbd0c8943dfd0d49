"""The ``[loss]`` section of a run config: its record (:class:`LossConfig`), its checks against
the loss's own declaration (:func:`loss_config`), what a ``--set loss.name=...`` keeps of the
old loss's parameters (:func:`switch_loss`) and what the loss decides elsewhere in the config
(the model's evaluation scoring, the momentum encoder's use)."""

from __future__ import annotations

import copy
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from typing import Any

from .config_files import ConfigError


@dataclass
class LossConfig:
    """``name`` of a registered loss and its constructor ``params``."""

    name: str
    params: dict[str, Any] = field(default_factory=dict)


def loss_config(raw: Any, source: str, model: dict[str, Any]) -> LossConfig:
    """The ``[loss]`` section checked against the loss's declaration (a registered name or an
    ``"a+b"`` combination, or its list form): unknown keys, types and declared ranges are
    :class:`ConfigError` s naming ``loss.<key>``; ``model`` supplies ``embed_dim`` where the
    trainer will."""
    from .._checks import ParamError
    from ..losses import available_losses, loss_class
    from ..losses.params import info

    if not isinstance(raw, dict):
        raise ConfigError(source, "loss", f"expected a table/mapping, got {raw!r}")
    if "name" not in raw:
        raise ConfigError(source, "loss.name", "required key is missing")
    name = raw["name"]
    if isinstance(name, list):  # the list form of a combination: ["sdm", "id"] is "sdm+id"
        if not name or not all(isinstance(n, str) and "+" not in n for n in name):
            raise ConfigError(source, "loss.name", f"expected loss names, got {name!r}")
        name = "+".join(name)
    if not isinstance(name, str) or (name not in available_losses() and "+" not in name):
        raise ConfigError(
            source,
            "loss.name",
            f"unknown loss {name!r}; available: {', '.join(available_losses())}",
        )
    try:  # a combination "a+b" of registered losses (vlret.losses.combined)
        declaration = loss_class(name).Params
    except ValueError as err:
        raise ConfigError(source, "loss.name", str(err)) from None
    name = getattr(loss_class(name), "registry_name", name)  # "sdm + id" -> "sdm+id"
    try:
        params = declaration.canonical({k: v for k, v in raw.items() if k != "name"})
    except ParamError as err:
        raise ConfigError(source, f"loss.{err.param}", str(err)) from None
    fields = {f.name: f for f in declaration.fields() if info(f).config}
    for k in params:
        if k not in fields:
            raise ConfigError(
                source, f"loss.{k}", f"not a parameter of loss {name!r}; valid: {', '.join(fields)}"
            )
    for k, v in params.items():
        spec = info(fields[k]).spec  # the type in a config file's words; ranges below
        if spec is not None and (problem := spec.type_mismatch(v)) is not None:
            raise ConfigError(source, f"loss.{k}", f"{problem}, got {v!r}")
    checked = dict(params)
    if "embed_dim" in fields and "embed_dim" not in params and "embed_dim" in model:
        checked["embed_dim"] = model["embed_dim"]  # what the trainer passes (builders.py)
    try:  # each loss's declared ranges (a negative margin, a zero temperature, ...)
        declaration.build(checked, owner=f"loss {name!r}")
    except ParamError as err:
        raise ConfigError(source, f"loss.{err.param}", str(err)) from None
    return LossConfig(name=name, params=params)


def _declared_names(name: Any) -> set[str] | None:
    """The parameter names a config may give loss ``name`` (its declaration's config fields and
    the old names it still maps), or ``None`` where ``name`` is no loss (:func:`loss_config`
    then names the problem)."""
    from ..losses import loss_class
    from ..losses.params import info

    if isinstance(name, list) and all(isinstance(n, str) for n in name):
        name = "+".join(name)
    if not isinstance(name, str):
        return None
    try:
        declaration = loss_class(name).Params
    except ValueError:
        return None
    return {f.name for f in declaration.fields() if info(f).config} | set(declaration.renamed)


def switch_loss(
    raw: dict[str, Any],
    out: dict[str, Any],
    given: Collection[str],
    *,
    note: Callable[[str], None] | None,
) -> None:
    """After ``--set loss.name=NEW`` (``out``: ``raw`` with the overrides applied): drop from
    ``out["loss"]`` the parameters of the old loss (``raw``'s) that NEW does not declare, and
    tell ``note`` in one line which. A parameter the command line gave too (``given``: the
    ``loss`` keys the overrides set) is kept, and checked against NEW like any other
    (:func:`loss_config`). Which parameters a loss takes is read from its declaration, so a
    parameter both losses declare (``normalize``, a chunk size) carries over."""
    before, after = raw.get("loss"), out.get("loss")
    if not isinstance(before, dict) or not isinstance(after, dict):
        return
    old, new = before.get("name"), after.get("name")
    if old == new:
        return
    accepted = _declared_names(new)
    if accepted is None:  # an unknown name: loss_config's error lists the losses
        return
    dropped = [k for k in after if k in before and k not in ("name", *given, *accepted)]
    for key in dropped:
        del after[key]
    if dropped and note is not None:
        note(
            f"note: --set loss.name={new}: dropped the parameters of loss {old!r} that "
            f"{new!r} does not take: {', '.join(dropped)} (give one with --set to keep it)"
        )


def model_with_scoring(model: dict[str, Any], loss: LossConfig) -> dict[str, Any]:
    """The model section with its evaluation ``scoring`` (``cosine`` unless the loss sets
    ``normalize = false``), stored with the model so a checkpoint evaluates without its loss."""
    out = copy.deepcopy(model)
    out.setdefault("scoring", "cosine" if loss.params.get("normalize", True) else "dot")
    return out


def check_momentum_encoder(momentum: float, loss: LossConfig, source: str) -> None:
    """A loss whose memory queue takes momentum keys, for ``train.momentum_encoder`` (the
    momentum's range is its declaration's)."""
    from ..losses import loss_capabilities

    caps = loss_capabilities(loss.name, loss.params)
    if not (caps.owns_queue and caps.momentum_keys):
        raise ConfigError(
            source,
            "train.momentum_encoder",
            f"only used to fill a memory queue; loss {loss.name!r} with these parameters owns "
            "none that takes momentum keys (LossCapabilities.owns_queue, momentum_keys)",
        )
