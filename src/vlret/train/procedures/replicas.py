"""Procedures that call the model's own methods under torchrun: the gradient average that
DistributedDataParallel's forward would have arranged.

A pair scorer's standard step calls the DistributedDataParallel wrapper (its forward scores the
rank's images against every rank's captions, :mod:`vlret.train.parallel.distributed`, "Pair
scorers"), and the wrapper averages the gradients in ``backward``. The pair bank
(:mod:`.pair_bank`) and AOQ's pair-scoring path (:mod:`.aoq`) need more than that forward
returns (the encodings themselves, to score them against the bank or the offline pairs), so
they call the model's ``encode_images``, ``encode_texts`` and ``score`` directly. The wrapper
then expects no backward and reduces nothing; :class:`AverageReplicas` does the reduction by
hand after ``backward`` (:func:`~vlret.train.parallel.distributed.average_replicas`: every
gradient averaged over the ranks, rank 0's buffers everywhere), before any clipping and the
optimiser step. With the loss scaled by the number of ranks (each rank computes the whole
loss from the gathered scores, as for the standard step), every rank then holds the gradient
of one process on the concatenated batch.
"""

from __future__ import annotations

from ..context import TrainContext
from ..hooks.core import TrainHook
from ..parallel.distributed import average_replicas


class AverageReplicas(TrainHook):
    """Averages the model's gradients over the ranks (and gives every rank rank 0's buffers)
    before the optimiser step: for a step that does not call the DistributedDataParallel
    forward (module doc). Added by a procedure under torchrun only."""

    def before_optimizer_step(self, ctx: TrainContext) -> None:
        average_replicas(ctx.model)


__all__ = ["AverageReplicas"]
