"""Will this config run on this data? ``vlret train CONFIG --check`` and ``--check-config``.

Two levels, both writing nothing:

* :func:`check_config`: the config alone, as :func:`vlret.run.load_config` reads it (every
  key, type, constraint and cross-check between keys, a cosine warm-up within
  ``train.max_steps_per_epoch``) plus the ``[model]`` section built once with a stand-in
  vocabulary (:func:`vlret.run.builders.check_model_config`). No data, model folder or
  output folder is read, so it serves configs whose data is elsewhere (the paper configs).
* :func:`check_run`: everything a run checks before its first step, by the run's own code: a
  :class:`~vlret.train.Trainer` built with ``check=True`` opens the splits (shards listed and
  checked, CSV and annotation files read, features scanned where ``data.check_features``),
  builds the vocabulary or tokenizer, the model (a model folder read), the loss, the procedure,
  the optimiser and the schedule (a cosine warm-up within the run's steps as the data count
  them), reads a ``--resume`` checkpoint and checks it against the config, and checks the output
  folder (another run there without ``overwrite``, a folder that cannot be written, one in use
  by a live run). It creates no folder, takes no lock and writes no file; what it returns is the
  start-of-run summary a real run prints.

Both raise what the run raises (:class:`~vlret.run.ConfigError` naming the key,
:class:`~vlret.data.DataFormatError`, ``FileNotFoundError``, ``ValueError``); the command line
prints it as one line with exit status 2.
"""

from __future__ import annotations

from pathlib import Path

from ..run.builders import check_model_config
from ..run.config import RunConfig
from .parallel.distributed import shutdown_distributed
from .run_log import run_summary

#: The last line of ``vlret train --check``.
CHECK_PASSED = "check passed: nothing was written; drop --check to start this run"
#: The last line of ``vlret train --check-config``.
CONFIG_PASSED = (
    "config check passed (the config alone: no data, model folder or output folder read; "
    "--check checks those too)"
)


def check_config(config: RunConfig) -> str:
    """Check the config alone: what :func:`vlret.run.load_config` checked, plus the
    ``[model]`` section built once with a stand-in vocabulary (skipped for the kinds that load
    weights from disk, whose folder only :func:`check_run` reads).

    Args:
        config: A config read by :func:`vlret.run.load_config` or
            :func:`vlret.run.config_from_dict` (which ran the key checks).

    Returns:
        A short summary: the loss, the model kind, the data format and where it would be read,
        the schedule and the output folder.

    Raises:
        ConfigError: The model section cannot be built, naming its key.
    """
    check_model_config(config)
    data, tc, optim = config.data, config.train, config.optim
    kind = config.model.get("kind", "vse")
    steps = (
        f", at most {tc.max_steps_per_epoch} steps per epoch (train.max_steps_per_epoch)"
        if tc.max_steps_per_epoch is not None
        else ""
    )
    return "\n".join(
        [
            f"config: {config.source}",
            f"  loss: {config.loss.name}; model: {kind}",
            f"  data: {data.format} at {data.root} (not read)",
            f"  optim: {optim.name}, lr {optim.lr:g}, schedule {optim.schedule}",
            f"  epochs: {tc.epochs}, batch {tc.batch_size}{steps}",
            f"  output: {config.output_dir} (not checked)",
        ]
    )


def check_run(
    config: RunConfig, *, resume: str | Path | None = None, overwrite: bool = False
) -> str:
    """Check everything a run of ``config`` checks before its first step, writing nothing.

    Args:
        config: The run config (from :func:`vlret.run.load_config`).
        resume: The checkpoint a ``--resume`` would continue from (read and checked against the
            config; the run folder's log and ``best.pt`` are left as they are).
        overwrite: Check as ``--overwrite`` would run: another run in ``output_dir`` is not an
            error (its files are not deleted).

    Returns:
        The start-of-run summary the run would print (device, the splits' sizes, steps per
        epoch and batch, epochs, output folder).

    Raises:
        ConfigError: A key the data, model or schedule refuses (named).
        ValueError: The data or the output folder refuses the run (the run's own messages).
    """
    from .trainer import Trainer

    try:
        trainer = Trainer(config, resume=resume, overwrite=overwrite, print_fn=None, check=True)
        try:
            return run_summary(trainer.context)
        finally:
            trainer.close()
    finally:
        shutdown_distributed()


__all__ = ["CHECK_PASSED", "CONFIG_PASSED", "check_config", "check_run"]
