"""`vlret demo`: the quick demo, or a loss comparison on a synthetic world.

* ``vlret demo`` (no ``--preset``; a few seconds): every registered loss on a seeded batch
  (value and gradient norm), then the retrieval metrics of a seeded toy problem
  (:func:`vlret.tour.run_demo`).
* ``vlret demo --preset tiny|small``: :func:`run_comparison_demo` writes the synthetic world of
  the preset (reused when the folder already holds it with the same settings), then compares
  triplet-HN, InfoNCE, Unified, GOAL (cir, sig-ms), VSL and AdaCL, each with its paper's
  hyper-parameters, on the same model (the packaged configs ``vlret/configs/demo_*.toml``),
  and returns a :class:`DemoResult` (the comparison report: table, CSV, JSON, plots).

=========  ===========================================================  ===================
preset     world / schedule                                             expected, 2 cores
=========  ===========================================================  ===================
``tiny``   synthetic ``tiny`` (240 / 40 / 40 images x 5 captions),      ~1.1 min
           batch 32, 10 epochs of 37 steps (5 of them warm-up), 1 seed
``small``  synthetic ``small`` (the f30k-like world with 6000 train      ~5.7 min, up to
           and 500 dev images; its 1000-image test split), batch 128,   0.7 GB RAM per
           6 epochs of 156 steps (2 of them warm-up), 1 seed            worker
           (``make demo``)
=========  ===========================================================  ===================

The runs train in parallel processes with one thread each (:func:`train_in_workers`), one
per core; the expected time, printed first, comes from per-step costs measured on a 2-core
AMD EPYC (:data:`MEASURED_ON`, :func:`expected_seconds`) and is for idle cores.

Triplet-HN, GOAL and VSL (triplet-HN base) get VSE-infinity's all-negatives warm-up
(``train.all_negatives_epochs`` in the configs' ``[train]``; :mod:`vlret.run.warmup`), the
other three losses have no hardest-negative phase to warm up.

Layout of OUT (default ``runs/demo``): ``data-{preset}/`` (the world), ``demo_{preset}.yaml``
(the resolved comparison config: ``OMP_NUM_THREADS=1 vlret compare`` on it reproduces the
numbers) and
``{preset}-e{epochs}/`` (the comparison; finished runs are reused, as with ``vlret compare``).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import torch

from ._files import atomic_write_text

#: Where the costs below were measured. Per-step costs are CPU seconds of one step with one
#: thread (the wall time of a step when its process has a core to itself), medians of 1-6
#: measurements of 20-30 steps; the machine ran other jobs at the time (load average 4-5 on
#: its 2 cores), which slows a step's own CPU time too, so an idle machine is a little faster.
MEASURED_ON = "a 2-core AMD EPYC VM, torch 2.13 CPU"
#: Seconds of one training step per label, one thread (see :class:`DemoPreset`).
TINY_STEP_SECONDS = {
    "triplet-hn": 0.029,
    "infonce": 0.028,
    "unified": 0.029,
    "goal": 0.030,
    "vsl": 0.031,
    "adacl": 0.059,
}
#: The rest of a run (vocabulary, data, dev and test evaluation) and of the demo (world,
#: worker start, report and plots), from ``time`` of the whole demo (CPU seconds).
TINY_RUN_SECONDS = 2.0
TINY_EXTRA_SECONDS = 18.0
SMALL_STEP_SECONDS = {
    "triplet-hn": 0.087,
    "infonce": 0.087,
    "unified": 0.084,
    "goal": 0.083,
    "vsl": 0.105,
    "adacl": 0.142,
}
SMALL_RUN_SECONDS = 8.0
SMALL_EXTRA_SECONDS = 25.0
#: The demo configs' model (VSE++-style: FC + max pooling on the regions, bi-GRU).
_MODEL: dict[str, Any] = {
    "embed_dim": 128,
    "image": {"kind": "precomp", "in_dim": 64, "pooling": "max"},
    "text": {"kind": "gru", "word_dim": 64, "bidirectional": True, "pooling": "last"},
}


@dataclass(frozen=True)
class DemoPreset:
    """A demo: the synthetic world of the same name (``vlret synth NAME``) and the packaged
    comparison config trained on it (``vlret/configs/demo_NAME.toml``).

    The duration printed up front (:func:`expected_seconds`) comes from costs measured on
    ``measured_on`` with one thread: ``step_seconds``, the wall time of one training step of
    each label (its loss, model and batch), ``run_seconds`` the rest of a run (start, dev and
    test evaluation), ``extra_seconds`` the rest of the demo (world, report), all measured
    with the model and batch size ``measured_with`` (the packaged config's; a test checks).
    """

    name: str
    description: str = ""
    step_seconds: dict[str, float] = field(default_factory=dict)
    run_seconds: float = 0.0
    extra_seconds: float = 0.0
    measured_on: str = ""
    measured_with: dict[str, Any] = field(default_factory=dict)

    @property
    def world(self) -> str:
        return self.name

    @property
    def config_name(self) -> str:
        return f"demo_{self.name}.toml"


DEMO_PRESETS: dict[str, DemoPreset] = {
    "tiny": DemoPreset(
        "tiny",
        description="synthetic tiny world (240/40/40 images), 10 epochs, 1 seed",
        step_seconds=TINY_STEP_SECONDS,
        run_seconds=TINY_RUN_SECONDS,
        extra_seconds=TINY_EXTRA_SECONDS,
        measured_on=MEASURED_ON,
        measured_with={**_MODEL, "image": {**_MODEL["image"], "in_dim": 32}, "batch_size": 32},
    ),
    "small": DemoPreset(
        "small",
        description="synthetic small world (the f30k-like one with 6000 train / 500 dev "
        "images, its 1000-image test split), 6 epochs of 156 steps (2 of them warm-up), 1 seed",
        step_seconds=SMALL_STEP_SECONDS,
        run_seconds=SMALL_RUN_SECONDS,
        extra_seconds=SMALL_EXTRA_SECONDS,
        measured_on=MEASURED_ON,
        measured_with={**_MODEL, "batch_size": 128},
    ),
}
WORLD_SEED = 0


def demo_config_text(preset: str) -> str:
    """The packaged comparison config of ``preset`` (``vlret/configs/demo_{preset}.toml``)."""
    from importlib import resources

    return (resources.files("vlret") / "configs" / DEMO_PRESETS[preset].config_name).read_text(
        encoding="utf-8"
    )


def ensure_world(
    preset: str, root: str | Path, print_fn: Callable[[str], None] = print
) -> tuple[Path, bool]:
    """Write the synthetic world of ``preset`` to ``root``, or reuse it when ``root`` already
    holds the same world (preset, seed, config, format, no noise); ``(root, written)``."""
    from .worlds import META_FILE, get_preset, write_synthetic

    p = DEMO_PRESETS[preset]
    root = Path(root)
    want = {
        "preset": p.world,
        "format": "precomp",
        "seed": WORLD_SEED,
        "noise": None,
        "config": json.loads(json.dumps(asdict(get_preset(p.world)))),
    }
    meta_path = root / META_FILE
    if meta_path.is_file():
        try:
            meta = json.loads(meta_path.read_text(encoding="utf-8"))
        except json.JSONDecodeError:
            meta = {}
        if {k: meta.get(k) for k in want} == want:
            print_fn(f"data: {root} (reused)")
            return root, False
    start = time.perf_counter()
    write_synthetic(
        p.world,
        root,
        format="precomp",
        seed=WORLD_SEED,
        overwrite=meta_path.is_file(),  # an earlier demo world with other settings
    )
    print_fn(f"data: {root} (written in {time.perf_counter() - start:.1f} s)")
    return root, True


def write_demo_config(
    preset: str,
    path: str | Path,
    *,
    data_root: Path,
    epochs: int | None = None,
    seed: int | None = None,
) -> Path:
    """The packaged config of ``preset`` pointed at ``data_root`` (and its feature size), with
    the optional ``train.epochs`` / ``train.seed``, written as YAML to ``path`` (atomically,
    :func:`vlret._files.atomic_write_text`)."""
    import sys

    from ._extras import require

    yaml = require("yaml", "the demo's run config")

    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover
        import tomli as tomllib

    raw = tomllib.loads(demo_config_text(preset))
    meta = json.loads((data_root / "synthetic.json").read_text(encoding="utf-8"))
    hint = meta["train_config_hint"]
    raw["data"].update(hint["data"])
    raw["model"]["image"]["in_dim"] = hint["image_in_dim"]
    if epochs is not None:
        raw["train"]["epochs"] = epochs
    if seed is not None:
        raw["train"]["seed"] = seed
    header = (
        f"# vlret demo --preset {preset}: resolved from the packaged "
        f"{DEMO_PRESETS[preset].config_name}\n"
    )
    return atomic_write_text(path, header + yaml.safe_dump(raw, sort_keys=False))


@dataclass
class DemoResult:
    report: Any  # ComparisonReport
    config: Path
    data: Path
    seconds: float
    seeds: int
    command: str = ""


def usable_cores() -> int:
    """CPU cores this process may run on (its affinity mask where the platform has one)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover - macOS, Windows
        return max(1, os.cpu_count() or 1)


def split_runs(costs: Sequence[float], workers: int) -> list[list[int]]:
    """Indices of ``costs`` in at most ``workers`` groups of near-equal total cost (longest
    first, each to the least loaded group); empty groups are dropped."""
    groups: list[list[int]] = [[] for _ in range(max(1, workers))]
    totals = [0.0] * len(groups)
    for i in sorted(range(len(costs)), key=lambda k: (-costs[k], k)):
        g = min(range(len(groups)), key=lambda k: (totals[k], k))
        groups[g].append(i)
        totals[g] += costs[i]
    return [g for g in groups if g]


def steps_per_run(raw: dict[str, Any], world: Any) -> int:
    """Training steps of one run of the resolved config ``raw`` on the synthetic world config
    ``world``: epochs x batches per epoch (whole batches of the training captions, at most
    ``train.max_steps_per_epoch``)."""
    train = raw["train"]
    captions = world.splits["train"] * world.captions_per_image
    per_epoch = captions // train["batch_size"]
    if train.get("max_steps_per_epoch"):
        per_epoch = min(per_epoch, train["max_steps_per_epoch"])
    return train["epochs"] * per_epoch


def run_costs(preset: str, labels: Sequence[str], steps: int) -> list[float]:
    """Expected wall seconds of each run (one per entry of ``labels``) of ``steps`` training
    steps, from the per-step costs of :data:`DEMO_PRESETS` (their mean for an unknown label)."""
    p = DEMO_PRESETS[preset]
    mean = sum(p.step_seconds.values()) / max(len(p.step_seconds), 1)
    return [p.step_seconds.get(label, mean) * steps + p.run_seconds for label in labels]


def expected_seconds(preset: str, labels: Sequence[str], *, steps: int, workers: int) -> float:
    """The demo's expected wall time for runs of ``labels`` (one entry per run) of ``steps``
    steps each in ``workers`` one-thread processes, grouped as :func:`split_runs` groups them,
    plus the world and the report, on the machine of :data:`MEASURED_ON`."""
    costs = run_costs(preset, labels, steps)
    groups = split_runs(costs, workers)
    longest = max((sum(costs[i] for i in g) for g in groups), default=0.0)
    return longest + DEMO_PRESETS[preset].extra_seconds


def _minutes(seconds: float) -> str:
    return f"{seconds / 60:.1f} min" if seconds >= 90 else f"{seconds:.0f} s"


def _check_fingerprints(specs: Sequence[Any], settings: Any) -> None:
    """The error ``vlret compare`` gives for a run folder of other settings, before any
    worker starts."""
    from .analysis.compare import SPEC_FILE, CompareError, run_fingerprint

    for spec in specs:
        path = spec.run_dir / SPEC_FILE
        if path.is_file():
            stored = json.loads(path.read_text(encoding="utf-8"))
            if stored != run_fingerprint(spec, settings):
                raise CompareError(
                    f"{spec.run_dir} holds a run with other settings than this comparison's "
                    f"({path}); use another --out or delete that folder"
                )


def train_in_workers(
    config: Path,
    out: Path,
    runs: Sequence[tuple[str, int]],
    *,
    seeds: int,
    costs: Sequence[float],
    workers: int,
    epoch_lines: bool = True,
) -> None:
    """Train and test the runs ``(label, seed)`` of ``config`` into ``out`` in ``workers``
    processes at once, each with one thread (``python -m vlret.demo --train-runs``); each
    prints a line per finished run, and per epoch with ``epoch_lines``.

    One thread per run: a two-thread step stalls when the cores are shared with other jobs
    (the two threads wait on each other; measured side by side on 2 cores at load average ~5:
    0.5-3.7 s per step for one two-thread run, 0.25-0.56 s for each of two one-thread runs),
    and a run's numbers depend on the thread count (CPU reductions round differently), so one
    thread makes them independent of the number of cores. Ctrl-C: every worker saves its
    ``last.pt``; :class:`~vlret.train.TrainingInterrupted` is raised when all have stopped."""
    from .analysis.compare import CompareError
    from .train import TrainingInterrupted

    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    procs = []
    for group in split_runs(costs, workers):
        items = [f"{runs[i][0]}:{runs[i][1]}" for i in group]
        argv = [sys.executable, "-m", "vlret.demo", "--train-runs", str(config), str(out)]
        argv += [str(seeds), "epochs" if epoch_lines else "runs", *items]
        procs.append(subprocess.Popen(argv, env=env))
    try:
        codes = [proc.wait() for proc in procs]
    except KeyboardInterrupt:  # the workers got it too: they save last.pt and stop
        for proc in procs:
            proc.wait()
        raise TrainingInterrupted(out) from None
    if any(code == 130 for code in codes):
        raise TrainingInterrupted(out)
    failed = [code for code in codes if code != 0]
    if failed:
        raise CompareError(f"a training worker failed (exit status {failed[0]}); see above")


def _train_runs_main(argv: Sequence[str]) -> int:
    """``python -m vlret.demo --train-runs CONFIG OUT SEEDS epochs|runs LABEL:SEED...``: train
    and test those runs of the comparison, one after the other, with one thread; print a line
    per epoch and per run (``epochs``) or per run only (``runs``)."""
    from .analysis.compare import (
        eval_settings,
        execute_run,
        plan_runs,
        read_compare_config,
        resolve_variants,
    )

    torch.set_num_threads(1)
    config, out, seeds, lines, *items = argv
    pairs = [(label, int(seed)) for label, seed in (item.rsplit(":", 1) for item in items)]
    wanted = set(pairs)
    try:
        raw, section = read_compare_config(config)
        settings = eval_settings(raw, section)
        labels = list(dict.fromkeys(label for label, _ in pairs))
        variants = resolve_variants(raw, section, labels)
        for spec in plan_runs(raw, variants, int(seeds), Path(out)):
            if (spec.variant.label, spec.seed) not in wanted:
                continue
            name = f"{spec.variant.label} seed {spec.seed}"
            start = time.perf_counter()
            say = (
                (lambda x, name=name: print(f"{name}: {x}", flush=True))
                if lines == "epochs"
                else None
            )
            outcome = execute_run(spec, settings, print_fn=say)
            rsum = outcome.result.metrics.get("rsum", float("nan"))
            took = time.perf_counter() - start
            print(f"{name}: {outcome.status}, test rsum {rsum:.1f} ({_minutes(took)})", flush=True)
    except KeyboardInterrupt:  # TrainingInterrupted included: last.pt is written
        return 130
    except (FileNotFoundError, ValueError) as err:  # CompareError, ConfigError included
        print(f"vlret demo: {err}", file=sys.stderr)
        return 2
    return 0


def run_comparison_demo(
    preset: str = "tiny",
    *,
    out: str | Path = "runs/demo",
    epochs: int | None = None,
    seeds: int | None = None,
    seed: int | None = None,
    losses: Sequence[str] | None = None,
    fresh: bool = False,
    workers: int | None = None,
    progress: bool = True,
    print_fn: Callable[[str], None] = print,
) -> DemoResult:
    """Synthesize ``preset``'s world under ``out`` (or reuse it), then run the comparison of
    its packaged config; ``epochs`` / ``seeds`` / ``seed`` (first training seed) / ``losses``
    override the config's, ``fresh`` deletes an earlier comparison folder of the same
    settings first. The runs train in ``workers`` one-thread processes at once (default: one
    per usable core, at most one per run; :func:`train_in_workers`), then the report is
    written as ``vlret compare`` writes it. The expected duration is printed first."""
    import shlex

    from .analysis.compare import (
        check_eval_plan,
        compare,
        eval_settings,
        is_finished,
        plan_runs,
        read_compare_config,
        resolve_variants,
    )

    if preset not in DEMO_PRESETS:
        raise ValueError(f"preset must be one of {', '.join(DEMO_PRESETS)}, got {preset!r}")
    start = time.perf_counter()
    out = Path(out)
    data, written = ensure_world(preset, out / f"data-{preset}", print_fn=print_fn)
    if written:  # runs trained on an earlier world in the same folder would be reused
        for stale in sorted(out.glob(f"{preset}-e*")):
            if (stale / "runs").is_dir():
                shutil.rmtree(stale)
                print_fn(f"removed {stale} (trained on an earlier world)")
    config = write_demo_config(
        preset, out / f"demo_{preset}.yaml", data_root=data, epochs=epochs, seed=seed
    )
    raw, section = read_compare_config(config)
    n_epochs = raw["train"]["epochs"]
    n_seeds = seeds if seeds is not None else section.get("seeds", 1)
    cmp_dir = out / f"{preset}-e{n_epochs}"
    if fresh and cmp_dir.exists():
        shutil.rmtree(cmp_dir)
    settings = eval_settings(raw, section)
    specs = plan_runs(raw, resolve_variants(raw, section, losses), n_seeds, cmp_dir)
    check_eval_plan(specs, settings)
    _check_fingerprints(specs, settings)
    status = {
        s.run_dir: "cached"
        if is_finished(s)
        else ("resumed" if (s.run_dir / "last.pt").is_file() else "trained")
        for s in specs
    }
    pending = [s for s in specs if status[s.run_dir] != "cached"]
    n_workers = max(1, min(workers or usable_cores(), len(pending)))
    print_fn(f"comparison: {cmp_dir} ({n_seeds} seed(s), {n_epochs} epochs)")
    if pending:
        from .worlds import get_preset

        labels = [s.variant.label for s in pending]
        steps = steps_per_run(raw, get_preset(DEMO_PRESETS[preset].world))
        expected = expected_seconds(preset, labels, steps=steps, workers=n_workers)
        procs = f"{n_workers} one-thread process{'es' if n_workers > 1 else ''}"
        load = os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0
        busy = f"; load average now {load:.1f}: expect longer" if load > 0.5 else ""
        print_fn(
            f"expected ~{_minutes(expected)} on {n_workers} idle cores: {len(pending)} runs of "
            f"{steps} steps in {procs} (per-step costs measured on {MEASURED_ON}{busy})"
        )
        costs = run_costs(preset, labels, steps)
        train_in_workers(
            config,
            cmp_dir,
            [(s.variant.label, s.seed) for s in pending],
            seeds=n_seeds,
            costs=costs,
            workers=n_workers,
            epoch_lines=progress,
        )
    # Every run is finished now: the report, as `vlret compare` writes it.
    report = compare(config, losses=losses, seeds=n_seeds, out=cmp_dir, progress=False)
    report.outcomes = [replace(o, status=status[o.spec.run_dir]) for o in report.outcomes]
    argv = ["vlret", "compare", str(config), "--seeds", str(n_seeds), "--out", str(cmp_dir)]
    if losses is not None:
        argv += ["--losses", ",".join(losses)]
    # one thread, as the workers trained: CPU reductions round differently with more
    return DemoResult(
        report=report,
        config=config,
        data=data,
        seconds=time.perf_counter() - start,
        seeds=n_seeds,
        command="OMP_NUM_THREADS=1 " + " ".join(shlex.quote(a) for a in argv),
    )


if __name__ == "__main__" and sys.argv[1:2] == ["--train-runs"]:
    sys.exit(_train_runs_main(sys.argv[2:]))
