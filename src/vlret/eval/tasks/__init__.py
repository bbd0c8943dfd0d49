"""Evaluation tasks: what ``vlret eval`` runs and ``vlret protocols`` lists, one registry.

A task (:class:`EvalTask`) wraps a protocol record (:mod:`vlret.eval.protocols`) and says what
it needs (:class:`TaskNeeds`: a model, data, a split, a class set), which of ``vlret eval``'s
options it takes, how it runs (:meth:`EvalTask.prepare`, then
:meth:`~vlret.eval.tasks.base.PreparedTask.run`) and which metric keys it reports. One module
per kind of task, as CLIP_benchmark keeps them:

- :mod:`~vlret.eval.tasks.retrieval`: every registered protocol the retrieval pipeline ranks
  (``f30k``, ``coco1k``, ``coco5k``, ``msrvtt-full``, ``msrvtt-1ka``, ``cuhk-pedes``,
  ``icfg-pedes``, ``rstpreid`` and any protocol registered later);
- :mod:`~vlret.eval.tasks.zeroshot`: ``zeroshot-classification``.

Importing the package imports every module of it (in name order), so a new task is one module
here calling :func:`register_task` (and its test); docs/adding-a-protocol.md ("Tasks")
shows one.
"""

import importlib
import pkgutil

from .base import EvalRequest, EvalTask, Harness, PixelModel, PreparedTask, TaskNeeds, TaskResult
from .registry import get_task, register_task, task_names
from .retrieval import RetrievalTask, ranks_by_retrieval, retrieval_protocol_names

_CORE = {"base", "registry", "retrieval"}
for _module in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
    if _module.name not in _CORE and not _module.name.startswith("_"):
        importlib.import_module(f"{__name__}.{_module.name}")

__all__ = [
    "EvalRequest",
    "EvalTask",
    "Harness",
    "PixelModel",
    "PreparedTask",
    "RetrievalTask",
    "TaskNeeds",
    "TaskResult",
    "get_task",
    "ranks_by_retrieval",
    "register_task",
    "retrieval_protocol_names",
    "task_names",
]
