"""Running a comparison: train (or resume, or read) each run, test it, and keep its result
next to it (see :mod:`vlret.analysis.compare` for the resume rules).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..._files import atomic_write_text
from ..._progress import shows
from ..._settings import defaults
from ...metrics import normalise_metric_record
from ...run.config import RunConfig
from ...run.config_sections import SECTION_CLASSES
from ...train.hooks.core import EpochCallback
from ...train.trainer import Trainer
from ..tables import SYNTHETIC_KEYS, RunResult
from .scoring import evaluate_run, extras_world, synthetic_extras
from .spec import CompareError, EvalSettings, RunSpec

RESULT_FILE = "result.json"
SPEC_FILE = "spec.json"


@dataclass(frozen=True)
class RunOutcome:
    """``status``: ``cached`` (result file found), ``resumed`` (from last.pt) or ``trained``."""

    spec: RunSpec
    status: str
    result: RunResult


class ComparisonTrainer(Trainer):
    """The trainer with ``on_epoch(epochs_done)`` after each epoch (the progress display), an
    :class:`~vlret.train.hooks.core.EpochCallback` hook; the dev similarities of the plots
    (``dev_pos_sim`` / ``dev_hardest_neg_sim``) are logged by :meth:`Trainer.validate` itself."""

    def __init__(
        self,
        config: RunConfig,
        *,
        resume: str | Path | None = None,
        on_epoch: Callable[[int], None] | None = None,
        overwrite: bool = False,
        print_fn: Callable[[str], None] | None = None,
    ) -> None:
        hooks = [EpochCallback(on_epoch)] if on_epoch is not None else []
        # no bar per run: the comparison draws one over its plan (demo's workers: epoch lines)
        quiet = dataclasses.replace(config.train, progress=False)
        config = dataclasses.replace(config, train=quiet)
        super().__init__(config, resume=resume, overwrite=overwrite, print_fn=print_fn, hooks=hooks)


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


def _section_defaults() -> dict[str, dict[str, Any]]:
    """Each declared section's defaults (``data``, ``optim``, ``train``; a required key has
    none), from the keys' declarations (:func:`vlret._settings.defaults`)."""
    return {
        section: {k: v for k, v in defaults(cls).items() if v is not ...}
        for section, cls in SECTION_CLASSES.items()
    }


def same_run(stored: dict[str, Any], fingerprint: dict[str, Any]) -> bool:
    """Whether a run folder's ``spec.json`` (``stored``) is this comparison's run
    (``fingerprint``, :func:`run_fingerprint`). A config key a later vlret added, absent from
    ``stored``, matches when it holds its default here (``None`` in the ``model`` table): the
    finished run trained as that default says, so an upgrade does not orphan finished runs; any
    other difference is another run."""
    if stored == fingerprint:
        return True
    old, new = stored.get("config"), fingerprint.get("config")
    if not isinstance(old, dict) or not isinstance(new, dict):
        return False
    defaults = _section_defaults()
    adjusted = dict(new)
    for section, values in new.items():
        before = old.get(section)
        if not isinstance(values, dict) or not isinstance(before, dict):
            continue
        keep = {}
        for key, value in values.items():
            default = defaults.get(section, {}).get(key) if section != "model" else None
            if key not in before and _json_roundtrip(default) == value:
                continue  # added since the run, at its default
            keep[key] = value
        adjusted[section] = keep
    return stored == {**fingerprint, "config": adjusted}


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
        title=str(record.get("title", "")),
    )


def is_finished(spec: RunSpec) -> bool:
    return (spec.run_dir / RESULT_FILE).is_file()


def _write_json(path: Path, value: Any) -> None:
    atomic_write_text(path, json.dumps(value, indent=2) + "\n")


def check_eval_plan(specs: Sequence[RunSpec], settings: EvalSettings) -> None:
    """Before any training: the test protocol evaluates the test split of every run's data
    format (:func:`~vlret.run.evaluate.check_eval_split`), the test data folder exists, and
    the split opens there as the evaluation will open it, with the protocol's folds fitting its
    images (:func:`_check_eval_data`), so a wrong ``[compare]`` protocol / split / data (a
    world with only ``testall`` under the default ``test``) fails in seconds, not after the
    runs."""
    from ...eval import get_protocol
    from ...run.evaluate import check_eval_split

    opened: set[str] = set()  # the runs of a comparison share their test data: opened once
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
        _check_eval_data(spec, settings, get_protocol(settings.protocol), data, opened)


