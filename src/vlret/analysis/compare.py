"""Loss comparison runner: the same model trained with each loss and seed, then tables and plots.

``vlret compare CONFIG --losses triplet,infonce,unified,goal,vsl,adacl --seeds 3 [--out DIR]
[--goal-grid] [--set k=v ...]`` and ``vlret sweep CONFIG --param margin=0,0.1,0.2 --param
gamma=20,40,60 [--loss unified]`` call :func:`compare` and :func:`sweep`.

CONFIG is an ordinary run config (see :mod:`vlret.train.config`) with an optional ``[compare]``
section::

    [compare]
    output_dir = "runs/compare_f30k"   # default of --out (else <output_dir>/compare or /sweep)
    seeds = 3                          # default of --seeds (else 1); seeds are train.seed + k
    protocol = "f30k"                  # test protocol (default f30k; msrvtt-full for msrvtt data)
    split = "test"                     # test split (default test)
    data = "data/f30k_precomp"         # test data folder (default data.root)
    checkpoint = "best"                # best (dev-selected, as the papers) or last
    eval_batch_size = 256

    [compare.losses.unified]           # one table per variant; the table name is its label
    margin = 0.2
    gamma = 60.0

    [compare.losses.triplet-hn]        # a label other than a loss name needs `name`
    name = "triplet"
    hardest = true
    set = ["train.all_negatives_epochs=0"]   # run-config overrides for this variant only

A variant's loss parameters are layered: the registry defaults, then the config's ``[loss]``
section when it names the same loss, then the variant's table. ``--losses`` defaults to the
labels of ``[compare.losses]`` in file order, else the six papers' losses. ``--goal-grid`` adds
the 15 GOAL (triplet weight, pair weight) combinations, labelled ``goal-{T}-{P}``, with the
other parameters of the ``goal`` variant. Train settings that only apply to some losses
(``all_negatives_epochs``: triplet, GOAL and VSL, see :mod:`vlret.train.warmup`;
``momentum_encoder``: AdaCL with a queue) are dropped for the other losses.
``--set compare.KEY=VALUE`` overrides the ``[compare]`` section; other ``--set`` overrides
apply to the run config as in ``vlret train``.

Layout of OUT: ``runs/{label}/seed{seed}/`` (the trainer's folder plus ``spec.json``, the
resolved settings of the run, and ``result.json``, its test metrics), ``table.md``,
``results.csv``, ``results.json``, ``curves.md`` (dev rsum and dev similarities against
epochs, mean +- std over seeds), ``goal_grid.md`` (with ``--goal-grid``) and ``plots/*.png``.
The dev similarity curves read ``dev_pos_sim`` / ``dev_hardest_neg_sim``, which the trainer
logs in each epoch record of ``metrics.jsonl``.

Before any run trains, the test protocol, split and data folder are checked against every
run's data format (:func:`check_eval_plan`). When the test data folder is a synthetic world
(``synthetic.json``, :mod:`vlret.data.synthetic`), each run is also scored with
:func:`~vlret.data.synthetic.evaluate_synthetic` on the same split: clone forced choice,
R-Precision / mAP@R on the exhaustive relevance and T->I R@1 of the secondary-content captions
(``result.json`` key ``synthetic``; extra columns of ``results.csv`` / ``results.json`` and a
second table in ``table.md``).

Resume: a run is finished when its ``result.json`` exists, and is then read, not retrained; a
run with a ``last.pt`` continues from it through the trainer's exact resume; any other run
starts afresh. A run folder whose ``spec.json`` differs from the current settings is an error
(use another ``--out`` or delete the folder), so changed settings never mix with old results.
Ctrl-C stops the current run at the next step after writing its ``last.pt``.
"""

from __future__ import annotations

import copy
import itertools
import json
import math
import re
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from .._files import atomic_write_text
from ..train.config import (
    ConfigError,
    RunConfig,
    apply_overrides,
    config_from_dict,
    parse_value,
    read_config_file,
)
from ..train.trainer import Trainer
from .tables import (
    SYNTHETIC_KEYS,
    RunResult,
    VariantSummary,
    goal_grid_markdown,
    summarize,
    write_results_csv,
    write_results_json,
    write_table,
)

