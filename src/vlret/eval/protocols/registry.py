"""The protocol record and its registry.

A protocol says what an evaluation scores and how it reports it: the paper's test set and its
sizes, the splits it accepts per data format, its folds, what counts as relevant and which
metrics it reports. The modules of this package register the protocols of one family each;
adding a protocol is one such module (and its test).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from ...metrics import (
    IDENTITY_METRIC_KEYS,
    ZEROSHOT_METRICS,
    Relevance,
    RetrievalMetrics,
    get_relevance,
    relevance_names,
)

#: What counts as relevant to a query: the names of the relevance kinds
#: (:mod:`vlret.metrics.relevance_kinds`, each an object with its capabilities).
RELEVANCE_KINDS = relevance_names()
#: The metrics a retrieval protocol reports by default: the recalls, rsum and ranks.
RETRIEVAL_METRICS = tuple(k for k in RetrievalMetrics.__dataclass_fields__ if k != "folds")
#: The metrics a class-label protocol may report (:mod:`vlret.metrics.zeroshot`).
CLASSIFICATION_METRICS = ZEROSHOT_METRICS
#: The metrics a same-identity protocol may report: each direction's
#: :func:`~vlret.metrics.identity_retrieval_metrics` (``identity_t2i_r1`` ...
#: ``identity_i2t_minp``, :data:`vlret.metrics.IDENTITY_METRIC_KEYS`).
IDENTITY_METRICS = IDENTITY_METRIC_KEYS


@dataclass(frozen=True)
class EvalProtocol:
    """One evaluation protocol (a registry entry, :func:`register_protocol`)."""

    #: the ``vlret eval --protocol`` name
    name: str
    #: the table title when the paper's test set is scored
    title: str
    #: the paper's test set: its name, the splits that hold it and its images (videos) x texts
    paper_set: str
    paper_splits: tuple[str, ...]
    paper_images: int
    paper_texts: int
    #: data format -> the splits this protocol evaluates (kept read-only)
    splits: Mapping[str, tuple[str, ...]]
    #: a one-line summary of what is scored, for ``vlret protocols``
    summary: str
    #: equal folds of images averaged (COCO 1K: 5); 1 = the whole split at once
    folds: int = 1
    #: for a folded protocol's error on a split that does not divide: the set the paper folds
    #: (default :attr:`paper_set`) and the protocol scoring it whole, if any
    fold_set: str = ""
    unfolded: str | None = None
    #: the relevance kind's registry name (:func:`vlret.metrics.get_relevance`);
    #: :attr:`relevance_kind` is the object
    relevance: str = "image-of-caption"
    #: the metrics it reports (keys of :class:`~vlret.metrics.RetrievalMetrics`; of
    #: :data:`CLASSIFICATION_METRICS` for ``class-label`` relevance, of
    #: :data:`IDENTITY_METRICS` for ``same-identity`` relevance)
    metrics: tuple[str, ...] = RETRIEVAL_METRICS
    #: the data set's own protocol option (MSR-VTT's caption set: ``full`` or ``1k-A``)
    data_protocol: str | None = None
    #: the data formats whose comparisons (``vlret compare``) use this protocol unless they
    #: name one (:func:`default_protocol`; at most one protocol per format)
    default_for: tuple[str, ...] = ()
    #: identity-level protocols: the persons of the paper's test set (0 = not given)
    paper_identities: int = 0
    #: what the protocol must say besides its summary (ICFG-PEDES: no validation split)
    note: str = ""

    def __post_init__(self) -> None:
        try:
            kind = get_relevance(self.relevance)
        except ValueError as err:
            raise ValueError(f"protocol {self.name}: {err}") from None
        known = kind.metrics
        unknown = [m for m in self.metrics if m not in known]
        if unknown:
            raise ValueError(f"protocol {self.name}: unknown metrics {unknown}")
        if isinstance(self.folds, bool) or not isinstance(self.folds, int) or self.folds < 1:
            raise ValueError(f"protocol {self.name}: folds must be a positive integer")
        missing = [f for f in self.default_for if f not in self.splits]
        if missing:
            raise ValueError(
                f"protocol {self.name}: default_for names {', '.join(missing)}, a format whose "
                "splits it does not evaluate"
            )
        if not isinstance(self.splits, MappingProxyType):
            object.__setattr__(self, "splits", MappingProxyType(dict(self.splits)))

    @property
    def visual(self) -> str:
        """The table's word for the visual side (``image`` or ``video``)."""
        return self.relevance_kind.visual

    @property
    def relevance_kind(self) -> Relevance:
        """What counts as relevant, as an object: its directions, labels and capabilities."""
        return get_relevance(self.relevance)

    def check_split(self, split: str, data_format: str) -> None:
        """Raise ``ValueError`` unless this protocol evaluates ``split`` of ``data_format``."""
        if data_format not in self.splits:
            raise ValueError(
                f"protocol {self.name} needs {' or '.join(self.splits)} data; the checkpoint "
                f"was trained on {data_format} data"
            )
        if split not in self.splits[data_format]:
            raise ValueError(
                f"protocol {self.name} on {data_format} data evaluates the split(s) "
                f"{', '.join(self.splits[data_format])}, not {split!r}"
            )

    def check_folds(self, n_images: int) -> None:
        """Raise ``ValueError`` (in this protocol's words) unless ``n_images`` images split into
        :attr:`folds` equal folds."""
        if self.folds > 1 and n_images % self.folds:
            fold_set = self.fold_set or self.paper_set
            size = self.paper_images // self.folds
            instead = f" (use {self.unfolded})" if self.unfolded else ""
            raise ValueError(
                f"{self.name} averages {self.folds} folds of equal size ({fold_set}: "
                f"{self.folds} x {size} images); this split has {n_images} images, not "
                f"divisible by {self.folds}{instead}"
            )

    def title_for(self, split: str | None, n_images: int, n_texts: int) -> str:
        """The table title: :attr:`title` only when ``split`` and the sizes are the paper's
        test set; otherwise what was actually scored (``images`` or ``videos``, :attr:`visual`),
        marked as not the paper's set. ``vlret eval`` and ``vlret compare`` both title by it."""
        paper = (self.paper_images, self.paper_texts)
        if split in self.paper_splits and (n_images, n_texts) == paper:
            return self.title
        items = f"{self.visual}s"  # images, or videos for MSR-VTT
        folds = ""
        if self.folds > 1:
            folds = f", {self.folds} folds of {n_images // self.folds} {items}"
        return (
            f"{self.paper_set} protocol on {split or 'a'} split of {n_images} {items} x "
            f"{n_texts} texts{folds} (not the paper's test set: {'/'.join(self.paper_splits)}, "
            f"{self.paper_images} x {self.paper_texts})"
        )

    def accepted(self, *, sep: str = "; ") -> str:
        """The accepted splits per data format, e.g. ``precomp test/dev; karpathy test/dev``."""
        return sep.join(f"{fmt} {'/'.join(s)}" for fmt, s in self.splits.items())

    def line(self) -> str:
        """One line for ``vlret protocols``: name, summary and the accepted splits."""
        note = f" ({self.note})" if self.note else ""
        return f"{self.name:<12} {self.summary} [{self.accepted()}]{note}"


