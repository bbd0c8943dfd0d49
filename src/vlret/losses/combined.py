"""Weighted combinations of registered losses: ``"sdm+id"``, ``"cmpm+id"``, ``"adacl+id"``.

A name that joins registered loss names with ``+`` is the loss

    L = sum_k w_k L_k(img_emb, txt_emb, img_ids, txt_ids),

each part ``L_k`` built from its own parameters and called as it would be alone (the same
embeddings and ids; its own reduction, normalisation, tile height and inputs), ``w_k`` its
weight (default 1). IRRA's ``--loss_names sdm+id`` is ``"sdm+id"``; CMPM + CMPC is
``"cmpm+id"`` (IRRA's ID loss, see :mod:`vlret.losses.identity`); AdaCL may be a part.

In Python::

    build_loss("sdm+id", weights={"sdm": 1.0, "id": 1.0}, id={"num_classes": 11003, "dim": 512})

In a config file, the list form ``name = ["sdm", "id"]`` is the same as ``name = "sdm+id"``;
``weights`` is a table keyed by part and each part's parameters are a sub-table named by the
part::

    [loss]
    name = "sdm+id"
    weights = { sdm = 1.0, id = 1.0 }

    [loss.sdm]
    scale = 50.0

    [loss.id]           # num_classes and dim: filled from the training set and the model

The parts' reductions must agree on ``"none"`` (all or none of them; a weighted sum of a
``(B,)`` vector and a scalar has no meaning); a part's ``reduction`` and ``normalize`` are set
in its own table, never at the top. What the combination needs and offers
(:class:`~vlret.losses.LossCapabilities`) is the union of what its parts need (semantics, an
embedding width, a queue, momentum keys, a warm-up) and, for local shards, what all of them
offer (a part whose terms are per pair, the ID loss, takes a shard without tiles). The
module holds its parts in ``parts`` (an ``nn.ModuleDict``), so their parameters
(an ID classifier, a learnable scale) and buffers (AdaCL's margins) train and checkpoint with
it under ``parts.<name>.``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, cast

import torch
from torch import nn

from .._checks import NON_NEGATIVE, ParamError
from ._base import LossCapabilities, PairLoss
from .params import LossParams, param
from .registry import (
    available_losses,
    build_loss,
    check_loss_params,
    loss_capabilities,
    loss_class,
    loss_parameters,
    register_combiner,
)
from .step import StepInputs


def combined_parts(name: str) -> tuple[str, ...]:
    """The parts of a ``"a+b"`` name, each a registered loss, in order.

    Raises:
        ValueError: Fewer than two parts, an empty, unknown or repeated part, naming it.
    """
    parts = tuple(p.strip() for p in name.split("+"))
    if len(parts) < 2 or any(not p for p in parts):
        raise ValueError(f"loss {name!r}: a combination joins two or more loss names with '+'")
    known = available_losses()
    for p in parts:
        if p not in known:
            raise ValueError(
                f"loss {name!r}: unknown part {p!r}; available losses: {', '.join(known)}"
            )
    repeated = sorted({p for p in parts if parts.count(p) > 1})
    if repeated:
        raise ValueError(f"loss {name!r}: part {repeated[0]!r} appears twice; weight it instead")
    return parts


@dataclass(frozen=True, kw_only=True)
class CombinedParams(LossParams):
    """Parameters of a combination: ``weights`` and one mapping per part (the class made for
    each combination adds the parts' fields, named by the parts)."""

    weights: dict[str, float] | None = param(
        None, None, "weight of each part, keyed by part (default 1 each)", passed=False
    )
    reduction: str | None = param(  # type: ignore[assignment]
        None, None, "set in each part's parameters", passed=False, config=False
    )
    normalize: bool | None = param(  # type: ignore[assignment]
        None, None, "set in each part's parameters", passed=False, config=False
    )

    #: The parts, in order (set on the class made for each combination).
    part_names: ClassVar[tuple[str, ...]] = ()

    def part_params(self, part: str) -> dict[str, Any]:
        """The parameters given to ``part`` (a copy; empty when none were)."""
        return dict(getattr(self, part) or {})

    def check_relations(self) -> None:
        """Each part's parameters checked as that loss's, the weights (a non-negative number per
        part) and the parts' reductions (all ``"none"`` or none).

        Raises:
            ParamError: Naming the part and key (``sdm.scale``, ``weights.id``).
        """
        for name in ("reduction", "normalize"):
            if getattr(self, name) is not None:
                raise ParamError(
                    name,
                    f"{name} is set per part: give it in the part's parameters "
                    f"({self.part_names[0]} = {{{name} = ...}})",
                )
        weights = self.weights
        if weights is not None:
            if not isinstance(weights, Mapping):
                got = type(weights).__name__
                raise ParamError("weights", f"weights must be a table keyed by part, got {got}")
            for key, value in weights.items():
                if key not in self.part_names:
                    parts = ", ".join(self.part_names)
                    raise ParamError(
                        f"weights.{key}", f"weights.{key}: {key!r} is not a part ({parts})"
                    )
                NON_NEGATIVE.check(value, f"weights.{key}")
        none = []
        for part in self.part_names:
            given = getattr(self, part)
            if given is not None and not isinstance(given, Mapping):
                got = type(given).__name__
                raise ParamError(part, f"{part} must be a table of its parameters, got {got}")
            try:
                check_loss_params(part, given or {})
            except ParamError as err:
                raise err.nested(part) from None
            reduction = (given or {}).get("reduction", loss_parameters(part).get("reduction"))
            none.append(reduction == "none")
        if any(none) and not all(none):
            raise ParamError(
                "reduction",
                "reduction: the parts must all use reduction='none' or none of them, got "
                + ", ".join(
                    f"{p}={'none' if n else 'reduced'}"
                    for p, n in zip(self.part_names, none, strict=True)
                ),
            )


class CombinedLoss(PairLoss):
    """The weighted sum of its parts (see the module docstring); a class per combination is made
    by :func:`combined_class`, registered under the joined name."""

    paper = "weighted sum of losses"
    equation = "sum_k w_k L_k"
    Params: ClassVar[type[LossParams]] = CombinedParams
    config: CombinedParams
    #: The parts, in order.
    part_names: ClassVar[tuple[str, ...]] = ()

    def __init__(self, **params: Any) -> None:
        super().__init__(**params)
        self.parts = nn.ModuleDict(
            {p: build_loss(p, **self.config.part_params(p)) for p in self.part_names}
        )
        given = self.config.weights or {}
        #: The weight of each part.
        self.weights = {p: float(given.get(p, 1.0)) for p in self.part_names}

    def named_parts(self) -> list[tuple[str, PairLoss]]:
        """``(name, module)`` of each part, in order."""
        return [(name, cast(PairLoss, part)) for name, part in self.parts.items()]

    # -- what the combination needs and offers ---------------------------------------------

    @classmethod
    def capabilities(cls, params: Mapping[str, Any] | None = None) -> LossCapabilities:
        """The union of the parts' needs (configured with their tables in ``params``); local
        shards when every part takes them."""
        given = params or {}
        caps = []
        for p in cls.part_names:
            part = given.get(p)
            caps.append(loss_capabilities(p, part if isinstance(part, Mapping) else {}))
        return _union(caps, [loss_class(p) for p in cls.part_names])

    def current_capabilities(self) -> LossCapabilities:
        parts = [part for _, part in self.named_parts()]
        return _union([loss_capabilities(part) for part in parts], [type(p) for p in parts])

    @property
    def reduction(self) -> str:
        """``"none"`` when the parts return per-index terms, else ``"mean"`` or ``"sum"`` when
        they all reduce so, else ``"mixed"``."""
        found = {part.reduction for _, part in self.named_parts()}
        return found.pop() if len(found) == 1 else "mixed"

    @property
    def chunk_size(self) -> int | None:
        """The smallest tile height of the parts with a tiled form when every one of them sets
        one (the trainer then hands out local shards), else ``None``."""
        tiles = [
            part.chunk_size
            for _, part in self.named_parts()
            if "chunk_size" in type(part).Params.names()
        ]
        if not tiles or any(t is None for t in tiles):
            return None
        return min(t for t in tiles if t is not None)

    def step_inputs(self) -> frozenset[str]:
        """Every input some part declares."""
        out: frozenset[str] = frozenset()
        for _, part in self.named_parts():
            out |= part.step_inputs()
        return out

    # -- the loss ---------------------------------------------------------------------------

    def _weighted(self, values: dict[str, torch.Tensor]) -> torch.Tensor:
        total: torch.Tensor | None = None
        for name, value in values.items():
            term = self.weights[name] * value
            total = term if total is None else total + term
        assert total is not None  # two parts or more
        return total

    def forward(
        self,
        img_emb: torch.Tensor,
        txt_emb: torch.Tensor,
        img_ids: Any = None,
        txt_ids: Any = None,
        *,
        shard: tuple[int, int] | None = None,
        **inputs: Any,
    ) -> torch.Tensor:
        """``sum_k w_k part_k(img_emb, txt_emb, img_ids, txt_ids, ...)``; each of ``inputs``
        goes to the parts that declare it (:meth:`PairLoss.step_inputs`), ``shard`` to all.

        Raises:
            ValueError: An input no part takes, or an error of a part (which names it).
        """
        unused = sorted(set(inputs) - self.step_inputs())
        if unused:
            raise ValueError(f"loss {self.registry_name!r}: no part takes {unused}")
        values = {}
        for name, part in self.named_parts():
            kw = {k: v for k, v in inputs.items() if k in part.step_inputs()}
            if shard is not None:
                kw["shard"] = shard
            values[name] = self._call(name, part, img_emb, txt_emb, img_ids, txt_ids, **kw)
        return self._weighted(values)

    def _call(self, name: str, part: nn.Module, *args: Any, **kw: Any) -> torch.Tensor:
        try:
            return part(*args, **kw)
        except ValueError as err:
            raise ValueError(f"loss {self.registry_name!r}, part {name!r}: {err}") from err

    def forward_step(
        self, img_emb: torch.Tensor, txt_emb: torch.Tensor, inputs: StepInputs
    ) -> torch.Tensor:
        """Each part's :meth:`PairLoss.forward_step` (it takes the inputs it declared),
        weighted and summed."""
        values = {}
        for name, part in self.named_parts():
            try:
                values[name] = part.forward_step(img_emb, txt_emb, inputs)
            except ValueError as err:
                raise ValueError(f"loss {self.registry_name!r}, part {name!r}: {err}") from err
        return self._weighted(values)

    def similarity_step(self, sim: torch.Tensor, inputs: StepInputs) -> torch.Tensor:
        """Each part's :meth:`PairLoss.similarity_step`, weighted and summed (a part that needs
        embeddings, such as ``id``, raises)."""
        values = {}
        for name, part in self.named_parts():
            try:
                values[name] = part.similarity_step(sim, inputs)
            except ValueError as err:
                raise ValueError(f"loss {self.registry_name!r}, part {name!r}: {err}") from err
        return self._weighted(values)

    def from_similarity(
        self, sim: torch.Tensor, pos_mask: torch.Tensor | None = None, **inputs: Any
    ) -> torch.Tensor:
        """Each part's :meth:`PairLoss.from_similarity`, weighted and summed.

        Raises:
            ValueError: A part that needs embeddings (``id``), naming it.
        """
        values = {}
        for name, part in self.named_parts():
            try:
                values[name] = part.from_similarity(sim, pos_mask, **inputs)
            except ValueError as err:
                raise ValueError(f"loss {self.registry_name!r}, part {name!r}: {err}") from err
        return self._weighted(values)

    # -- training-time services of the parts ---------------------------------------------------

    def set_all_negatives(self, all_negatives: bool) -> None:
        """Switch the parts that have a hardest-negative phase (VSE-infinity's warm-up).

        Raises:
            ValueError: No part has one.
        """
        warm = [p for _, p in self.named_parts() if loss_capabilities(p).all_negatives_warmup]
        if not warm:
            super().set_all_negatives(all_negatives)
        for part in warm:
            part.set_all_negatives(all_negatives)

    @property
    def last_stats(self) -> dict[str, Any]:
        """The parts' statistics (a key two parts share is prefixed with ``<part>_``)."""
        stats = [(n, part.last_stats) for n, part in self.named_parts()]
        seen: dict[str, int] = {}
        for _, s in stats:
            for key in s:
                seen[key] = seen.get(key, 0) + 1
        return {(k if seen[k] == 1 else f"{n}_{k}"): v for n, s in stats for k, v in s.items()}

    def synced_buffers(self) -> tuple[torch.Tensor, ...]:
        """The buffers every rank must hold equal, of every part that has them (AdaCL)."""
        out: tuple[torch.Tensor, ...] = ()
        for _, part in self.named_parts():
            synced = getattr(part, "synced_buffers", None)
            if callable(synced):
                out += tuple(synced())
        return out

    def extra_repr(self) -> str:
        return "weights={" + ", ".join(f"{k}: {v:g}" for k, v in self.weights.items()) + "}"


def _union(caps: list[LossCapabilities], classes: list[type]) -> LossCapabilities:
    """What the parts need, together; local shards when some part takes them and every other
    part's terms are per pair (``pairwise_terms``: the ID loss)."""
    pairwise = [getattr(cls, "pairwise_terms", False) for cls in classes]
    return LossCapabilities(
        local_shards=any(c.local_shards for c in caps)
        and all(c.local_shards or p for c, p in zip(caps, pairwise, strict=True)),
        all_negatives_warmup=any(c.all_negatives_warmup for c in caps),
        needs_semantics=any(c.needs_semantics for c in caps),
        needs_embed_dim=any(c.needs_embed_dim for c in caps),
        owns_queue=any(c.owns_queue for c in caps),
        momentum_keys=any(c.momentum_keys for c in caps),
        similarity_inputs=tuple(dict.fromkeys(n for c in caps for n in c.similarity_inputs)),
        paper_comparison=None,
        offline_negatives=any(c.offline_negatives for c in caps),
        train_identities=any(c.train_identities for c in caps),
        masked_language=any(c.masked_language for c in caps),
    )


_CLASSES: dict[tuple[str, ...], type[CombinedLoss]] = {}


def combined_class(name: str) -> type[CombinedLoss]:
    """The class of the combination ``name`` (``"sdm+id"``), made once per combination.

    Its ``Params`` holds ``weights`` and one field per part named by the part; its
    ``registry_name`` is the parts joined by ``+`` without spaces.

    Raises:
        ValueError: A bad combination name (see :func:`combined_parts`).
    """
    parts = combined_parts(name)
    cls = _CLASSES.get(parts)
    if cls is None:
        joined = "+".join(parts)
        fields = [
            (p, dict[str, Any] | None, param(None, None, f"parameters of the {p!r} part"))
            for p in parts
        ]
        params = dataclasses.make_dataclass(
            f"CombinedParams[{joined}]",
            fields,
            bases=(CombinedParams,),
            frozen=True,
            kw_only=True,
            namespace={"part_names": parts},
        )
        made = cast(
            "type[CombinedLoss]",
            type(
                f"CombinedLoss[{joined}]",
                (CombinedLoss,),
                {"Params": params, "part_names": parts, "__module__": __name__},
            ),
        )
        made.registry_name = joined
        made.paper = " + ".join(loss_class(p).paper or p for p in parts)
        made.equation = " + ".join(f"w_{p} L_{p}" for p in parts)
        cls = _CLASSES[parts] = made
    return cls


register_combiner(combined_class)

__all__ = ["CombinedLoss", "CombinedParams", "combined_class", "combined_parts"]