def _check_eval_data(
    spec: RunSpec, settings: EvalSettings, protocol: Any, data: Path, opened: set[str]
) -> None:
    """Open the test split of ``data`` with the data settings the evaluation of ``spec``'s
    checkpoint will use (:func:`vlret.run.evaluate.run_evaluation`: a run on shards or a CSV
    is evaluated on Karpathy JSON + images, one on other data under a person-search protocol in
    that protocol's format) and check the protocol's folds against its images; captions are
    not encoded (no vocabulary yet). A problem is a :class:`CompareError` naming
    ``compare.split`` and ``compare.protocol``. ``opened``: the settings already checked."""
    from ...data.formats import open_dataset
    from ...run.eval_data import eval_data_config, stored_eval_data

    run_data = stored_eval_data(spec.config.data, protocol=protocol)
    key = json.dumps([dataclasses.asdict(run_data), str(data)], sort_keys=True, default=str)
    if key in opened:
        return
    try:
        split = open_dataset(
            eval_data_config(run_data, data), settings.split, protocol=protocol.data_protocol
        )
        protocol.check_folds(int(split.num_images))
    except (OSError, ValueError) as err:
        raise CompareError(
            f"compare.split = {settings.split!r}, compare.protocol = {protocol.name!r}: cannot "
            f"evaluate {data}: {err}; set compare.split / compare.protocol to a split the data "
            f"holds ({protocol.name} evaluates {protocol.accepted(sep=', ')}; `vlret protocols` "
            "lists the others)"
        ) from None
    opened.add(key)


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
    run_dir = spec.run_dir
    run_dir.mkdir(parents=True, exist_ok=True)
    fingerprint = run_fingerprint(spec, settings)
    spec_path = run_dir / SPEC_FILE
    if spec_path.is_file():
        stored = json.loads(spec_path.read_text(encoding="utf-8"))
        if not same_run(stored, fingerprint):
            raise CompareError(
                f"{run_dir} holds a run with other settings than this comparison's "
                f"({spec_path}); use another --out or delete that folder"
            )
    else:
        _write_json(spec_path, fingerprint)
    result_path = run_dir / RESULT_FILE
    world = extras_world(settings, spec)  # None under a person-search protocol
    if result_path.is_file():
        # a result written before the key rename reads as today's (t2i_R1: identity_t2i_r1)
        record = normalise_metric_record(json.loads(result_path.read_text(encoding="utf-8")))
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
    evaluation = evaluate_run(checkpoint, spec, settings)
    # the Evaluation's own record (protocol, split, title, sizes), the checkpoint relative to
    # the run folder (read back above when the run is cached) and the run's identity
    record = {
        **evaluation.record(),
        "checkpoint": checkpoint.name,
        "label": spec.variant.label,
        "loss": spec.variant.loss,
        "params": _json_roundtrip(spec.variant.params),
        "seed": spec.seed,
        "epochs": trainer.epoch,
    }
    if world is not None:
        record["synthetic"] = synthetic_extras(evaluation, root=world, spec=spec, settings=settings)
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
    if progress and shows():  # a terminal, bars not switched off, tqdm installed
        from tqdm.auto import tqdm  # type: ignore[import-untyped]  # shows(): installed

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

            def print_line(line: str, name: str = name) -> None:
                write(f"{name}: {line}")

            outcomes.append(
                execute_run(
                    spec,
                    settings,
                    on_start=started,
                    on_epoch=finished_epoch,
                    print_fn=print_line,
                )
            )
    finally:
        bar.close()
    return outcomes


__all__ = [
    "RESULT_FILE",
    "SPEC_FILE",
    "ComparisonTrainer",
    "RunOutcome",
    "check_eval_plan",
    "execute_run",
    "is_finished",
    "run_all",
    "run_fingerprint",
]
