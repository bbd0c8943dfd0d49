"""A run: what every command that trains, evaluates or inspects a run shares.

A run is a config (:mod:`.config`: ``[data]``, ``[model]``, ``[loss]``, ``[optim]``,
``[train]``; its files and checks), the objects built from it (:mod:`.builders`: the encoder,
the datasets, the model, the loss), its folder (:mod:`.folder`, :mod:`.lock`: the config,
checkpoints, logs and the lock that keeps two writers out) and its checkpoints
(:mod:`.checkpoint`, :mod:`.checkpoint_members`, :mod:`.init_weights`). Evaluating a
checkpoint (:mod:`.evaluate`, the path of ``vlret eval``), importing a released one
(:mod:`.import_checkpoint`) and mining offline negatives with one (:mod:`.mine`) are built on
these. The training loop itself is :mod:`vlret.train`, which imports this package; this
package never imports the loop.
"""

from ..eval import encode_dataset
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
from .evaluate import (
    evaluate_checkpoint,
    format_metrics_table,
    metrics_json,
    protocol_metrics,
)
from .loss_config import LossConfig

__all__ = [
    "ConfigError",
    "DataConfig",
    "LossConfig",
    "OptimConfig",
    "RunConfig",
    "TrainConfig",
    "apply_overrides",
    "capture_rng_state",
    "config_from_dict",
    "encode_dataset",
    "evaluate_checkpoint",
    "format_metrics_table",
    "load_checkpoint",
    "load_config",
    "metrics_json",
    "parse_value",
    "protocol_metrics",
    "restore_rng_state",
    "save_checkpoint",
    "save_config",
]
