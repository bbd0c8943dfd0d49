"""What ``vlret eval RUN_OR_CKPT --protocol P`` evaluates when only a run and a protocol are
named: the run folder's checkpoint (:func:`run_checkpoint`), the data folder of the run's
config and the protocol's split of that data (:func:`resolve_eval_inputs`). An explicit
``--data`` / ``--split`` always wins.

Shared by ``vlret eval`` and ``vlret plot tsne`` (a run folder or a checkpoint); the data a
stored run is evaluated on is :mod:`vlret.run.eval_data`'s.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ..eval import EvalProtocol, get_protocol
from .eval_data import default_split, stored_eval_data

#: The checkpoints of a run folder, in the order one is taken: ``best.pt`` (the best dev epoch,
#: or the last epoch of a run without validation once it has ended), else ``last.pt`` (a run
#: without validation still running or stopped early, or stopped before its first epoch ended
#: with ``train.checkpoint_every``).
RUN_CHECKPOINTS = ("best.pt", "last.pt")


def run_checkpoint(run: str | Path) -> Path:
    """``run``'s ``best.pt`` when ``run`` is a run folder (else its ``last.pt``), or ``run``
    itself when it is a file (a checkpoint).

    Raises:
        FileNotFoundError: No such folder or file, or a folder holding neither checkpoint.
    """
    path = Path(run)
    if path.is_dir():
        for name in RUN_CHECKPOINTS:
            if (path / name).is_file():
                return path / name
        raise FileNotFoundError(
            f"{path}: no best.pt or last.pt; expected the run folder of vlret train after its "
            "first epoch (or pass a checkpoint file)"
        )
    if not path.is_file():
        raise FileNotFoundError(f"{path}: missing; expected a run folder or a checkpoint")
    return path


def _checkpoint_why(given: Path, chosen: Path) -> str | None:
    """Why a run folder's checkpoint was taken (``None`` for a checkpoint file given)."""
    if given == chosen:
        return None
    if chosen.name == "best.pt":
        return "the run's best.pt"
    return "the run has no best.pt yet: its last.pt, the latest epoch"


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
        ``data: ...``, ``split: ...``), what ``vlret eval`` prints before its table."""
        lines = [
            f"checkpoint: {c} ({self.why[str(c)]})" for c in self.checkpoints if str(c) in self.why
        ]
        for key, value in (("data", self.data), ("split", self.split)):
            if key in self.why:
                lines.append(f"{key}: {value} ({self.why[key]})")
        return lines


def resolve_eval_inputs(
    given: Sequence[str | Path],
    *,
    protocol: str | EvalProtocol,
    data: str | Path | None = None,
    split: str | None = None,
    model_dir: str | Path | None = None,
) -> EvalInputs:
    """The checkpoints of ``given`` (run folders or checkpoint files), and ``data`` / ``split``
    where not given: the first checkpoint's stored ``data.root`` (a path relative to the
    folder the run was trained from, as every path: :mod:`vlret.data.paths`) and the first split
    ``protocol`` evaluates in the data the run is evaluated on
    (:func:`~vlret.run.eval_data.default_split`; a run trained on shards or a CSV: Karpathy).
    With ``model_dir`` (a local Hugging Face CLIP, no run) ``data`` is required and the split
    is the protocol's Karpathy split.

    Raises:
        FileNotFoundError: A missing run folder, checkpoint or data folder, or a run folder
            without a checkpoint.
        ValueError: No data folder can be taken from the run (``model_dir``; a person-search
            protocol of a run trained on other data), or the protocol does not evaluate the
            run's data.
    """
    from .builders import stored_run
    from .checkpoint import load_checkpoint

    chosen = get_protocol(protocol)
    paths = [Path(p) for p in given]
    checkpoints = [run_checkpoint(p) for p in paths]
    why = {
        str(c): w for p, c in zip(paths, checkpoints, strict=True) if (w := _checkpoint_why(p, c))
    }
    if data is not None and split is not None:
        return EvalInputs(checkpoints, Path(data), split, why)
    if model_dir is not None or not checkpoints:
        if data is None:
            raise ValueError("--data: required with --model-dir (a CLIP folder holds no data)")
        if split is None:
            split = default_split(chosen, data_format="karpathy")
            why["split"] = f"protocol {chosen.name}'s test split of karpathy data"
        return EvalInputs(checkpoints, Path(data), split, why)
    first = checkpoints[0]
    state = load_checkpoint(first)
    if not isinstance(state, dict) or "config" not in state:
        raise ValueError(f"{first}: not a `vlret train` checkpoint (no config)")
    trained = stored_run(state["config"], source=f"{first} (stored config)").data
    evaluated = stored_eval_data(trained, protocol=chosen)
    if split is None:
        try:
            split = default_split(chosen, data_format=evaluated.format)
        except ValueError as err:
            raise ValueError(f"{first}: {err} (it was trained on {trained.format} data)") from None
        why["split"] = f"protocol {chosen.name}'s test split of {evaluated.format} data"
    if data is None:
        if evaluated.format != trained.format and trained.format not in ("webdataset", "csv"):
            raise ValueError(
                f"--data: {first} was trained on {trained.format} data and protocol "
                f"{chosen.name} evaluates {evaluated.format} data; pass its folder with --data"
            )
        data = Path(trained.root)
        if not data.exists():
            raise FileNotFoundError(
                f"{first}: its data.root {trained.root} is missing (relative paths start from "
                "the folder the run was trained from); pass the data folder with --data"
            )
        why["data"] = "the run's data.root"
    return EvalInputs(checkpoints, Path(data), split, why)


def run_protocol(run: str | Path) -> str:
    """The default protocol of the data ``run`` (a run folder or a checkpoint) is evaluated on
    (:func:`~vlret.eval.default_protocol`; a run trained on shards or a CSV: Karpathy's), for a
    command given a run but no ``--protocol`` (``vlret report RUN``).

    Raises:
        FileNotFoundError: As :func:`run_checkpoint`.
        ValueError: Not a ``vlret train`` checkpoint, or no protocol is the default for its
            data format.
    """
    from ..eval import default_protocol
    from .builders import stored_run
    from .checkpoint import load_checkpoint

    checkpoint = run_checkpoint(run)
    state = load_checkpoint(checkpoint)
    if not isinstance(state, dict) or "config" not in state:
        raise ValueError(f"{checkpoint}: not a `vlret train` checkpoint (no config)")
    trained = stored_run(state["config"], source=f"{checkpoint} (stored config)").data
    evaluated = stored_eval_data(trained)
    protocol = default_protocol(evaluated.format)
    if protocol is None:
        raise ValueError(
            f"{checkpoint}: no protocol is the default for {evaluated.format} data; pass --protocol"
        )
    return protocol.name


__all__ = ["RUN_CHECKPOINTS", "EvalInputs", "resolve_eval_inputs", "run_checkpoint", "run_protocol"]
