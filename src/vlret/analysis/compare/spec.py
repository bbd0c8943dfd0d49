"""What a comparison runs: the ``[compare]`` section, its variants and the config of each run
(see :mod:`vlret.analysis.compare`).
"""

from __future__ import annotations

import contextlib
import copy
import itertools
import re
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..._files import check_output_dir
from ...losses import compared_losses, loss_capabilities
from ...run.config import ConfigError, RunConfig, apply_overrides, config_from_dict
from ...run.config_checks import selection_metric
from ...run.config_files import parse_value, read_config_file
from ...run.lock import acquire_run_lock

#: The losses of the four papers, compared by default: the registry's losses that declare
#: ``paper_comparison``, in their declared order (:func:`vlret.losses.compared_losses`).
PAPER_LOSSES: tuple[str, ...] = tuple(compared_losses())
COMPARE_KEYS = (
    "output_dir",
    "seeds",
    "protocol",
    "split",
    "data",
    "checkpoint",
    "eval_batch_size",
    "losses",
)
_LABEL = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+-]*$")


class CompareError(ValueError):
    """A comparison request that cannot run as given (the message says what to change)."""


@dataclass(frozen=True)
class Variant:
    """One row of the comparison: a label, a registered loss, its parameters and per-variant
    run-config overrides."""

    label: str
    loss: str
    params: dict[str, Any] = field(default_factory=dict)
    overrides: tuple[str, ...] = ()


@dataclass(frozen=True)
class EvalSettings:
    """How each trained run is tested."""

    protocol: str = "f30k"
    split: str = "test"
    data: str | None = None
    checkpoint: str = "best"
    batch_size: int = 256


@dataclass(frozen=True)
class RunSpec:
    variant: Variant
    seed: int
    run_dir: Path
    config: RunConfig


def _set_dotted(node: dict[str, Any], dotted: str, value: Any, source: str) -> None:
    """Set ``node``'s dotted key to ``value``; None (``null``) deletes it, so its default
    applies (``compare.protocol=null``: the protocol of the data), as ``--set`` does for the
    run config."""
    keys = dotted.split(".")
    for k in keys[:-1]:
        child = node.setdefault(k, {})
        if not isinstance(child, dict):
            raise CompareError(f"{source}: {dotted}: {k!r} is not a table")
        node = child
    if value is None:
        node.pop(keys[-1], None)
    else:
        node[keys[-1]] = value


