"""The training loop: the trainer, its state and step, optimiser groups, the schedule, logging
and validation, with the hooks (:mod:`.hooks`), several processes (:mod:`.parallel`) and the
training procedures (:mod:`.procedures`).

``vlret train CONFIG [--set section.key=value ...] [--resume PATH]`` is the command-line entry
point and :func:`train` the Python one. What a run is apart from its loop (its config, the
objects built from it, its folder and checkpoints, evaluating a checkpoint) is
:mod:`vlret.run`.
"""

from .._deprecation import module_getattr
from .context import TrainContext, TrainControl
from .deprecated import OLD_NAMES
from .hooks.core import StepOutput, TrainHook
from .optim_groups import ParamGroup
from .parallel.distributed import (
    ShardedBatchSampler,
    gather_with_grad,
    init_distributed,
    shutdown_distributed,
)
from .parallel.grad_cache import GradCache, split_batch
from .run_check import check_config, check_run
from .trainer import StepDecayWarmup, Trainer, TrainingInterrupted, TrainResult, train

__all__ = [
    "GradCache",
    "ParamGroup",
    "ShardedBatchSampler",
    "StepDecayWarmup",
    "StepOutput",
    "TrainContext",
    "TrainControl",
    "TrainHook",
    "TrainResult",
    "Trainer",
    "TrainingInterrupted",
    "check_config",
    "check_run",
    "gather_with_grad",
    "init_distributed",
    "shutdown_distributed",
    "split_batch",
    "train",
]

# 0.1.0's names of the run (config, checkpoints, evaluation) now in vlret.run, each warned
# about (vlret.train.deprecated)
__getattr__ = module_getattr(__name__, OLD_NAMES)
