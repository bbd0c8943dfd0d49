"""The checks of a run config that read more than one key (:mod:`vlret.run.config`), and the
sane sizes of the ``[model]`` section.

A single key's constraint is its declaration's (:mod:`vlret._settings`: the ``[data]``,
``[optim]`` and ``[train]`` fields, with their sane integer ranges such as
:data:`vlret._settings.MAX_EPOCHS`); here are the relations: a data format's own keys
(person search, MSR-VTT, noisy correspondence, captions files), AOQ's keys with the loss, the
model and the procedure, and ``train.select_on`` with the format.

``[model]`` has no declaration of its keys (``vlret.models.build_model`` checks them), so a
value so large that the run cannot start (``model.embed_dim = 10**8``) is refused here when
the config is read, as one :class:`ConfigError` naming the key and the value, instead of an
allocation traceback when the model is built. Read at any depth (e.g.
``model.text.word_dim``): a size (a key ending in ``_dim`` or ``_size``, ``max_frames``,
``vlad_clusters``, the per-expert sizes of ``experts``) is an integer in ``[1, MAX_DIM]``
(``vocab_size``: ``[1, MAX_VOCAB]``); a count (``num_*``, ``*_layers``, ``*_heads``,
``*_steps``) an integer in ``[0, MAX_COUNT]``; and the two largest sizes together, one weight
matrix's elements, at most :data:`MAX_MATRIX`. A float where an integer belongs is refused
(``embed_dim = 1e8``); values that are no number are left to the model's own checks.
"""

from __future__ import annotations

import re
from typing import Any

from ..data.formats import formats_where, get_format
from ..losses import loss_capabilities
from ..metrics import IDENTITY_METRIC_KEYS, normalise_metric_key
from .config_files import ConfigError

#: A model size: an embedding width, an input or hidden dimension, frames, clusters.
MAX_DIM = 65_536
#: A vocabulary size.
MAX_VOCAB = 2**24
#: A count of layers, heads or steps inside the model.
MAX_COUNT = 1024
#: Elements of one weight matrix (the two largest sizes' product): 4 GiB of float32.
MAX_MATRIX = 2**30

_SIZE_KEY = re.compile(r"^(?:.*_)?dim$|_size$|^(?:experts|max_frames|vlad_clusters)$")
_COUNT_KEY = re.compile(r"^num_|_layers$|_heads$|_steps$")


def _out_of_range(source: str, key: str, value: int, low: int, high: int) -> ConfigError:
    return ConfigError(source, key, f"expected an integer in [{low}, {high}], got {value!r}")


def check_model_sizes(model: dict[str, Any], source: str) -> None:
    """The ``[model]`` section's sizes and counts (see the module docstring), before any
    module is built."""
    sizes: list[tuple[int, str]] = []

    def visit(node: Any, prefix: str, kind: str | None) -> None:
        if isinstance(node, dict):
            for k, v in node.items():
                name = str(k)
                here = kind  # a table under a size key (per-expert sizes) keeps its kind
                if _SIZE_KEY.search(name):
                    here = "vocab" if name == "vocab_size" else "size"
                elif _COUNT_KEY.search(name):
                    here = "count"
                visit(v, f"{prefix}.{name}", here)
            return
        if kind is None or isinstance(node, bool) or not isinstance(node, (int, float)):
            return  # not a size, or no number: the model's own checks say what is expected
        if not isinstance(node, int):
            raise ConfigError(source, prefix, f"expected an integer, got {node!r}")
        if prefix == "model.proj_dim" and node == 0:
            return  # CLIP without an added layer (TOML has no null; models.retrieval)
        low, high = {"size": (1, MAX_DIM), "vocab": (1, MAX_VOCAB), "count": (0, MAX_COUNT)}[kind]
        if not low <= node <= high:
            raise _out_of_range(source, prefix, node, low, high)
        if kind != "count":
            sizes.append((node, prefix))

    visit(model, "model", None)
    if len(sizes) >= 2:
        (a, key_a), (b, key_b) = sorted(sizes, reverse=True)[:2]
        if a * b > MAX_MATRIX:
            raise ConfigError(
                source,
                key_a,
                f"{a} x {key_b} {b} = {a * b} elements in one weight matrix (more than "
                f"{MAX_MATRIX}, 4 GiB of float32); the model would not fit",
            )