def read_compare_config(
    path: str | Path, overrides: Sequence[str] | None = None
) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(run config mapping, [compare] section)`` of ``path`` with ``--set`` overrides
    applied (``compare.*`` ones to the section, the others to the run config)."""
    raw = read_config_file(path)
    section = raw.pop("compare", {})
    if not isinstance(section, dict):
        raise CompareError(f"{path}: [compare] must be a table, got {section!r}")
    run_overrides = []
    for item in overrides or []:
        dotted, sep, value = item.partition("=")
        if dotted.strip().startswith("compare."):
            if not sep:
                raise CompareError(f"--set {item}: expected compare.key=value")
            _set_dotted(section, dotted.strip()[len("compare.") :], parse_value(value), "--set")
        else:
            run_overrides.append(item)
    raw = apply_overrides(raw, run_overrides)
    unknown = sorted(set(section) - set(COMPARE_KEYS))
    if unknown:
        raise CompareError(
            f"{path}: compare.{unknown[0]}: unknown key; valid keys of [compare]: "
            f"{', '.join(COMPARE_KEYS)}"
        )
    if not isinstance(section.get("losses", {}), dict):
        raise CompareError(
            f"{path}: compare.losses must hold one table per variant "
            "([compare.losses.LABEL]); choose the variants to run with --losses"
        )
    return raw, section


def coco_data(raw: dict[str, Any], section: dict[str, Any]) -> bool:
    """Whether the data a compare config tests on is MS-COCO, so that its default protocol is
    ``coco5k`` (GOAL's and the others' COCO 5K tables) rather than the format's default.

    Precomputed features (``format = "precomp"``): the test folder (``compare.data``, else
    ``data.root``) has ``coco`` in its name, as SCAN's and VSE-infinity's ``coco_precomp``
    (the folder's files do not tell: a Flickr30K-like folder may hold a ``testall`` split
    too). A Karpathy JSON (``format = "karpathy"``): its
    ``dataset`` field is ``"coco"`` (inferred as its reader does when missing: COCO entries
    carry a ``filepath``); while the file cannot be read, its name says (``dataset_coco.json``).
    Each format's record says (:attr:`vlret.data.formats.DataFormat.data_set`); a format whose
    record cannot tell is not COCO. ``compare.protocol`` overrides all of this."""
    from ...data.formats import format_names, get_format

    data = raw.get("data")
    if not isinstance(data, dict):
        return False
    fmt = data.get("format", "precomp")
    if fmt not in format_names():
        return False  # the config's own check names it
    record = get_format(fmt)
    root = section.get("data")
    return record.data_set is not None and record.data_set(data, root or None) == "coco"


def default_split(protocol: str, fmt: str) -> str:
    """``compare.split``'s default: ``test`` where ``protocol`` evaluates it on format ``fmt``,
    else the first of the protocol's paper splits it does (``testall`` for ``coco5k`` /
    ``coco1k`` on precomputed COCO, whose ``test`` is only the first 1000 images)."""
    from ...eval.protocols.registry import get_protocol

    record = get_protocol(protocol)
    accepted = record.splits.get(fmt, ())
    if not accepted or "test" in accepted:
        return "test"
    return next((s for s in record.paper_splits if s in accepted), accepted[0])


def eval_settings(raw: dict[str, Any], section: dict[str, Any]) -> EvalSettings:
    """How each run is tested: the ``[compare]`` keys, with their defaults from the data.

    ``compare.protocol`` defaults to ``coco5k`` for MS-COCO data (:func:`coco_data`), else to
    the protocol the registry declares the default for the data format (``f30k`` for precomp
    and Karpathy data, ``msrvtt-full`` for MSR-VTT); ``compare.split`` to
    :func:`default_split` of that protocol (``testall`` for precomputed COCO, ``test`` for a
    Karpathy COCO JSON and the others)."""
    from ...eval import default_protocol
    from ...eval.tasks import retrieval_protocol_names

    fmt = raw.get("data", {}).get("format", "precomp") if isinstance(raw.get("data"), dict) else ""
    if "protocol" in section:
        protocol = str(section["protocol"])
    elif coco_data(raw, section):
        protocol = "coco5k"
    else:  # the protocol the registry declares the default for this data format
        default = default_protocol(fmt)
        if default is None:
            raise CompareError(
                f"compare.protocol: no protocol is the default for data.format {fmt!r}; "
                "name one (vlret protocols lists them)"
            )
        protocol = default.name
    if protocol not in retrieval_protocol_names():
        names = ", ".join(retrieval_protocol_names())
        raise CompareError(f"compare.protocol: expected one of {names}, got {protocol!r}")
    split = section["split"] if "split" in section else default_split(protocol, str(fmt))
    settings = EvalSettings(
        protocol=protocol,
        split=str(split),
        data=None if section.get("data") is None else str(section["data"]),
        checkpoint=str(section.get("checkpoint", "best")),
        batch_size=section.get("eval_batch_size", 256),
    )
    if settings.checkpoint not in ("best", "last"):
        raise CompareError(
            f"compare.checkpoint: expected best or last, got {settings.checkpoint!r}"
        )
    if isinstance(settings.batch_size, bool) or not isinstance(settings.batch_size, int):
        raise CompareError(
            f"compare.eval_batch_size: expected an integer, got {settings.batch_size!r}"
        )
    return settings


def check_params(label: str, loss: str, params: dict[str, Any], where: str) -> None:
    from ...losses import loss_parameters

    valid = [p for p in loss_parameters(loss) if p != "semantic"]
    for k in params:
        if k not in valid:
            raise CompareError(
                f"{where}: {k!r} is not a parameter of loss {loss!r} (variant {label!r}); "
                f"valid: {', '.join(valid)}"
            )


def make_variant(label: str, table: dict[str, Any], raw: dict[str, Any]) -> Variant:
    """Resolve one variant (see the module docstring for the layering of parameters)."""
    from ...losses import available_losses, loss_class

    if not _LABEL.match(label):
        raise CompareError(
            f"variant label {label!r}: use letters, digits and . _ + - (it names a folder)"
        )
    if not isinstance(table, dict):
        raise CompareError(f"[compare.losses.{label}] must be a table, got {table!r}")
    table = dict(table)
    if not isinstance(table.pop("default", True), bool):
        raise CompareError(f"[compare.losses.{label}] default: expected true or false")
    loss = table.pop("name", label)
    overrides = table.pop("set", [])
    if isinstance(overrides, str):
        overrides = [overrides]
    if not isinstance(overrides, list) or not all(isinstance(o, str) for o in overrides):
        raise CompareError(f"[compare.losses.{label}] set: expected a list of 'key=value' strings")
    if isinstance(loss, list):  # the list form of a combination: ["sdm", "id"] is "sdm+id"
        loss = "+".join(str(n) for n in loss)
    if isinstance(loss, str) and "+" in loss:  # a weighted combination (vlret.losses.combined)
        try:
            loss = getattr(loss_class(loss), "registry_name", loss)
        except ValueError as err:
            raise CompareError(f"[compare.losses.{label}] name: {err}") from None
    elif loss not in available_losses():
        raise CompareError(
            f"unknown loss or variant {label!r}: neither a registered loss "
            f"({', '.join(available_losses())}) nor a [compare.losses.{label}] table with `name`"
        )
    base = raw.get("loss", {})
    params: dict[str, Any] = {}
    if isinstance(base, dict) and base.get("name") == loss:
        params.update({k: v for k, v in base.items() if k != "name"})
    params.update(table)
    check_params(label, loss, params, f"[compare.losses.{label}]")
    return Variant(label=label, loss=loss, params=params, overrides=tuple(overrides))


def goal_grid_variants(raw: dict[str, Any], section: dict[str, Any]) -> list[Variant]:
    """The 15 GOAL combinations, with the other parameters of the ``goal`` variant."""
    from ...losses.goal import PAIR_WEIGHTS, TRIPLET_WEIGHTS

    base = make_variant("goal", section.get("losses", {}).get("goal", {}), raw)
    out = []
    for t, p in itertools.product(TRIPLET_WEIGHTS, PAIR_WEIGHTS):
        params = {**base.params, "triplet_weight": t, "pair_weight": p}
        out.append(Variant(f"goal-{t}-{p}", "goal", params, base.overrides))
    return out


def resolve_variants(
    raw: dict[str, Any],
    section: dict[str, Any],
    losses: Sequence[str] | None,
    *,
    goal_grid: bool = False,
) -> list[Variant]:
    """The variants to run: ``losses`` (labels of ``[compare.losses]`` tables or registered
    loss names; default: the tables in file order, except those that set ``default = false``
    (ablations that run only when named), else :data:`PAPER_LOSSES`), then the GOAL grid
    when ``goal_grid``."""
    tables = section.get("losses", {})
    if losses is None:  # a table with default = false runs only when named
        named = [
            k for k, t in tables.items() if not (isinstance(t, dict) and t.get("default") is False)
        ]
        losses = named if tables else ([] if goal_grid else list(PAPER_LOSSES))
    variants = [make_variant(label, tables.get(label, {}), raw) for label in losses]
    if goal_grid:
        taken = {v.label for v in variants}
        variants += [v for v in goal_grid_variants(raw, section) if v.label not in taken]
    labels = [v.label for v in variants]
    dupes = sorted({x for x in labels if labels.count(x) > 1})
    if dupes:
        raise CompareError(f"--losses: {dupes[0]!r} is listed twice")
    if not variants:
        raise CompareError("--losses: nothing to run (empty list)")
    return variants


def parse_losses(text: str) -> list[str]:
    """``"triplet, infonce"`` -> ``["triplet", "infonce"]`` (an empty item is an error)."""
    items = [s.strip() for s in text.split(",")]
    if not all(items):
        raise CompareError(f"--losses {text!r}: expected comma-separated names without blanks")
    return items


def run_config(
    raw: dict[str, Any], variant: Variant, seed: int, run_dir: Path, out_dir: Path | None = None
) -> RunConfig:
    """The resolved config of one run (``source`` names the variant and seed). In the
    variant's overrides ``{seed}`` is the run's seed and ``{out}`` the comparison's folder
    ``out_dir``: a later round reads the first round's run of the same seed, e.g.
    ``train.init_from={out}/runs/warmup/seed{seed}/last.pt``."""
    r = copy.deepcopy(raw)
    r["loss"] = {"name": variant.loss, **copy.deepcopy(variant.params)}
    r["output_dir"] = str(run_dir)
    train = r.setdefault("train", {})
    if not isinstance(train, dict):
        raise CompareError("[train] must be a table")
    train["seed"] = seed
    caps = loss_capabilities(variant.loss, variant.params)
    if not caps.all_negatives_warmup:
        train.pop("all_negatives_epochs", None)
    if not (caps.owns_queue and caps.momentum_keys):
        train.pop("momentum_encoder", None)
    fields = {"{seed}": str(seed), "{out}": str(out_dir if out_dir is not None else "")}
    overrides = []
    for item in variant.overrides:
        if "{out}" in item and out_dir is None:
            raise CompareError(f"[compare.losses.{variant.label}] set: {{out}} needs a folder")
        for name, value in fields.items():
            item = item.replace(name, value)
        overrides.append(item)
    r = apply_overrides(r, overrides)
    config = config_from_dict(r, source=f"{variant.label} seed {seed}")
    selection_metric(config)  # train.select_on: before any run trains
    return config


def plan_runs(
    raw: dict[str, Any], variants: Sequence[Variant], seeds: int, out_dir: Path
) -> list[RunSpec]:
    """Every (variant, seed) run, variant-major; seeds are ``train.seed + k``."""
    if isinstance(seeds, bool) or not isinstance(seeds, int) or seeds < 1:
        raise CompareError(f"--seeds: expected a positive integer, got {seeds!r}")
    base_seed = raw.get("train", {}).get("seed", 0) if isinstance(raw.get("train"), dict) else 0
    if isinstance(base_seed, bool) or not isinstance(base_seed, int):
        raise CompareError(f"train.seed: expected an integer, got {base_seed!r}")
    specs = []
    for v in variants:
        for k in range(seeds):
            seed = base_seed + k
            run_dir = out_dir / "runs" / v.label / f"seed{seed}"
            try:
                config = run_config(raw, v, seed, run_dir, out_dir)
            except ConfigError as err:
                raise CompareError(str(err)) from None
            specs.append(RunSpec(v, seed, run_dir, config))
    return specs


def output_folder(
    out: str | Path | None, raw: dict[str, Any], section: dict[str, Any], kind: str
) -> Path:
    """The report folder: ``out`` (``--out``), else :func:`default_out`; refused before any
    run trains when it cannot hold the report (a file, under a file, not writable):
    :class:`~vlret._files.OutputPathError`, naming the option or key it came from."""
    if out is not None:
        return check_output_dir(out, "--out")
    flag = "[compare] output_dir" if section.get("output_dir") else "output_dir"
    return check_output_dir(default_out(raw, section, kind), flag)


@contextlib.contextmanager
def locked_output(out_dir: Path) -> Iterator[Path]:
    """Hold ``out_dir`` (created) for one comparison or sweep: the run-folder lock
    (:mod:`vlret.run.lock`) on the report folder, so a second ``vlret compare`` /
    ``sweep`` into it is refused naming the holder instead of racing on ``spec.json``,
    ``result.json`` and the tables (each run's own folder is locked by its trainer)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    lock = acquire_run_lock(out_dir, notify=lambda line: print(line, file=sys.stderr))
    try:
        yield out_dir
    finally:
        lock.release()


def default_out(raw: dict[str, Any], section: dict[str, Any], kind: str) -> Path:
    """``[compare] output_dir``, else ``<output_dir>/{kind}`` of the run config."""
    if section.get("output_dir"):
        return Path(str(section["output_dir"]))
    if raw.get("output_dir"):
        return Path(str(raw["output_dir"])) / kind
    raise CompareError("no output folder: pass --out or set [compare] output_dir")


__all__ = [
    "COMPARE_KEYS",
    "PAPER_LOSSES",
    "CompareError",
    "EvalSettings",
    "RunSpec",
    "Variant",
    "check_params",
    "coco_data",
    "default_split",
    "default_out",
    "locked_output",
    "output_folder",
    "eval_settings",
    "goal_grid_variants",
    "make_variant",
    "parse_losses",
    "plan_runs",
    "read_compare_config",
    "resolve_variants",
    "run_config",
]
