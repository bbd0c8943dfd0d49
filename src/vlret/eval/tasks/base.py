"""What every evaluation task is: a record of what it needs, what it reports and how it runs.

A task wraps one protocol record (:class:`~vlret.eval.protocols.EvalProtocol`: its name, title,
splits and metric keys) and adds what the protocol alone cannot say: what it needs to run (a
model, data, a split, a class set: :class:`TaskNeeds`), which of ``vlret eval``'s task options
it takes (:attr:`EvalTask.options`) and how it runs (:meth:`EvalTask.prepare`, which checks a
:class:`EvalRequest`, loads what it needs through the harness and returns a
:class:`PreparedTask` whose :meth:`~PreparedTask.run` scores). CLIP_benchmark keeps one module
per task the same way (``clip_benchmark/metrics/zeroshot_classification.py``,
``zeroshot_retrieval.py``).

Loading checkpoints belongs to the harness (:mod:`vlret.run`, a layer above this package), so a
task reaches it through :class:`Harness`, which :class:`vlret.run.tasks.RunHarness`
implements.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any, ClassVar, Protocol

from ..clip_benchmark import JSON_FORMATS
from ..protocols import EvalProtocol


@dataclass(frozen=True)
class TaskNeeds:
    """What a task runs on, in words (``vlret protocols --long`` prints them)."""

    #: the model(s): a checkpoint or run folder, an ensemble, a local CLIP folder ...
    model: str
    #: the data: its formats and where they are read from
    data: str
    #: the splits it evaluates
    split: str
    #: the class set (class names and prompt templates); empty for a task without classes
    classes: str = ""

    def lines(self) -> list[str]:
        """``model: ...``, ``data: ...``, ``split: ...`` (and ``classes: ...``)."""
        out = [f"model: {self.model}", f"data: {self.data}", f"split: {self.split}"]
        if self.classes:
            out.append(f"classes: {self.classes}")
        return out


@dataclass(frozen=True)
class EvalRequest:
    """What ``vlret eval`` was asked for, before anything is read.

    The options every task shares are fields; a task's own options (``shortlist``,
    ``templates`` ...) are in :attr:`options` by name, given ones only (a task refuses an option
    it does not take, :meth:`EvalTask.check_options`)."""

    #: checkpoints or run folders (several: an ensemble, where the task scores one)
    checkpoints: tuple[Path, ...] = ()
    #: a local Hugging Face CLIP folder instead of checkpoints
    model_dir: Path | None = None
    #: the data folder (``None``: the task's default, e.g. the checkpoint's own)
    data: Path | None = None
    #: the split (``None``: the protocol's test split)
    split: str | None = None
    batch_size: int = 256
    device: str = "auto"
    progress: bool = False
    #: ``openai-clip`` for a CLIP folder without processor file (``--default-preprocessing``)
    default_preprocessing: str | None = None
    #: the task's own options that were given, by name (:attr:`EvalTask.options`)
    options: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "checkpoints", tuple(Path(c) for c in self.checkpoints))
        if not isinstance(self.options, MappingProxyType):
            object.__setattr__(self, "options", MappingProxyType(dict(self.options)))


class TaskResult(Protocol):
    """What a task's run returns: its table and its JSON record."""

    def table(self) -> str:
        """The table ``vlret eval`` prints."""
        ...

    def record(self, *, json_format: str = "vlret") -> dict[str, Any]:
        """The ``--json`` record in ``json_format`` (:data:`JSON_FORMATS`)."""
        ...


class PreparedTask(Protocol):
    """A task checked and loaded, nothing scored yet (``vlret eval --check`` stops here)."""

    @property
    def notes(self) -> tuple[str, ...]:
        """The defaults taken (checkpoint, data, split ...), one line each, with why."""
        ...

    def summary(self) -> list[str]:
        """What would be evaluated: model, data, split, protocol, title, size (one line
        each)."""
        ...

    def run(self) -> TaskResult:
        """Score it."""
        ...