def check_person_search(data: Any, raw_data: dict[str, Any], validate: Any, source: str) -> None:
    """Person search (:mod:`vlret.data.formats.pedes`): ``annotations`` is only read by its formats;
    model selection reads the whole validation split unless ``dev_max_images`` is given (as
    IRRA); ICFG-PEDES has no validation split: without ``dev_split`` it trains without
    validation (``best.pt`` is the last epoch), ``val`` / ``dev`` is an error, and checkpoints
    are selected on the test split only when ``dev_split = "test"`` says so by name."""
    record = get_format(data.format)
    if not record.identities:
        if data.annotations is not None:
            readers = formats_where(lambda f: "annotations" in f.owns)
            why = f"only read with formats {', '.join(readers)}"
            raise ConfigError(source, "data.annotations", why)
        return
    if "dev_max_images" not in raw_data:
        data.dev_max_images = None
    if "val" in record.splits:  # ICFG-PEDES has only train and test
        if data.dev_split not in (None, "val", "dev", "test"):
            why = f'expected "val" (or "dev"), "test" or null, got {data.dev_split!r}'
            raise ConfigError(source, "data.dev_split", why)
        return
    if "dev_split" not in raw_data:
        data.dev_split = None
    elif data.dev_split not in (None, "test") and validate is not False:
        raise ConfigError(
            source,
            "data.dev_split",
            f"{record.name.upper()} has no {data.dev_split!r} split (only train and test): set "
            "data.dev_split = null (no validation; best.pt is the last epoch) or "
            '"test" (checkpoints selected on the test split)',
        )


def check_msrvtt(data: Any, raw_data: dict[str, Any], validate: Any, source: str) -> None:
    """MSR-VTT (``data`` a :class:`~vlret.data.config.DataConfig`, whose ``dev_split`` this
    may clear): ``experts`` is "all" or names (no other format has experts); 1k-A has only
    train and test: no validation unless ``dev_split`` says test."""
    experts = data.experts
    record = get_format(data.format)
    if experts is not None and not record.experts:
        readers = " or ".join(repr(name) for name in formats_where(lambda f: f.experts))
        raise ConfigError(source, "data.experts", f"only format {readers} has expert features")
    names = ["all"] if experts == "all" else experts if isinstance(experts, list) else [None]
    if experts is not None and (not names or not all(isinstance(n, str) and n for n in names)):
        why = f'expected "all" or a non-empty list of expert names, got {experts!r}'
        raise ConfigError(source, "data.experts", why)
    if not record.experts:
        return
    from ..data.formats.msrvtt import normalise_protocol

    try:
        protocol = normalise_protocol(data.protocol)
    except ValueError as err:
        raise ConfigError(source, "data.protocol", str(err)) from None
    if protocol != "1k-A":
        return
    if "dev_split" not in raw_data:
        data.dev_split = None
    elif data.dev_split not in (None, "test") and validate is not False:
        raise ConfigError(
            source,
            "data.dev_split",
            f"MSR-VTT 1k-A has no {data.dev_split!r} split (only train and test); set "
            "data.dev_split = null (no validation; best.pt is the last epoch)",
        )


def check_noise(data: Any, source: str) -> None:
    """Noisy correspondence on the training split (:mod:`vlret.data.noisy`; ``noise_format``,
    ``noise_ratio`` and ``noise_seed`` are checked by their declarations): a file
    (``noise_index``) or a ratio, not both; and only the formats with one image per training
    caption (precomp, karpathy). The file itself is read and checked when the training split
    is built."""
    if data.noise_index is not None and data.noise_ratio > 0:
        why = (
            f"{data.noise_index!r} and data.noise_ratio {data.noise_ratio!r} both given; keep "
            "one (a released index, or a ratio to generate one)"
        )
        raise ConfigError(source, "data.noise_index", why)
    key = "data.noise_index" if data.noise_index is not None else "data.noise_ratio"
    if (data.noise_index is not None or data.noise_ratio > 0) and (
        not get_format(data.format).noise_index
    ):
        formats = " or ".join(formats_where(lambda f: f.noise_index))
        why = f"applies to data.format {formats} (one image per caption), not {data.format!r}"
        raise ConfigError(source, key, why)