_REGISTRY: dict[str, EvalProtocol] = {}


def register_protocol(protocol: EvalProtocol) -> EvalProtocol:
    """Add ``protocol`` to the registry (a second protocol of the same name is an error)."""
    if protocol.name in _REGISTRY:
        raise ValueError(f"protocol {protocol.name!r} is registered twice")
    for fmt in protocol.default_for:
        taken = default_protocol(fmt)
        if taken is not None:
            raise ValueError(
                f"protocol {protocol.name}: {taken.name} is already the default for {fmt} data"
            )
    _REGISTRY[protocol.name] = protocol
    return protocol


def protocol_names() -> tuple[str, ...]:
    """The registered protocols' names, in registration order."""
    return tuple(_REGISTRY)


def get_protocol(protocol: str | EvalProtocol) -> EvalProtocol:
    """The registered protocol named ``protocol`` (a record is returned as is)."""
    if isinstance(protocol, EvalProtocol):
        return protocol
    if protocol not in _REGISTRY:
        raise ValueError(f"protocol must be one of {', '.join(_REGISTRY)}, got {protocol!r}")
    return _REGISTRY[protocol]


def eval_splits() -> tuple[str, ...]:
    """Every split some registered protocol evaluates: the paper's test splits first, then the
    others (``dev``), each once in registration order (``vlret eval --split`` choices)."""
    paper = [s for p in _REGISTRY.values() for s in p.paper_splits]
    other = [s for p in _REGISTRY.values() for splits in p.splits.values() for s in splits]
    return tuple(dict.fromkeys(paper + other))


def default_protocol(data_format: str) -> EvalProtocol | None:
    """The protocol whose :attr:`~EvalProtocol.default_for` names ``data_format`` (``None``
    if none does)."""
    for protocol in _REGISTRY.values():
        if data_format in protocol.default_for:
            return protocol
    return None


__all__ = [
    "IDENTITY_METRICS",
    "RELEVANCE_KINDS",
    "RETRIEVAL_METRICS",
    "EvalProtocol",
    "default_protocol",
    "eval_splits",
    "get_protocol",
    "protocol_names",
    "register_protocol",
]
