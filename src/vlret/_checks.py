"""Input validation shared by the losses and metrics.

Every check raises ``ValueError`` naming the offending argument and what was expected, so a
bad batch fails loudly at the call site instead of producing a silent NaN three steps later.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from typing import Any, Protocol

import torch

REDUCTIONS = ("sum", "mean", "none")

_HALF = (torch.float16, torch.bfloat16)


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype a loss computes in: float32 for half-precision inputs, else the input dtype."""
    if dtype in _HALF:
        return torch.float32
    if not dtype.is_floating_point:
        raise ValueError(f"expected a floating-point tensor, got dtype {dtype}")
    return dtype


def check_finite(t: torch.Tensor, name: str) -> None:
    if not bool(torch.isfinite(t).all()):
        raise ValueError(f"{name} contains NaN or inf values")


def check_similarity(sim: torch.Tensor, name: str = "sim") -> None:
    """A loss similarity matrix: 2-D, square, at least 2 x 2, floating point and finite."""
    if not isinstance(sim, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(sim).__name__}")
    if sim.dim() != 2:
        raise ValueError(f"{name} must be 2-D (B, B), got shape {tuple(sim.shape)}")
    if sim.shape[0] != sim.shape[1]:
        raise ValueError(
            f"{name} must be square (B, B) with positives on the diagonal, "
            f"got shape {tuple(sim.shape)}"
        )
    if sim.shape[0] < 2:
        empty = " (an empty batch)" if sim.shape[0] == 0 else ""
        raise ValueError(
            f"{name} needs a batch size of at least 2 to have negatives, got {sim.shape[0]}{empty}"
        )
    if not sim.dtype.is_floating_point:
        raise ValueError(f"{name} must be floating point, got dtype {sim.dtype}")
    check_finite(sim, name)


def check_pos_mask(pos_mask: torch.Tensor | None, size: int, device: torch.device) -> torch.Tensor:
    """Return the (B, B) bool mask of all positives, diagonal included."""
    eye = torch.eye(size, dtype=torch.bool, device=device)
    if pos_mask is None:
        return eye
    if not isinstance(pos_mask, torch.Tensor):
        raise ValueError(f"pos_mask must be a torch.Tensor, got {type(pos_mask).__name__}")
    if pos_mask.dtype != torch.bool:
        raise ValueError(f"pos_mask must have dtype torch.bool, got {pos_mask.dtype}")
    if tuple(pos_mask.shape) != (size, size):
        raise ValueError(
            f"pos_mask must have shape ({size}, {size}) like sim, got {tuple(pos_mask.shape)}"
        )
    return pos_mask.to(device) | eye


def check_reduction(reduction: str) -> None:
    if reduction not in REDUCTIONS:
        raise ValueError(f"reduction must be one of {REDUCTIONS}, got {reduction!r}")


def _is_number(value: Any) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def check_positive(value: float | torch.Tensor, name: str) -> None:
    """A positive finite number; a tensor (a learnable temperature) is not inspected."""
    if isinstance(value, torch.Tensor):
        return
    if not (_is_number(value) and 0 < value < math.inf):
        raise ValueError(f"{name} must be a positive finite number, got {value!r}")


def check_real(value: float | torch.Tensor, name: str) -> None:
    if isinstance(value, torch.Tensor):
        check_finite(value, name)
        return
    if not (_is_number(value) and math.isfinite(value)):
        raise ValueError(f"{name} must be a finite number, got {value!r}")


def check_embeddings(img_emb: torch.Tensor, txt_emb: torch.Tensor, *, finite: bool = True) -> None:
    """Paired batch embeddings: two 2-D float tensors of identical shape (B, D), finite
    unless ``finite=False`` (a caller that checks finiteness later, where it costs nothing
    on a finite batch, and still names ``img_emb`` / ``txt_emb``)."""
    for name, t in (("img_emb", img_emb), ("txt_emb", txt_emb)):
        if not isinstance(t, torch.Tensor):
            raise ValueError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() != 2:
            raise ValueError(f"{name} must be 2-D (B, D), got shape {tuple(t.shape)}")
        if not t.dtype.is_floating_point:
            raise ValueError(f"{name} must be floating point, got dtype {t.dtype}")
        if t.shape[0] == 0:
            raise ValueError(
                f"{name} is empty: got 0 rows; a loss needs a batch of at least 2 pairs"
            )
    if img_emb.shape != txt_emb.shape:
        raise ValueError(
            "img_emb and txt_emb must have the same shape (B, D) for paired batches, got "
            f"{tuple(img_emb.shape)} and {tuple(txt_emb.shape)}"
        )
    if finite:  # named here, before a score matrix built from them would report "sim"
        check_finite(img_emb, "img_emb")
        check_finite(txt_emb, "txt_emb")


# ----------------------------------------------------------------------------- parameters
#
# A loss family declares each parameter once, with its constraint (``vlret.losses.params``);
# the constructor and ``registry.check_loss_params`` (which never builds the loss) both check
# values by building that declaration's record.


