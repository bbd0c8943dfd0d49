"""Training harness: configs, the trainer, checkpoints, distributed helpers and evaluation.

``vlret train CONFIG [--set section.key=value ...] [--resume PATH]`` and ``vlret eval`` are the
command-line entry points; :func:`train` and :func:`evaluate_checkpoint` the Python ones.
"""

from .._moved import renamed_names
from ..eval import protocol_names
from .checkpoint import capture_rng_state, load_checkpoint, restore_rng_state, save_checkpoint
from .config import (
    ConfigError,
    DataConfig,
    OptimConfig,
    RunConfig,
    TrainConfig,
    apply_overrides,
    config_from_dict,
    load_config,
    save_config,
)
from .config_files import parse_value
from .distributed import (
    ShardedBatchSampler,
    gather_with_grad,
    init_distributed,
    shutdown_distributed,
)
from .evaluate import (
    encode_dataset,
    evaluate_checkpoint,
    format_metrics_table,
    metrics_json,
    protocol_metrics,
)
from .grad_cache import GradCache, split_batch
from .hooks import ParamGroup, StepOutput, TrainHook
from .loss_config import LossConfig
from .run_check import check_config, check_run
from .trainer import StepDecayWarmup, Trainer, TrainingInterrupted, TrainResult, train

# vlret.train.PROTOCOLS: the registry's names now
__getattr__ = renamed_names(
    __name__, {"PROTOCOLS": ("vlret.eval.protocol_names()", protocol_names)}
)


__all__ = [
    "ConfigError",
    "DataConfig",
    "GradCache",
    "LossConfig",
    "OptimConfig",
    "ParamGroup",
    "RunConfig",
    "ShardedBatchSampler",
    "StepDecayWarmup",
    "StepOutput",
    "TrainConfig",
    "TrainHook",
    "TrainResult",
    "Trainer",
    "TrainingInterrupted",
    "apply_overrides",
    "capture_rng_state",
    "check_config",
    "check_run",
    "config_from_dict",
    "encode_dataset",
    "evaluate_checkpoint",
    "format_metrics_table",
    "gather_with_grad",
    "init_distributed",
    "load_checkpoint",
    "load_config",
    "metrics_json",
    "parse_value",
    "protocol_metrics",
    "restore_rng_state",
    "save_checkpoint",
    "save_config",
    "shutdown_distributed",
    "split_batch",
    "train",
]