#: The losses of the four papers, compared by default.
PAPER_LOSSES: tuple[str, ...] = ("triplet", "infonce", "unified", "goal", "vsl", "adacl")
RESULT_FILE = "result.json"
SPEC_FILE = "spec.json"
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
#: Train settings that belong to some losses only: dropped for the others.
_LOSS_ONLY_TRAIN_KEYS = {
    "all_negatives_epochs": ("triplet", "goal", "vsl"),
    "momentum_encoder": ("adacl",),
}


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


@dataclass(frozen=True)
class RunOutcome:
    """``status``: ``cached`` (result file found), ``resumed`` (from last.pt) or ``trained``."""

    spec: RunSpec
    status: str
    result: RunResult


@dataclass
class ComparisonReport:
    out_dir: Path
    table: Path
    results_csv: Path
    results_json: Path
    summaries: list[VariantSummary]
    outcomes: list[RunOutcome]
    plots: list[Path] = field(default_factory=list)
    goal_table: Path | None = None
    #: ``curves.md``: dev rsum and dev similarities against epochs (mean +- std over seeds).
    curves: Path | None = None
    warnings: list[str] = field(default_factory=list)

    def count(self, status: str) -> int:
        return sum(1 for o in self.outcomes if o.status == status)

    def table_text(self) -> str:
        return self.table.read_text(encoding="utf-8")


# --------------------------------------------------------------------------------------------
# Reading the config and resolving variants
# --------------------------------------------------------------------------------------------


def _set_dotted(node: dict[str, Any], dotted: str, value: Any, source: str) -> None:
    keys = dotted.split(".")
    for k in keys[:-1]:
        child = node.setdefault(k, {})
        if not isinstance(child, dict):
            raise CompareError(f"{source}: {dotted}: {k!r} is not a table")
        node = child
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