class ParamError(ValueError):
    """A parameter outside its declared constraint. ``param`` names it (a dotted path for a
    nested one, e.g. ``base_params.margin``); the message starts with that name."""

    def __init__(self, param: str, message: str) -> None:
        super().__init__(message)
        self.param = param

    def nested(self, prefix: str) -> ParamError:
        """The same error for the parameter seen as ``prefix.param``."""
        message = str(self)
        if message.startswith(self.param):
            message = f"{prefix}.{message}"
        else:
            message = f"{prefix}: {message}"
        return ParamError(f"{prefix}.{self.param}", message)


class ParamSpec(Protocol):
    def check(self, value: Any, name: str) -> None: ...

    def type_mismatch(self, value: Any) -> str | None:
        """What a config file should have written, in its words (``"expected true or
        false"``), when ``value``'s type does not fit; ``None`` when it does (the range is
        :meth:`check`'s)."""
        ...


def _fmt(bound: float | None) -> str:
    # None only where a caller's tuple index hides that the bound was checked for None.
    return f"{bound:g}" if isinstance(bound, float) else str(bound)


@dataclass(frozen=True)
class Number:
    """A real (or ``integer``) parameter within optional bounds; ``optional``: ``None`` too.

    Messages: a wrong type or a non-finite value, ``"<name> must be <expected>, got <value>"``
    (``expected`` such as ``a finite number >= 0``); a value out of range,
    ``"<name> must be <range>, got <value>"`` (``>= 0``, ``in (0, 1)``).
    """

    gt: float | None = None
    ge: float | None = None
    lt: float | None = None
    le: float | None = None
    integer: bool = False
    optional: bool = False

    def range_text(self) -> str:
        low = None if self.gt is None and self.ge is None else (self.gt, self.ge)
        high = None if self.lt is None and self.le is None else (self.lt, self.le)
        if low and high:
            left = f"({_fmt(low[0])}" if low[0] is not None else f"[{_fmt(low[1])}"
            right = f"{_fmt(high[0])})" if high[0] is not None else f"{_fmt(high[1])}]"
            return f"in {left}, {right}"
        if low:
            return f"> {_fmt(low[0])}" if low[0] is not None else f">= {_fmt(low[1])}"
        if high:
            return f"< {_fmt(high[0])}" if high[0] is not None else f"<= {_fmt(high[1])}"
        return ""

    def expected(self) -> str:
        noun = "an integer" if self.integer else "a finite number"
        text = f"{noun} {self.range_text()}".rstrip()
        return f"{text} or None" if self.optional else text

    def type_mismatch(self, value: Any) -> str | None:
        if value is None or (not isinstance(value, bool) and isinstance(value, int | float)):
            return "expected an integer" if self.integer and isinstance(value, float) else None
        return "expected an integer" if self.integer else "expected a number"

    def check(self, value: Any, name: str) -> None:
        if value is None and self.optional:
            return
        if self.integer:
            # Python ints only: the queue and tiled code test isinstance(value, int).
            ok = isinstance(value, int) and not isinstance(value, bool)
        else:
            ok = _is_number(value) and math.isfinite(value)
        if not ok:
            shown = f"{value!r} ({type(value).__name__})" if not _is_number(value) else repr(value)
            raise ParamError(name, f"{name} must be {self.expected()}, got {shown}")
        in_range = (
            (self.gt is None or value > self.gt)
            and (self.ge is None or value >= self.ge)
            and (self.lt is None or value < self.lt)
            and (self.le is None or value <= self.le)
        )
        if not in_range:
            alt = " (or None)" if self.optional else ""
            raise ParamError(name, f"{name} must be {self.range_text()}{alt}, got {value!r}")


@dataclass(frozen=True)
class Flag:
    """A ``bool`` parameter (``True`` or ``False``, not a truthy stand-in)."""

    def type_mismatch(self, value: Any) -> str | None:
        return None if value is None or isinstance(value, bool) else "expected true or false"

    def check(self, value: Any, name: str) -> None:
        if not isinstance(value, bool):
            raise ParamError(name, f"{name} must be a bool (True or False), got {value!r}")


@dataclass(frozen=True)
class Choice:
    """A parameter taking one of a fixed set of values (strings)."""

    options: tuple[Any, ...]

    def type_mismatch(self, value: Any) -> str | None:
        strings = all(isinstance(o, str) for o in self.options)
        return "expected a string" if strings and not isinstance(value, str | None) else None

    def check(self, value: Any, name: str) -> None:
        if not any(value == o and type(value) is type(o) for o in self.options):
            raise ParamError(name, f"{name} must be one of {self.options}, got {value!r}")


#: Shared declarations.
FLAG = Flag()
POSITIVE = Number(gt=0)
NON_NEGATIVE = Number(ge=0)
REAL = Number()
#: A margin by which a positive must beat a negative (triplet, Unified, GOAL ``T^con``).
MARGIN = NON_NEGATIVE
REDUCTION = Choice(REDUCTIONS)
#: The tile height of a tiled loss (``None``: the dense form), the one spec of ``chunk_size``.
CHUNK_SIZE = Number(integer=True, ge=1, optional=True)
