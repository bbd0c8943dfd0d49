"""What a command given run folders evaluates when only the runs (and perhaps a protocol) are
named: the checkpoints (:func:`~vlret.run.eval_members.run_checkpoint`), the data folder of the
run's config and the protocol's split of that data (:func:`resolve_eval_inputs`), and the
default protocol of a run's data (:func:`run_protocol`). An explicit ``--data`` / ``--split``
always wins. ``vlret report`` resolves them before it evaluates; ``vlret eval`` resolves the same
defaults while loading its members (:func:`~vlret.run.evaluate.prepare_evaluation`), by the
same function, :func:`~vlret.run.eval_data.member_eval_data`.

:func:`stored_data_config` is the one reader of a checkpoint's stored data config for the
commands that need nothing else of it (``vlret report``'s protocol).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ..data.config import DataConfig
from ..eval import EvalProtocol, default_protocol, get_protocol
from .builders import stored_run
from .checkpoint import load_checkpoint
from .eval_data import member_eval_data, stored_eval_data
from .eval_members import checkpoint_why, run_checkpoint


@dataclass(frozen=True)
class EvalInputs:
    """The checkpoints, data folder and split an evaluation reads, and why each one that was
    not given was chosen (``why``: ``"data"``, ``"split"`` or a checkpoint's path -> the
    reason)."""

    checkpoints: list[Path]
    data: Path
    split: str
    why: dict[str, str] = field(default_factory=dict)

    def notes(self) -> list[str]:
        """One line per default taken (``checkpoint: runs/x/best.pt (the run's best.pt)``, then
        ``data: ...``, ``split: ...``), what ``vlret report`` prints before it evaluates."""
        lines = [
            f"checkpoint: {c} ({self.why[str(c)]})" for c in self.checkpoints if str(c) in self.why
        ]
        for key, value in (("data", self.data), ("split", self.split)):
            if key in self.why:
                lines.append(f"{key}: {value} ({self.why[key]})")
        return lines


def stored_data_config(checkpoint: str | Path) -> DataConfig:
    """The data config a ``vlret train`` checkpoint stored (as trained; the data it is
    evaluated on is :func:`~vlret.run.eval_data.stored_eval_data` of it).

    Raises:
        FileNotFoundError: No such checkpoint.
        ValueError: Not a ``vlret train`` checkpoint (no config), or an unreadable one.
    """
    state = load_checkpoint(checkpoint)
    if not isinstance(state, dict) or "config" not in state:
        raise ValueError(f"{checkpoint}: not a `vlret train` checkpoint (no config)")
    return stored_run(state["config"], source=f"{checkpoint} (stored config)").data


def resolve_eval_inputs(
    given: Sequence[str | Path],
    *,
    protocol: str | EvalProtocol,
    data: str | Path | None = None,
    split: str | None = None,
) -> EvalInputs:
    """The checkpoints of ``given`` (run folders or checkpoint files), and ``data`` / ``split``
    where not given: the first checkpoint's stored ``data.root`` (a path relative to the
    folder the run was trained from, as every path: :mod:`vlret.data.paths`) and the first split
    ``protocol`` evaluates in the data the run is evaluated on
    (:func:`~vlret.run.eval_data.member_eval_data`, as ``vlret eval``; a run trained on shards or
    a CSV: Karpathy).

    Raises:
        FileNotFoundError: A missing run folder, checkpoint or data folder, or a run folder
            without a checkpoint.
        ValueError: No data folder can be taken from the run (a person-search protocol of a
            run trained on other data), or the protocol does not evaluate the run's data.
    """
    paths = [Path(p) for p in given]
    checkpoints = [run_checkpoint(p) for p in paths]
    why = {
        str(c): w for p, c in zip(paths, checkpoints, strict=True) if (w := checkpoint_why(p, c))
    }
    if data is not None and split is not None:
        return EvalInputs(checkpoints, Path(data), split, why)
    first = checkpoints[0]
    found = member_eval_data(
        stored_data_config(first),
        protocol=get_protocol(protocol),
        source=str(first),
        data=data,
        split=split,
    )
    return EvalInputs(checkpoints, found.root, found.split, {**why, **found.why})


def run_protocol(run: str | Path) -> str:
    """The default protocol of the data ``run`` (a run folder or a checkpoint) is evaluated on
    (:func:`~vlret.eval.default_protocol`; a run trained on shards or a CSV: Karpathy's), for a
    command given a run but no ``--protocol`` (``vlret report RUN``).

    Raises:
        FileNotFoundError: As :func:`~vlret.run.eval_members.run_checkpoint`.
        ValueError: Not a ``vlret train`` checkpoint, or no protocol is the default for its
            data format.
    """
    checkpoint = run_checkpoint(run)
    evaluated = stored_eval_data(stored_data_config(checkpoint))
    protocol = default_protocol(evaluated.format)
    if protocol is None:
        raise ValueError(
            f"{checkpoint}: no protocol is the default for {evaluated.format} data; pass --protocol"
        )
    return protocol.name


__all__ = ["EvalInputs", "resolve_eval_inputs", "run_protocol", "stored_data_config"]