def eval_settings(raw: dict[str, Any], section: dict[str, Any]) -> EvalSettings:
    from ..train.evaluate import PROTOCOLS

    fmt = raw.get("data", {}).get("format", "precomp") if isinstance(raw.get("data"), dict) else ""
    default_protocol = "msrvtt-full" if fmt == "msrvtt" else "f30k"
    settings = EvalSettings(
        protocol=str(section.get("protocol", default_protocol)),
        split=str(section.get("split", "test")),
        data=None if section.get("data") is None else str(section["data"]),
        checkpoint=str(section.get("checkpoint", "best")),
        batch_size=section.get("eval_batch_size", 256),
    )
    if settings.protocol not in PROTOCOLS:
        raise CompareError(
            f"compare.protocol: expected one of {', '.join(PROTOCOLS)}, got {settings.protocol!r}"
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


def _check_params(label: str, loss: str, params: dict[str, Any], where: str) -> None:
    from ..losses import loss_parameters

    valid = [p for p in loss_parameters(loss) if p != "semantic"]
    for k in params:
        if k not in valid:
            raise CompareError(
                f"{where}: {k!r} is not a parameter of loss {loss!r} (variant {label!r}); "
                f"valid: {', '.join(valid)}"
            )


def make_variant(label: str, table: dict[str, Any], raw: dict[str, Any]) -> Variant:
    """Resolve one variant (see the module docstring for the layering of parameters)."""
    from ..losses import available_losses

    if not _LABEL.match(label):
        raise CompareError(
            f"variant label {label!r}: use letters, digits and . _ + - (it names a folder)"
        )
    if not isinstance(table, dict):
        raise CompareError(f"[compare.losses.{label}] must be a table, got {table!r}")
    table = dict(table)
    loss = table.pop("name", label)
    overrides = table.pop("set", [])
    if isinstance(overrides, str):
        overrides = [overrides]
    if not isinstance(overrides, list) or not all(isinstance(o, str) for o in overrides):
        raise CompareError(f"[compare.losses.{label}] set: expected a list of 'key=value' strings")
    if loss not in available_losses():
        raise CompareError(
            f"unknown loss or variant {label!r}: neither a registered loss "
            f"({', '.join(available_losses())}) nor a [compare.losses.{label}] table with `name`"
        )
    base = raw.get("loss", {})
    params: dict[str, Any] = {}
    if isinstance(base, dict) and base.get("name") == loss:
        params.update({k: v for k, v in base.items() if k != "name"})
    params.update(table)
    _check_params(label, loss, params, f"[compare.losses.{label}]")
    return Variant(label=label, loss=loss, params=params, overrides=tuple(overrides))


def goal_grid_variants(raw: dict[str, Any], section: dict[str, Any]) -> list[Variant]:
    """The 15 GOAL combinations, with the other parameters of the ``goal`` variant."""
    from ..losses.goal import PAIR_WEIGHTS, TRIPLET_WEIGHTS

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
    tables = section.get("losses", {})
    if losses is None:
        losses = list(tables) if tables else ([] if goal_grid else list(PAPER_LOSSES))
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


def run_config(raw: dict[str, Any], variant: Variant, seed: int, run_dir: Path) -> RunConfig:
    """The resolved config of one run (``source`` names the variant and seed)."""
    r = copy.deepcopy(raw)
    r["loss"] = {"name": variant.loss, **copy.deepcopy(variant.params)}
    r["output_dir"] = str(run_dir)
    train = r.setdefault("train", {})
    if not isinstance(train, dict):
        raise CompareError("[train] must be a table")
    train["seed"] = seed
    for key, owners in _LOSS_ONLY_TRAIN_KEYS.items():
        if variant.loss not in owners:
            train.pop(key, None)
    r = apply_overrides(r, list(variant.overrides))
    return config_from_dict(r, source=f"{variant.label} seed {seed}")


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
                config = run_config(raw, v, seed, run_dir)
            except ConfigError as err:
                raise CompareError(str(err)) from None
            specs.append(RunSpec(v, seed, run_dir, config))
    return specs


# --------------------------------------------------------------------------------------------
# Running
# --------------------------------------------------------------------------------------------


class ComparisonTrainer(Trainer):
    """The trainer with a callback after each epoch (the progress display); the dev
    similarities of the plots (``dev_pos_sim`` / ``dev_hardest_neg_sim``) are logged by
    :meth:`Trainer.validate` itself."""

    def __init__(
        self,
        config: RunConfig,
        *,
        resume: str | Path | None = None,
        on_epoch: Callable[[int], None] | None = None,
        overwrite: bool = False,
        print_fn: Callable[[str], None] | None = None,
    ) -> None:
        self._on_epoch = on_epoch
        super().__init__(config, resume=resume, overwrite=overwrite, print_fn=print_fn)

    def validate(self) -> dict[str, float] | None:
        out = super().validate()
        if self._on_epoch is not None:
            self._on_epoch(self.epoch + 1)
        return out


def _json_roundtrip(value: Any) -> Any:
    return json.loads(json.dumps(value, sort_keys=True, default=str))


def run_fingerprint(spec: RunSpec, settings: EvalSettings) -> dict[str, Any]:
    """What must match for a run folder's contents to be reused (``spec.json``)."""
    config = spec.config.to_dict()
    config.pop("output_dir")
    config["train"].pop("progress", None)
    return _json_roundtrip(
        {
            "label": spec.variant.label,
            "loss": spec.variant.loss,
            "seed": spec.seed,
            "config": config,
            "eval": settings.__dict__,
        }
    )


def _result_from_record(spec: RunSpec, record: dict[str, Any]) -> RunResult:
    """The run's test metrics, with the synthetic extras (``record["synthetic"]``) merged in."""
    metrics = dict(record["metrics"])
    metrics.update((record.get("synthetic") or {}).get("metrics", {}))
    return RunResult(
        label=spec.variant.label,
        loss=spec.variant.loss,
        seed=spec.seed,
        metrics={k: float(v) for k, v in metrics.items() if v is not None},
        params=spec.variant.params,
        run_dir=str(spec.run_dir),
    )


def is_finished(spec: RunSpec) -> bool:
    return (spec.run_dir / RESULT_FILE).is_file()


def _write_json(path: Path, value: Any) -> None:
    atomic_write_text(path, json.dumps(value, indent=2) + "\n")


def check_eval_plan(specs: Sequence[RunSpec], settings: EvalSettings) -> None:
    """Before any training: the test protocol evaluates the test split of every run's data
    format (:func:`~vlret.train.evaluate.check_eval_split`) and the test data folder exists,
    so a wrong ``[compare]`` protocol / split / data fails in seconds, not after the runs."""
    from ..train.evaluate import check_eval_split

    for spec in specs:
        try:
            check_eval_split(settings.protocol, settings.split, spec.config.data.format)
        except ValueError as err:
            raise CompareError(
                f"compare.protocol = {settings.protocol!r}, compare.split = {settings.split!r}: "
                f"{err}"
            ) from None
        data = Path(settings.data or spec.config.data.root)
        if not data.exists():
            key = "compare.data" if settings.data else "data.root"
            raise CompareError(
                f"{key}: {data}: missing; expected the data folder of the test split"
            )


def synthetic_root(data: str | Path) -> Path | None:
    """The synthetic world behind the data folder ``data`` (a folder with ``synthetic.json``;
    ``data`` may also be a Karpathy JSON inside it), else ``None``."""
    from ..data.synthetic import META_FILE

    folder = Path(data)
    if folder.is_file():
        folder = folder.parent
    return folder if (folder / META_FILE).is_file() else None


def _synthetic_split(root: Path, split: str) -> str | None:
    """Our split name of the evaluated ``split``: the same, or COCO's test / testall twin."""
    twins = {"test": ("test", "testall"), "testall": ("testall", "test")}
    for name in twins.get(split, (split,)):
        if (root / f"{name}_synth.npz").is_file():
            return name
    return None


def _pair_scores_as_embeddings(
    model: torch.nn.Module, dataset: Any, batch_size: int, device: str
) -> tuple[torch.Tensor, torch.Tensor]:
    """A cross-attention model's ``(N_img, N_txt)`` score matrix ``S`` as the embedding pair
    ``(S, I)``: every metric of :func:`~vlret.data.synthetic.evaluate_synthetic` scores with
    ``img @ txt.T``, which is then exactly ``S`` (none of them normalises)."""
    from ..train.evaluate_pairs import encode_tokens, score_matrix

    regions, texts = encode_tokens(model, dataset, batch_size=batch_size, device=device)
    sim = score_matrix(model, regions, texts, device=device)
    return sim, torch.eye(sim.shape[1], dtype=sim.dtype)


def synthetic_extras(
    checkpoint: Path,
    *,
    root: Path,
    spec: RunSpec,
    settings: EvalSettings,
    scores: torch.Tensor | None = None,
) -> dict[str, Any] | None:
    """The synthetic world's extras of a trained run on the test split, through
    :func:`~vlret.data.synthetic.evaluate_synthetic`: ``{"split", "metrics", "trials"}`` with
    the :data:`~vlret.analysis.tables.SYNTHETIC_KEYS` metrics (NaN as ``None``) and the
    forced-choice trial counts; ``None`` (with a warning) when the evaluated captions are not
    the world's split one to one (e.g. MSR-VTT 1k-A, one caption per test video). ``scores``:
    a cross-attention model's full test score matrix when the caller has it already (else
    the pairs are scored here)."""
    from ..data.synthetic import evaluate_synthetic, load_synthetic
    from ..train.builders import build_dataset, eval_data_config
    from ..train.evaluate import encode_dataset, load_trained_model

    name = _synthetic_split(root, settings.split)
    if name is None:
        warnings.warn(f"{root}: no side files of split {settings.split!r}", stacklevel=2)
        return None
    device = spec.config.train.device
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    model, config, encoder = load_trained_model(checkpoint, device=device)
    ds_protocol = {"msrvtt-1ka": "1k-A", "msrvtt-full": "full"}.get(settings.protocol)
    dataset = build_dataset(
        eval_data_config(config.data, settings.data or config.data.root),
        settings.split,
        encoder,
        protocol=ds_protocol,
        image_transform=getattr(model, "image_transform", None),
    )
    annotations = load_synthetic(root, name)
    if not torch.equal(
        torch.as_tensor(dataset.txt_to_img, dtype=torch.long),
        torch.as_tensor(annotations.txt_to_img, dtype=torch.long),
    ):
        warnings.warn(
            f"{spec.variant.label} seed {spec.seed}: the {settings.protocol} {settings.split} "
            f"captions are not those of the synthetic split {name!r}; no synthetic extras",
            stacklevel=2,
        )
        return None
    if getattr(model, "scores_pairs", False):
        if scores is not None and scores.shape == (dataset.num_images, dataset.num_captions):
            img, txt = scores, torch.eye(scores.shape[1], dtype=scores.dtype)
        else:
            img, txt = _pair_scores_as_embeddings(model, dataset, settings.batch_size, device)
    else:
        img, txt = encode_dataset(
            model,
            dataset,
            batch_size=settings.batch_size,
            device=device,
            normalize=config.loss.params.get("normalize", True),
        )
    out = evaluate_synthetic(img, txt, annotations)
    ext, clone = out["extended"], out["clone"]
    metrics = {
        "clone_t2i": clone.t2i,
        "clone_i2t": clone.i2t,
        "t2i_rprecision": ext.t2i_rprecision,
        "t2i_map_at_r": ext.t2i_map_at_r,
        "i2t_rprecision": ext.i2t_rprecision,
        "i2t_map_at_r": ext.i2t_map_at_r,
        "secondary_t2i_r1": out["secondary_t2i_r1"],
    }
    for group, subset in out["subsets"].items():  # the recalls tabulated in SUBSET_COLUMNS
        for key, value in subset.as_dict().items():
            if f"{group}_{key}" in SYNTHETIC_KEYS:
                metrics[f"{group}_{key}"] = value
    return {
        "split": name,
        "metrics": {k: float(v) if math.isfinite(v) else None for k, v in metrics.items()},
        "trials": {
            "clone_t2i": clone.t2i_trials,
            "clone_i2t": clone.i2t_trials,
            "secondary_t2i": int((annotations.caption_form == 1).sum()),
            **{
                f"{group}_{d}": getattr(subset, f"{d}_queries")
                for group, subset in out["subsets"].items()
                for d in ("t2i", "i2t")
            },
        },
    }


def execute_run(
    spec: RunSpec,
    settings: EvalSettings,
    *,
    on_start: Callable[[int], None] | None = None,
    on_epoch: Callable[[int], None] | None = None,
    print_fn: Callable[[str], None] | None = None,
) -> RunOutcome:
    """Train (or resume, or read) one run and test it; see the module docstring.
    ``print_fn`` receives the trainer's per-epoch summary lines."""
    from ..train.evaluate import metrics_json, run_evaluation

    run_dir = spec.run_dir
    run_dir.mkdir(parents=True, exist_ok=True)
    fingerprint = run_fingerprint(spec, settings)
    spec_path = run_dir / SPEC_FILE
    if spec_path.is_file():
        stored = json.loads(spec_path.read_text(encoding="utf-8"))
        if stored != fingerprint:
            raise CompareError(
                f"{run_dir} holds a run with other settings than this comparison's "
                f"({spec_path}); use another --out or delete that folder"
            )
    else:
        _write_json(spec_path, fingerprint)
    result_path = run_dir / RESULT_FILE
    world = synthetic_root(settings.data or spec.config.data.root)
    if result_path.is_file():
        record = json.loads(result_path.read_text(encoding="utf-8"))
        tested = run_dir / str(record.get("checkpoint", ""))
        stored = (record.get("synthetic") or {}).get("metrics", {})
        outdated = "synthetic" not in record or (
            record["synthetic"] is not None and not set(SYNTHETIC_KEYS) <= set(stored)
        )
        if world is not None and outdated and tested.is_file():
            # finished before (some of) the synthetic extras existed: add them, the run stays
            record["synthetic"] = synthetic_extras(tested, root=world, spec=spec, settings=settings)
            _write_json(result_path, record)
        return RunOutcome(spec, "cached", _result_from_record(spec, record))

    last = run_dir / "last.pt"
    resume = last if last.is_file() else None
    # Without last.pt the folder holds at most a run killed before its first checkpoint (its
    # spec.json matched above): start it afresh.
    trainer = ComparisonTrainer(
        spec.config, resume=resume, on_epoch=on_epoch, overwrite=resume is None, print_fn=print_fn
    )
    if on_start is not None:
        on_start(trainer.epoch)
    trainer.fit()
    best = run_dir / "best.pt"
    checkpoint = best if settings.checkpoint == "best" and best.is_file() else last
    evaluation = run_evaluation(
        checkpoint,
        data=settings.data or spec.config.data.root,
        split=settings.split,
        protocol=settings.protocol,
        batch_size=settings.batch_size,
        device=spec.config.train.device,
    )
    metrics = evaluation.metrics
    record = metrics_json(
        metrics,
        protocol=settings.protocol,
        split=settings.split,
        checkpoint=checkpoint.name,
        label=spec.variant.label,
        loss=spec.variant.loss,
        params=_json_roundtrip(spec.variant.params),
        seed=spec.seed,
        epochs=trainer.epoch,
    )
    if world is not None:
        full = evaluation.scores is not None and not bool(evaluation.scores.isnan().any())
        record["synthetic"] = synthetic_extras(
            checkpoint,
            root=world,
            spec=spec,
            settings=settings,
            scores=evaluation.scores if full else None,
        )
    _write_json(result_path, record)  # last: its presence marks the run finished
    status = "resumed" if resume is not None else "trained"
    return RunOutcome(spec, status, _result_from_record(spec, record))


class _NullBar:
    n = 0
    initial = 0

    def update(self, n: int = 1) -> None:
        pass

    def set_description(self, text: str, refresh: bool = True) -> None:
        pass

    def set_postfix_str(self, text: str, refresh: bool = True) -> None:
        pass

    def close(self) -> None:
        pass


def run_all(
    specs: Sequence[RunSpec],
    settings: EvalSettings,
    *,
    progress: bool = True,
    on_epoch: Callable[[RunSpec, int], None] | None = None,
) -> list[RunOutcome]:
    """Every run in order, with one progress bar counting epochs over the whole plan (the
    estimate of the time left is the average epoch time of this session so far). The test
    protocol, split and data folder are checked first (:func:`check_eval_plan`)."""
    check_eval_plan(specs, settings)
    total = sum(s.config.train.epochs for s in specs)
    done = sum(s.config.train.epochs for s in specs if is_finished(s))
    if progress:
        from tqdm.auto import tqdm

        bar: Any = tqdm(
            total=total, initial=done, unit="epoch", smoothing=0, dynamic_ncols=True, position=0
        )
        write: Callable[[str], None] = tqdm.write  # above the bar
    else:
        bar, write = _NullBar(), print
    outcomes = []
    try:
        for i, spec in enumerate(specs, start=1):
            epochs = spec.config.train.epochs
            name = f"{spec.variant.label} seed {spec.seed}"
            bar.set_postfix_str(f"run {i}/{len(specs)}")

            def started(epochs_done: int, name=name, epochs=epochs) -> None:
                if epochs_done:  # resumed: already-trained epochs do not count towards the rate
                    bar.initial += epochs_done
                    bar.update(epochs_done)
                bar.set_description(f"{name} epoch {min(epochs_done + 1, epochs)}/{epochs}")

            def finished_epoch(epoch: int, spec=spec, name=name, epochs=epochs) -> None:
                bar.update(1)
                if epoch < epochs:
                    bar.set_description(f"{name} epoch {epoch + 1}/{epochs}")
                if on_epoch is not None:
                    on_epoch(spec, epoch)

            if is_finished(spec):
                bar.set_description(f"{name} (done)")
            outcomes.append(
                execute_run(
                    spec,
                    settings,
                    on_start=started,
                    on_epoch=finished_epoch,
                    print_fn=lambda line, name=name: write(f"{name}: {line}"),
                )
            )
    finally:
        bar.close()
    return outcomes


# --------------------------------------------------------------------------------------------
# Reports
# --------------------------------------------------------------------------------------------


def _runs_by_label(outcomes: Sequence[RunOutcome]) -> dict[str, list[Path]]:
    runs: dict[str, list[Path]] = {}
    for o in outcomes:
        if (o.spec.run_dir / "metrics.jsonl").is_file():
            runs.setdefault(o.spec.variant.label, []).append(o.spec.run_dir)
    return runs


def _plot(report: ComparisonReport, what: str, fn: Callable[[], Any]) -> None:
    try:
        made = fn()
    except ImportError as err:
        report.warnings.append(f"{what} skipped: {err}")
        return
    report.plots.extend(made if isinstance(made, list) else [made])


def write_report(
    outcomes: Sequence[RunOutcome],
    out_dir: Path,
    settings: EvalSettings,
    *,
    title: str,
    goal_grid: bool = False,
    extra: dict[str, Any] | None = None,
) -> ComparisonReport:
    """``table.md``, ``results.csv``, ``results.json``, ``curves.md`` (dev rsum and dev
    similarities against epochs), and the training / similarity / AdaCL / GOAL-grid plots
    under ``plots/``."""
    from .curves import (
        plot_adacl_trajectories,
        plot_goal_heatmap,
        plot_similarity_curves,
        plot_training_curves,
        write_epoch_curves,
    )

    summaries = summarize(o.result for o in outcomes)
    report = ComparisonReport(
        out_dir=out_dir,
        table=write_table(summaries, out_dir / "table.md", title=title),
        results_csv=write_results_csv(summaries, out_dir / "results.csv"),
        results_json=write_results_json(
            summaries,
            out_dir / "results.json",
            protocol=settings.protocol,
            split=settings.split,
            checkpoint=settings.checkpoint,
            **(extra or {}),
        ),
        summaries=summaries,
        outcomes=list(outcomes),
    )
    plots = out_dir / "plots"
    runs = _runs_by_label(outcomes)
    if runs:
        report.curves = write_epoch_curves(runs, out_dir)
        _plot(report, "training curves", lambda: plot_training_curves(runs, plots))
        _plot(report, "similarity curves", lambda: plot_similarity_curves(runs, plots))
        adacl = {o.spec.variant.label for o in outcomes if o.spec.variant.loss == "adacl"}
        adacl_runs = {k: v for k, v in runs.items() if k in adacl}
        if adacl_runs:
            _plot(report, "AdaCL margins", lambda: plot_adacl_trajectories(adacl_runs, plots))
    if goal_grid:
        from ..losses.goal import PAIR_WEIGHTS, TRIPLET_WEIGHTS

        report.goal_table = out_dir / "goal_grid.md"
        report.goal_table.write_text(
            goal_grid_markdown(
                summaries, triplet_weights=TRIPLET_WEIGHTS, pair_weights=PAIR_WEIGHTS
            ),
            encoding="utf-8",
        )
        cells = {}
        for s in summaries:
            if s.loss == "goal" and s.label.startswith("goal-"):
                cells.setdefault((s.params["triplet_weight"], s.params["pair_weight"]), s.mean)
        _plot(
            report,
            "GOAL heatmap",
            lambda: plot_goal_heatmap(
                cells, plots, triplet_weights=TRIPLET_WEIGHTS, pair_weights=PAIR_WEIGHTS
            ),
        )
    for w in report.warnings:
        warnings.warn(w, stacklevel=2)
    return report


def _default_out(raw: dict[str, Any], section: dict[str, Any], kind: str) -> Path:
    if section.get("output_dir"):
        return Path(str(section["output_dir"]))
    if raw.get("output_dir"):
        return Path(str(raw["output_dir"])) / kind
    raise CompareError("no output folder: pass --out or set [compare] output_dir")


def compare(
    config: str | Path,
    *,
    losses: Sequence[str] | None = None,
    seeds: int | None = None,
    out: str | Path | None = None,
    goal_grid: bool = False,
    overrides: Sequence[str] | None = None,
    progress: bool = True,
    on_epoch: Callable[[RunSpec, int], None] | None = None,
) -> ComparisonReport:
    """Train every variant x seed of ``config`` (resuming unfinished runs), test each, and write
    the tables and plots to ``out``; see the module docstring."""
    raw, section = read_compare_config(config, overrides)
    settings = eval_settings(raw, section)
    variants = resolve_variants(raw, section, losses, goal_grid=goal_grid)
    n_seeds = seeds if seeds is not None else section.get("seeds", 1)
    out_dir = Path(out) if out is not None else _default_out(raw, section, "compare")
    specs = plan_runs(raw, variants, n_seeds, out_dir)
    outcomes = run_all(specs, settings, progress=progress, on_epoch=on_epoch)
    title = f"{Path(config).stem}: {settings.protocol} {settings.split}"
    return write_report(
        outcomes,
        out_dir,
        settings,
        title=title,
        goal_grid=goal_grid,
        extra={"config": str(config), "seeds": n_seeds},
    )


# --------------------------------------------------------------------------------------------
# Sweeps
# --------------------------------------------------------------------------------------------


def parse_param(text: str) -> tuple[str, list[Any]]:
    """``"margin=0,0.1,0.2"`` -> ``("margin", [0, 0.1, 0.2])`` (values typed as in ``--set``)."""
    name, sep, values = text.partition("=")
    name = name.strip()
    if not sep or not name:
        raise CompareError(f"--param {text!r}: expected NAME=V1,V2,... e.g. margin=0,0.1,0.2")
    items = [v.strip() for v in values.split(",")]
    if not all(items):
        raise CompareError(f"--param {text!r}: empty value in the list")
    parsed = [parse_value(v) for v in items]
    if len({json.dumps(v, sort_keys=True, default=str) for v in parsed}) != len(parsed):
        raise CompareError(f"--param {text!r}: a value is listed twice")
    return name, parsed


def _label_value(v: Any) -> str:
    text = f"{v:g}" if isinstance(v, float) else str(v)
    return re.sub(r"[^A-Za-z0-9._+-]", "_", text)


def sweep_variants(base: Variant, grid: dict[str, list[Any]]) -> list[Variant]:
    """The product of ``grid`` over ``base``'s parameters, labelled ``{label}-{name}{value}...``."""
    names = list(grid)
    out = []
    for values in itertools.product(*(grid[n] for n in names)):
        point = dict(zip(names, values, strict=True))
        label = base.label + "".join(f"-{n}{_label_value(v)}" for n, v in point.items())
        out.append(Variant(label, base.loss, {**base.params, **point}, base.overrides))
    return out


def sweep(
    config: str | Path,
    *,
    params: Sequence[str],
    loss: str | None = None,
    seeds: int | None = None,
    out: str | Path | None = None,
    overrides: Sequence[str] | None = None,
    progress: bool = True,
    on_epoch: Callable[[RunSpec, int], None] | None = None,
) -> ComparisonReport:
    """Grid over loss parameters (``params``: ``NAME=V1,V2`` items; their product is run) and
    curves of test rsum against each parameter (Unified Fig. 5), plus the comparison report."""
    if not params:
        raise CompareError("--param: give at least one NAME=V1,V2,... to sweep")
    raw, section = read_compare_config(config, overrides)
    settings = eval_settings(raw, section)
    grid: dict[str, list[Any]] = {}
    for item in params:
        name, values = parse_param(item)
        if name in grid:
            raise CompareError(f"--param {name}: given twice")
        grid[name] = values
    label = loss or (raw.get("loss", {}) or {}).get("name")
    if not label:
        raise CompareError("--loss: no loss given and the config has no [loss] name")
    base = make_variant(label, section.get("losses", {}).get(label, {}), raw)
    _check_params(base.label, base.loss, dict.fromkeys(grid), "--param")
    variants = sweep_variants(base, grid)
    n_seeds = seeds if seeds is not None else section.get("seeds", 1)
    out_dir = Path(out) if out is not None else _default_out(raw, section, "sweep")
    specs = plan_runs(raw, variants, n_seeds, out_dir)
    outcomes = run_all(specs, settings, progress=progress, on_epoch=on_epoch)
    title = f"{Path(config).stem}: {base.label} sweep, {settings.protocol} {settings.split}"
    report = write_report(
        outcomes,
        out_dir,
        settings,
        title=title,
        extra={"config": str(config), "seeds": n_seeds, "sweep": grid, "loss": base.loss},
    )
    from .curves import plot_sweep_curves

    points = [
        ({n: s.params[n] for n in grid}, s.mean["rsum"], s.std["rsum"]) for s in report.summaries
    ]
    _plot(
        report,
        "sweep curves",
        lambda: plot_sweep_curves(points, list(grid), out_dir / "plots", loss=base.label),
    )
    return report


__all__ = [
    "PAPER_LOSSES",
    "CompareError",
    "ComparisonReport",
    "ComparisonTrainer",
    "EvalSettings",
    "RunOutcome",
    "RunSpec",
    "Variant",
    "check_eval_plan",
    "compare",
    "execute_run",
    "parse_losses",
    "parse_param",
    "plan_runs",
    "read_compare_config",
    "resolve_variants",
    "run_all",
    "sweep",
    "sweep_variants",
    "synthetic_extras",
    "synthetic_root",
]
