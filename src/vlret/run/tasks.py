"""The harness's side of the evaluation tasks (:mod:`vlret.eval.tasks`): what a task asks of
the layer that reads runs and checkpoints (:class:`vlret.eval.tasks.Harness`).

:class:`RunHarness` prepares a retrieval protocol's evaluation
(:func:`~vlret.run.evaluate.prepare_evaluation`) and loads one model that reads pixels (a
checkpoint, a run folder's ``best.pt``, or a local Hugging Face CLIP) for zero-shot
classification; ``vlret eval`` hands it to :meth:`vlret.eval.tasks.EvalTask.prepare`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..eval import EvalProtocol
from ..eval.tasks import EvalRequest, PixelModel
from ..eval.zeroshot import load_hf_clip
from . import evaluate as evaluation
from .builders import trained_model_from_state
from .checkpoint import load_checkpoint
from .devices import resolve_device
from .eval_members import checkpoint_why, run_checkpoint

#: What kind of model a :class:`~vlret.eval.tasks.PixelModel` is (CLIP_benchmark records'
#: ``vlret.model_source``): a checkpoint of ``vlret train``, or a local Hugging Face CLIP.
MODEL_SOURCES = {"checkpoint": "vlret-checkpoint", "hf": "hf-clip"}


def load_pixel_checkpoint(
    path: str | Path, *, device: Any = "cpu"
) -> tuple[Any, Any, dict[str, Any]]:
    """``(model, caption encoder, stored config)`` of a ``vlret train`` checkpoint whose model
    reads pixels (``vlret zeroshot --model``, ``vlret eval --protocol
    zeroshot-classification``).

    Raises:
        FileNotFoundError: ``path`` is missing.
        ValueError: Not a readable checkpoint, or one whose model encodes precomputed features.
    """
    state = load_checkpoint(path)
    model, run, encoder = trained_model_from_state(state, path, device=device)
    if getattr(model, "image_transform", None) is None:
        raise ValueError(
            f"{path}: its model (kind {run.model.get('kind', 'vse')!r}) encodes precomputed "
            "features, not pixels; zero-shot classification needs a model that reads images "
            "(kind clip)"
        )
    config = state.get("config")
    return model, encoder, config if isinstance(config, dict) else {}


class RunHarness:
    """:class:`vlret.eval.tasks.Harness` over run folders, checkpoints and CLIP folders."""

    def prepare_retrieval(
        self, protocol: EvalProtocol, request: EvalRequest
    ) -> evaluation.PreparedEvaluation:
        """:func:`~vlret.run.evaluate.prepare_evaluation` of ``request`` (its task options are
        that function's keyword arguments)."""
        checkpoints = list(request.checkpoints)
        return evaluation.prepare_evaluation(  # looked up when called (a caller may wrap it)
            checkpoints[0] if len(checkpoints) == 1 else (checkpoints or None),
            protocol=protocol,
            data=request.data,
            split=request.split,
            batch_size=request.batch_size,
            device=request.device,
            progress=request.progress,
            model_dir=request.model_dir,
            default_preprocessing=request.default_preprocessing,
            **request.options,
        )

    def load_pixel_model(
        self,
        *,
        checkpoint: Path | None,
        model_dir: Path | None,
        device: str,
        default_preprocessing: str | None,
    ) -> PixelModel:
        """A checkpoint (a run folder: its ``best.pt``, else ``last.pt``) whose model reads
        pixels, or the local Hugging Face CLIP ``model_dir``, on ``device``.

        Raises:
            FileNotFoundError: A missing run folder, checkpoint or CLIP folder file.
            ValueError: Neither or both given, a bad device, an unreadable checkpoint or one
                whose model encodes precomputed features.
        """
        if (checkpoint is None) == (model_dir is None):
            raise ValueError("give one checkpoint (or run folder) or --model-dir, not both")
        try:
            dev = resolve_device(device)
        except ValueError as err:
            raise ValueError(f"--device: {err}") from None
        if model_dir is not None:
            model, tokenizer = load_hf_clip(
                model_dir, device=dev, default_preprocessing=default_preprocessing
            )
            return PixelModel(model, tokenizer, MODEL_SOURCES["hf"], Path(model_dir), dev)
        assert checkpoint is not None
        path = run_checkpoint(checkpoint)
        model, encoder, config = load_pixel_checkpoint(path, device=dev)
        train = config.get("train")
        return PixelModel(
            model,
            encoder,
            MODEL_SOURCES["checkpoint"],
            path,
            dev,
            why=checkpoint_why(checkpoint, path) or "",
            train=train if isinstance(train, dict) else {},
        )


__all__ = ["MODEL_SOURCES", "RunHarness", "load_pixel_checkpoint"]
