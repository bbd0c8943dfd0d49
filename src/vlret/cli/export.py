"""``vlret export RUN_OR_CKPT --format hf|open_clip --out DIR``: take a CLIP trained by vlret
out to ``transformers`` or open_clip (:mod:`vlret.models.export`; docs/export.md)."""

from __future__ import annotations

import argparse
import math
from pathlib import Path
from typing import Any

from ._common import EXIT_OK, fail, require_train_extra

NAME = "export"

#: ``--format`` choices (:data:`vlret.models.export.EXPORT_FORMATS`, written out so that the
#: parser imports no torch; a test holds the two equal).
FORMATS = ("hf", "open_clip")
#: The checkpoint a run folder is exported from.
RUN_CHECKPOINT = "best.pt"


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register ``export`` on the ``vlret`` sub-command parsers."""
    p = subparsers.add_parser(
        NAME,
        help="export a CLIP trained by vlret to transformers or open_clip",
        description='Write a trained CLIP (model.kind = "clip") as a transformers CLIP folder '
        "(--format hf: CLIPModel and CLIPProcessor load it; get_image_features and "
        "get_text_features give vlret's embeddings before L2 normalisation) or as open_clip's "
        "state dict and model config (--format open_clip). What a format cannot express is "
        "refused in one line (docs/export.md).",
    )
    p.add_argument(
        "checkpoint",
        type=Path,
        metavar="RUN_OR_CKPT",
        help=f"a run folder (its {RUN_CHECKPOINT}) or a checkpoint written by vlret train",
    )
    p.add_argument("--format", required=True, choices=FORMATS, help="hf or open_clip")
    p.add_argument("--out", type=Path, required=True, help="the folder to write (created)")
    p.add_argument(
        "--overwrite",
        action="store_true",
        help="replace --out when it holds an earlier export (refused without this flag)",
    )
    p.set_defaults(func=run)
    return p


def checkpoint_path(path: Path) -> Path:
    """``path`` itself, or a run folder's ``best.pt``.

    Raises:
        FileNotFoundError: ``path`` is missing, or a folder without ``best.pt``.
    """
    if path.is_dir():
        best = path / RUN_CHECKPOINT
        if not best.is_file():
            raise FileNotFoundError(
                f"{path}: a folder without {RUN_CHECKPOINT}; expected a run folder written by "
                "vlret train or a checkpoint file"
            )
        return best
    if not path.exists():
        raise FileNotFoundError(f"{path}: missing; expected a run folder or a checkpoint")
    return path


def logit_scale(state: dict[str, Any], params: dict[str, Any]) -> tuple[float | None, str]:
    """CLIP's ``logit_scale`` (``log(1 / temperature)``) of a checkpoint and where it came
    from: the loss's learned temperature (its ``log_scale``, clamped to ``[0,
    log(max_scale)]`` as the loss clamps it), its fixed ``temperature``, or None (CLIP's
    initial value) for a loss without one."""
    import torch

    loss = state.get("loss")
    learned = loss.get("log_scale") if isinstance(loss, dict) else None
    if isinstance(learned, torch.Tensor) and learned.numel() == 1:
        top = math.log(float(params.get("max_scale", 100.0)))
        value = min(max(float(learned), 0.0), top)
        return value, f"the loss's learned temperature {math.exp(-value):.4g}"
    temperature = params.get("temperature")
    if isinstance(temperature, (int, float)) and not isinstance(temperature, bool):
        if temperature > 0:
            return math.log(1.0 / temperature), f"the loss's temperature {temperature:.4g}"
    return None, "CLIP's initial value (the loss has no temperature)"


def run(args: argparse.Namespace) -> int:
    """Export the checkpoint and print the folder and what it holds."""
    require_train_extra(NAME)
    from .._files import OutputPathError
    from ..models.export import ExportRefused, check_export_dir
    from ..run.builders import load_trained_model
    from ..run.checkpoint import load_checkpoint

    try:
        check_export_dir(args.out, overwrite=args.overwrite)
        path = checkpoint_path(args.checkpoint)
        model, stored, encoder = load_trained_model(path)
        scale, scale_source = logit_scale(load_checkpoint(path), dict(stored.loss.params))
        if args.format == "hf":
            from ..models.export.hf import export_hf as export
        else:
            from ..models.export.open_clip import export_open_clip as export
        notes = export(
            model, encoder=encoder, out=args.out, logit_scale=scale, overwrite=args.overwrite
        )
    except ExportRefused as err:
        return fail(NAME, f"{path}: cannot export to {args.format}: {err}")
    except (FileNotFoundError, ValueError, OutputPathError) as err:
        return fail(NAME, err)
    print(f"{args.out}: {args.format} export of {path} (logit_scale from {scale_source})")
    for note in notes:
        print(f"note: {note}")
    return EXIT_OK
