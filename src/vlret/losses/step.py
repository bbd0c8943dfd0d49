"""What a training step hands to a loss: one :class:`StepInputs` record.

The trainer fills the record once per step (ids, the gathered flag, a rank's shard, momentum
keys, the batch's caption strings) and calls :meth:`vlret.losses.PairLoss.forward_step`; the
loss takes the fields it declared in :meth:`~vlret.losses.PairLoss.step_inputs` and nothing
else, so a new loss that needs, say, the captions declares it instead of the trainer learning a
new keyword. Caption strings are looked up only when a loss declares ``"captions"``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

#: The fields of :class:`StepInputs` a loss may declare (besides the ids, which every loss gets).
STEP_FIELDS = ("shard", "img_keys", "txt_keys", "gathered", "captions")
#: The fields only the embedding entry point takes (a model that scores pairs has none of them).
EMBEDDING_INPUTS = frozenset({"shard", "img_keys", "txt_keys", "gathered"})


@dataclass(frozen=True)
class StepInputs:
    """One training step's inputs to a loss besides the two embedding matrices.

    Attributes:
        img_ids: ``(B,)`` image ids of the (gathered) batch's rows; equal ids mark further
            positives.
        txt_ids: ``(B,)`` image ids of the columns' captions (default: ``img_ids``).
        shard: ``(start, stop)``: compute only the terms of pairs ``start:stop`` of the
            gathered batch (data-parallel local shards; tiled losses only).
        img_keys: ``(B, D)`` momentum-encoder image keys (a loss with a memory queue).
        txt_keys: ``(B, D)`` momentum-encoder text keys.
        gathered: The embeddings and keys are already the global batch of every rank (a
            queue enqueues them once, without gathering again).
        captions: The ``B`` caption strings of the columns, in column order (VSL's text side).
        epoch: The 0-based epoch of the step.
        step: The number of optimisation steps taken before this one.
    """

    img_ids: torch.Tensor | None = None
    txt_ids: torch.Tensor | None = None
    shard: tuple[int, int] | None = None
    img_keys: torch.Tensor | None = None
    txt_keys: torch.Tensor | None = None
    gathered: bool = False
    captions: Sequence[str] | None = None
    epoch: int = 0
    step: int = 0

    def keywords(self, names: frozenset[str]) -> dict[str, object]:
        """The declared fields ``names`` that are set, as keyword arguments of ``forward``.

        Raises:
            ValueError: A name that is not a declarable field.
        """
        unknown = sorted(set(names) - set(STEP_FIELDS))
        if unknown:
            known = ", ".join(STEP_FIELDS)
            raise ValueError(f"step inputs {unknown} are not fields of StepInputs ({known})")
        out: dict[str, object] = {}
        for name in STEP_FIELDS:
            value = getattr(self, name)
            if name in names and value is not None and value is not False:
                out[name] = value
        return out
