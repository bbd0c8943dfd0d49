"""The task registry: every evaluation task by its ``vlret eval --protocol`` name.

A task module registers its task (:func:`register_task`); every registered protocol without a
task of its own whose relevance the retrieval pipeline ranks is a
:class:`~vlret.eval.tasks.retrieval.RetrievalTask`, so a protocol registered at any time (one
module of :mod:`vlret.eval.protocols`) is a task at once. A protocol no task runs (a
class-label protocol without a task module) is not a task, and ``vlret eval`` does not offer
it: the commands list exactly what they run.
"""

from __future__ import annotations

from ..protocols import get_protocol, protocol_names
from .base import EvalTask
from .retrieval import RetrievalTask, ranks_by_retrieval

_TASKS: dict[str, EvalTask] = {}
#: the retrieval task made for each protocol without a registered task (one object per record)
_RETRIEVAL: dict[str, RetrievalTask] = {}


def register_task(task: EvalTask) -> EvalTask:
    """Add ``task`` under its protocol's name (the protocol must be registered; a second task
    of the same name is an error) and return it."""
    if not isinstance(task, EvalTask):
        raise ValueError(f"task: expected an EvalTask, got {type(task).__name__}")
    if task.name not in protocol_names() or get_protocol(task.name) is not task.protocol:
        raise ValueError(
            f"task {task.name}: its protocol is not the registered one of that name (register "
            "the protocol first, register_protocol)"
        )
    if task.name in _TASKS:
        raise ValueError(f"task {task.name!r} is registered twice")
    _TASKS[task.name] = task
    return task


def _task_of(name: str) -> EvalTask | None:
    """The task of the protocol ``name``: its registered task, else a retrieval task when the
    pipeline ranks it, else ``None``."""
    if name in _TASKS:
        return _TASKS[name]
    protocol = get_protocol(name)
    made = _RETRIEVAL.get(name)
    if made is None or made.protocol is not protocol:  # a protocol replaced: a new task
        if not ranks_by_retrieval(protocol):
            return None
        made = _RETRIEVAL[name] = RetrievalTask(protocol)
    return made


def task_names() -> tuple[str, ...]:
    """The tasks' names, in the protocols' registration order (``vlret eval --protocol``
    choices, ``vlret protocols`` lines)."""
    return tuple(name for name in protocol_names() if _task_of(name) is not None)


def get_task(task: str | EvalTask) -> EvalTask:
    """The task named ``task`` (a task is returned as is).

    Raises:
        ValueError: No task of that name (one line listing the tasks).
    """
    if isinstance(task, EvalTask):
        return task
    found = _task_of(task) if task in protocol_names() else None
    if found is None:
        raise ValueError(f"protocol must be one of {', '.join(task_names())}, got {task!r}")
    return found


__all__ = ["get_task", "register_task", "task_names"]