#: The captions-file keys of ``[data]``, in split order.
CAPTIONS_FILE_KEYS = ("train_captions", "dev_captions", "test_captions")


def check_captions_files(data: Any, source: str) -> None:
    """``data.train_captions``, ``dev_captions`` and ``test_captions`` (captions files,
    :mod:`vlret.data.captioning_files`; a non-empty path by their declarations): for the
    formats that read them (:attr:`~vlret.data.formats.DataFormat.captions_files`);
    ``dev_captions`` needs a ``dev_split``. Each
    file is read and checked against its split (existence, line count, sidecar) when the split
    is built, the error naming the key and the file."""
    for name in CAPTIONS_FILE_KEYS:
        path = getattr(data, name)
        if path is None:
            continue
        key = f"data.{name}"
        if not get_format(data.format).captions_files:
            formats = " or ".join(formats_where(lambda f: f.captions_files))
            why = f"applies to data.format {formats}, not {data.format!r}"
            raise ConfigError(source, key, why)
        if name == "dev_captions" and data.dev_split is None:
            raise ConfigError(source, key, f"{path!r} given but data.dev_split is null")


#: The pair-scoring model kinds AOQ trains (each pair's score depends on that pair alone, so the
#: offline pairs can be scored on their own); two-tower models are always accepted.
OFFLINE_PAIR_KINDS = ("scan", "bfan")
#: Pair-scoring kinds refused with AOQ, and why.
OFFLINE_REFUSED_KINDS = {
    "sgraf": "its BatchNorms normalise over the pairs of each scoring call, so an offline "
    "pair's score would depend on the pairs scored with it",
    "ce": "its offline pairs would need the videos' expert features (only scan and bfan "
    "score pairs for AOQ)",
    "mmt": "its offline pairs would need the videos' expert features (only scan and bfan "
    "score pairs for AOQ)",
}


def _reads_offline_negatives(loss: Any) -> bool:
    """Whether the configured loss declares ``LossCapabilities.offline_negatives`` (AOQ's);
    an unknown name reads none (the loss section's own check names it)."""
    try:
        return loss_capabilities(loss.name, loss.params).offline_negatives
    except (TypeError, ValueError):
        return False


def check_offline_negatives(
    data: Any, loss: Any, model: dict[str, Any], train: Any, source: str
) -> None:
    """AOQ's keys (:mod:`vlret.data.offline_negatives`, docs/aoq.md): ``data.offline_negatives``
    and a loss that reads them (``LossCapabilities.offline_negatives``: ``loss.name = "aoq"``)
    go together (each refused without the other, naming both keys); the data format has one image
    per caption, read as a map-style dataset
    (:attr:`~vlret.data.formats.DataFormat.offline_negatives`); the procedure is ``"aoq"`` (or
    ``"standard"``, which :func:`vlret.train.procedures.registry.build_procedure` turns into
    ``"aoq"``); a pair-scoring model is one of :data:`OFFLINE_PAIR_KINDS`; no gradient
    caching. The file itself is read and checked against the training split when that split is
    built."""
    path, aoq = data.offline_negatives, _reads_offline_negatives(loss)
    if path is not None and not aoq:
        why = f'{path!r} is only read by loss.name = "aoq" (the loss is {loss.name!r})'
        raise ConfigError(source, "data.offline_negatives", why)
    if path is None and aoq:
        why = (
            'required by loss.name = "aoq": the .npz `vlret mine-negatives` writes for the '
            "training split with a first-round model (docs/aoq.md)"
        )
        raise ConfigError(source, "data.offline_negatives", why)
    if train.procedure == "aoq" and not aoq:
        why = f'trains loss.name = "aoq" only (the loss is {loss.name!r})'
        raise ConfigError(source, "train.procedure", why)
    if not aoq:
        return
    if not get_format(data.format).offline_negatives:
        formats = " or ".join(formats_where(lambda f: f.offline_negatives))
        why = f"applies to data.format {formats} (one image per caption), not {data.format!r}"
        raise ConfigError(source, "data.offline_negatives", why)
    if train.procedure not in ("standard", "aoq"):
        why = (
            f'loss.name = "aoq" trains with the "aoq" procedure (its offline negatives), not '
            f"{train.procedure!r}"
        )
        raise ConfigError(source, "train.procedure", why)
    kind = model.get("kind")
    if kind in OFFLINE_REFUSED_KINDS:
        why = f'loss.name = "aoq" with model.kind {kind!r}: {OFFLINE_REFUSED_KINDS[kind]}'
        raise ConfigError(source, "model.kind", why)
    if train.grad_cache_chunk is not None:
        why = 'loss.name = "aoq" encodes each batch with its offline negatives in one pass'
        raise ConfigError(source, "train.grad_cache_chunk", why)