@dataclass(frozen=True)
class PixelModel:
    """A model that reads pixels, loaded by the harness for a task
    (:meth:`Harness.load_pixel_model`)."""

    model: Any
    #: its caption encoder (``encode(text) -> ids``)
    tokenizer: Any
    #: ``vlret-checkpoint`` or ``hf-clip`` (the CLIP_benchmark record's ``vlret.model_source``)
    source: str
    #: the checkpoint file (a run folder's ``best.pt``) or the CLIP folder
    path: Path
    #: where it runs
    device: Any
    #: why :attr:`path` was taken for what was given (a run folder), else empty
    why: str = ""
    #: the checkpoint's stored ``[train]`` section (its ``zeroshot_*`` keys are defaults)
    train: Mapping[str, Any] = field(default_factory=dict)


class Harness(Protocol):
    """What a task asks of the harness that loads runs (:class:`vlret.run.tasks.RunHarness`)."""

    def prepare_retrieval(self, protocol: EvalProtocol, request: EvalRequest) -> Any:
        """Load the members, open the split and build the scorer for a retrieval protocol
        (:func:`vlret.run.evaluate.prepare_evaluation`)."""
        ...

    def load_pixel_model(
        self,
        *,
        checkpoint: Path | None,
        model_dir: Path | None,
        device: str,
        default_preprocessing: str | None,
    ) -> PixelModel:
        """One model that reads pixels: a checkpoint (or run folder) or a CLIP folder."""
        ...


class EvalTask:
    """One evaluation task: a protocol record plus what it needs and how it runs.

    Subclasses set :attr:`options` and implement :attr:`needs` and :meth:`prepare`."""

    #: the task's own ``vlret eval`` options (:attr:`EvalRequest.options` keys) it takes
    options: ClassVar[tuple[str, ...]] = ()
    #: what kind of task it is, in a word (``retrieval``, ``classification``)
    kind: ClassVar[str] = ""

    def __init__(self, protocol: EvalProtocol) -> None:
        self.protocol = protocol

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.protocol.name!r})"

    @property
    def name(self) -> str:
        """The ``vlret eval --protocol`` name (the protocol's)."""
        return self.protocol.name

    @property
    def summary(self) -> str:
        """One line of what it scores (the protocol's)."""
        return self.protocol.summary

    @property
    def metrics(self) -> tuple[str, ...]:
        """The metric keys it reports (the protocol's)."""
        return self.protocol.metrics

    @property
    def needs(self) -> TaskNeeds:
        """What it runs on."""
        raise NotImplementedError

    def line(self) -> str:
        """One line for ``vlret protocols``: name, summary and the data it runs on."""
        return self.protocol.line()

    def details(self) -> list[str]:
        """``vlret protocols --long``: what it needs, how it runs and its metric keys, one
        indented line each."""
        runs = f"runs: vlret eval RUN_OR_CKPT --protocol {self.name} ({self.kind})"
        lines = [*self.needs.lines(), runs, f"metrics: {', '.join(self.metrics)}"]
        return [f"    {line}" for line in lines]

    def check_options(self, request: EvalRequest, *, flags: Mapping[str, str]) -> None:
        """Refuse a task option this task does not take, naming it by ``flags[name]``.

        Raises:
            ValueError: One line naming the option and the task.
        """
        for name in request.options:
            if name not in self.options:
                takes = ", ".join(flags.get(o, o) for o in self.options) or "none"
                raise ValueError(
                    f"{flags.get(name, name)}: protocol {self.name} ({self.kind}) does not take "
                    f"it (its own options: {takes})"
                )

    def check_json_format(self, json_format: str, request: EvalRequest) -> None:
        """Refuse, before anything is read, a ``--json-format`` this task cannot write for
        ``request`` (default: every format is written).

        Raises:
            ValueError: One line naming ``--json-format``.
        """
        if json_format not in JSON_FORMATS:
            raise ValueError(
                f"--json-format: expected one of {', '.join(JSON_FORMATS)}, got {json_format!r}"
            )

    def prepare(self, request: EvalRequest, *, harness: Harness) -> PreparedTask:
        """Check ``request``, load what the task needs and return it ready to score.

        Raises:
            FileNotFoundError: A missing checkpoint, folder or file.
            ValueError: A request the task cannot run (one line naming the option).
        """
        raise NotImplementedError


__all__ = [
    "EvalRequest",
    "EvalTask",
    "Harness",
    "PixelModel",
    "PreparedTask",
    "TaskNeeds",
    "TaskResult",
]