#: The dev metrics ``best.pt`` may maximise on every format (``train.select_on``): the
#: caption-level recalls of :func:`vlret.metrics.retrieval_metrics` and their sum. Left out:
#: the ranks (``*_medr``, ``*_meanr``) and ``hardest_neg_sim`` (lower is better) and
#: ``pos_sim`` (a collapsed model has the highest), which no paper selects on.
SELECT_ON_RETRIEVAL = ("rsum", "i2t_r1", "i2t_r5", "i2t_r10", "t2i_r1", "t2i_r5", "t2i_r10")
#: On the person-search formats also the identity-level metrics the trainer logs there
#: (:func:`vlret.run.evaluate.dev_metrics` with ``image_identity``), in percent.
SELECT_ON_IDENTITY = IDENTITY_METRIC_KEYS


def selectable_metrics(data_format: str) -> tuple[str, ...]:
    """The values ``train.select_on`` may take with ``data.format = data_format``."""
    identity = SELECT_ON_IDENTITY if get_format(data_format).identities else ()
    return (*identity, *SELECT_ON_RETRIEVAL)


def selection_metric(config: Any) -> str:
    """The dev metric ``best.pt`` maximises for the run config ``config`` (a
    :class:`~vlret.run.config.RunConfig`): ``train.select_on``, or when it is ``None``
    ``"identity_t2i_r1"`` on the person-search formats (as IRRA) and ``"rsum"`` otherwise. An
    epoch improves on the best only when strictly higher (the first of equal epochs is kept).
    An older spelling (``"t2i_R1"``) is read as today's
    (:func:`vlret.metrics.normalise_metric_key`).

    Raises:
        ConfigError: ``train.select_on`` names no metric of :func:`selectable_metrics`
            (naming the key and listing the valid ones).
    """
    fmt, chosen = config.data.format, config.train.select_on
    identities = get_format(fmt).identities
    if chosen is None:
        return IDENTITY_METRIC_KEYS[0] if identities else "rsum"
    given, chosen = chosen, normalise_metric_key(chosen) if isinstance(chosen, str) else chosen
    valid = selectable_metrics(fmt)
    if chosen not in valid:
        where = "" if identities else f" (data.format {fmt!r}: not person search)"
        why = f"unknown dev metric {given!r}{where}; expected one of {', '.join(valid)}"
        raise ConfigError(config.source, "train.select_on", why)
    return str(chosen)


__all__ = [
    "CAPTIONS_FILE_KEYS",
    "MAX_COUNT",
    "MAX_DIM",
    "MAX_MATRIX",
    "MAX_VOCAB",
    "check_model_sizes",
    "check_captions_files",
    "check_msrvtt",
    "check_noise",
    "check_offline_negatives",
]
