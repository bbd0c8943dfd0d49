r"""``torch.distributed`` helpers: torchrun initialisation, gathering with gradient, sharding.

Launch with ``torchrun --nproc_per_node=N -m vlret train CONFIG``. ``train.batch_size`` is the
global batch ``N * B``: :class:`ShardedBatchSampler` draws the same seeded permutation on every
rank, cuts it into global batches, and gives rank ``r`` the ``r``-th contiguous slice of ``B``
captions, so the concatenation of the local batches in rank order *is* the single-process batch.

**What every rank computes.** Each rank encodes its ``B`` pairs, then
:func:`gather_with_grad` all-gathers the embeddings of every rank (``N*B`` rows, rank order)
and puts its own local tensor back in its slot, so the autograd graph reaches the local shard
only (the other ranks' rows are constants here). Every rank then computes the *full* loss on
the *full* gathered ``(N*B) x (N*B)`` similarity matrix -- all rows, all columns, every
batch-level statistic (hardest negatives over the global batch, AdaCL's anchor and margins,
VSL's ranks) -- so every rank evaluates the same global loss ``L`` from identical inputs. The
gradient reaching rank ``r``'s parameters is ``J_r^T dL/de_r`` (``e_r`` its local embeddings,
``J_r`` their Jacobian), the part of the single-process gradient ``sum_r J_r^T dL/de_r`` that
comes from its own pairs. AdaCL's memory queue is filled with the gathered keys exactly once
(``gathered=True``, no second all-gather), so it holds on every rank what one process holds.

**Gradient scaling.** DistributedDataParallel *averages* gradients over ranks, giving
``(1/N) sum_r J_r^T dL/de_r = (1/N) grad L``. The trainer multiplies the loss by ``N``
(:func:`world_size`) before ``backward``, so the averaged gradient equals the gradient of one
process on the concatenated ``N*B`` batch (tested in float64 with 2 gloo processes, over several
steps for AdaCL with a queue and a momentum encoder). Parameters of the loss itself (a
learnable temperature) are not averaged by DDP and see ``N * grad L`` on every rank; the
trainer divides their gradient by ``N``. The logged loss is the unscaled ``L``.

**Cost, and local shards.** By default the loss is not split: its cost, ``O((N*B)^2)``
similarities plus its batch statistics, is repeated in full on every rank, and only the
encoders' work is divided by ``N``. With a tiled loss (``chunk_size`` set) that declares
``LossCapabilities.local_shards`` (InfoNCE, Unified, Triplet, GOAL), each rank instead computes
only the terms of its own ``B`` pairs, its shard ``shard=(r*B, (r+1)*B)`` of the gathered
batch -- its images against all ``N*B`` texts and its texts against all ``N*B`` images, two
``B x N*B`` rectangles, ``O(chunk_size * N*B)`` memory -- through :func:`gather_sum_grad`,
whose backward sums the gradients that all ranks' terms send to each rank's embeddings. The
ranks' terms add up to the global loss, so the same ``N`` scaling gives the single-process
gradient (tested with 2 gloo processes); the logged loss is the all-reduced sum, and a
learnable temperature's gradient (each rank sees only its own terms' share) is all-reduced
before the ``1/N``. The other losses (AdaCL, VSL) keep the full computation.

**Ring exchange.** With ``train.exchange = "ring"`` or ``"bidir"`` (a loss that declares
``LossCapabilities.pairwise_sum``: SigLIP) nothing is all-gathered: each rank keeps its images
and passes its text block from neighbour to neighbour, adding its images' terms against each
block (:mod:`vlret.train.parallel.ring`); the scaling, the logged loss and the loss parameters'
gradients are those of local shards.

**Pair scorers** (SCAN, BFAN, SGRAF: models with ``scores_pairs``). There are no embeddings
to gather: the score of a pair needs the image's regions and the caption's words together.
Inside the DistributedDataParallel forward each rank encodes its ``B`` images and ``B``
captions, :func:`gather_tokens` pads the words to the longest caption of any rank and gathers
them (``(N*B, L, D)`` and their lengths), and the rank scores its own images against every
caption: a ``B x N*B`` row block. :func:`gather_with_grad` stacks the row blocks into the
``(N*B) x (N*B)`` matrix on which every rank computes the full loss ``L`` (as above, with the
loss scaled by ``N``). Rank ``r``'s row block holds the only scores of its images, and
``dL/dS_r`` is exact on rank ``r``, so its images and the scorer's parameters receive rank
``r``'s share of the gradient; the captions of rank ``q`` are scored in every rank's row block,
so the words' gather is :func:`gather_sum_grad`, whose backward sums the gradient that all
row blocks send to each caption and returns it to the caption's rank before its text encoder
runs backward. Summed over ranks (DDP's average times ``N``) every parameter gets exactly the
single-process gradient (tested with 2 gloo processes for SCAN, BFAN and SGRAF). What cannot
match one process is what depends on the set of images a rank holds in training mode:
SGRAF's BatchNorm statistics (computed over the local images on each rank, as any DDP model
with BatchNorm) and the random dropout masks.

**Procedures that call the model's methods.** AdaCL's memory bank for pair scorers and AOQ's
pair-scoring path (:mod:`vlret.train.procedures.pair_bank`, :mod:`~vlret.train.procedures.aoq`)
need the encodings themselves, so they call ``encode_images``, ``encode_texts`` and ``score``
of the unwrapped model, gather the same row blocks (plus their own ``(B, K)`` bank scores or
per-item offline scores, stacked in rank order with :func:`gather_with_grad`) and compute the
whole loss on every rank, scaled by ``N`` as above. Without the DDP forward the wrapper
reduces nothing in ``backward``; :func:`average_replicas` (run by the procedures' hook before
the optimiser step) averages the gradients and gives every rank rank 0's buffers, as DDP
would, so the same argument gives the single-process gradient (tested with 2 gloo processes).

Only rank 0 writes files (:func:`is_main_process`).

**A stalled rank** (a paused process, SIGSTOP, a data read that never returns) would leave the
other ranks waiting in their next collective. :func:`init_distributed` creates the group with
``timeout = train.dist_timeout`` seconds (default :data:`DIST_TIMEOUT`, 600 s; torch's own
defaults are 30 minutes for gloo and 10 for NCCL), and the collectives of this module turn a
timed-out wait into :class:`DistributedTimeout`, one line naming this rank, the rank(s) it
waited for, the timeout and the key to raise (:func:`explain_timeout` words an error raised by
any other collective, DistributedDataParallel's gradient all-reduce included, the same way).
How each backend honours the timeout:

* **gloo** (CPU): every collective and the store's rendezvous wait at most the timeout, then
  raise in the waiting rank; the error ends that rank, and torchrun ends the others.
* **NCCL** (GPU): collectives run asynchronously; NCCL's watchdog compares each one with the
  same timeout. With ``TORCH_NCCL_ASYNC_ERROR_HANDLING`` (torch's default, 3: tear down) a
  timed-out collective aborts the communicator and ends the process with the watchdog's own
  log lines (the message is torch's, not vlret's); with ``TORCH_NCCL_BLOCKING_WAIT=1`` the
  collective raises in the calling thread instead, and vlret's one line names the ranks. Set
  neither to 0: NCCL then waits forever.
* the timeout covers one collective, not a step: a step whose compute on one rank legitimately
  takes longer than ``train.dist_timeout`` (a first CUDA compilation, a slow validation on rank
  0 while the others wait at the barrier) needs a larger value.

**Shutdown.** :meth:`Trainer.close` drops the DistributedDataParallel wrapper and
:func:`shutdown_distributed` destroys the default group when :func:`init_distributed` created
it (a group the caller initialised is left to the caller); :func:`vlret.train.train` does
both. A DDP wrapper still alive when the interpreter exits can abort the process
(``terminate called without an active exception``, SIGABRT; seen with torch 2.13 and gloo
in about one exit in 20), so a process that builds a :class:`Trainer` itself under
``WORLD_SIZE > 1`` should call ``close()`` too (or use it as a context manager).
"""

from __future__ import annotations

import contextlib
import datetime
import os
from collections.abc import Iterator, Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, Sampler

from ...run.devices import DIST_TIMEOUT, TIMEOUT_KEY, DistEnv, check_timeout, env_from_torchrun

#: Whether :func:`init_distributed` created the default group (then :func:`shutdown_distributed`
#: destroys it).
_CREATED_GROUP = False
#: The timeout of the group :func:`init_distributed` created or found (seconds).
_TIMEOUT = DIST_TIMEOUT


class DistributedTimeout(RuntimeError, ValueError):
    """A collective waited longer than ``train.dist_timeout`` for another rank: one line naming
    this rank, the rank(s) it waited for, the timeout and the key (:func:`timeout_message`).

    A ``RuntimeError`` (what the backends raise) and a ``ValueError``, so that the commands,
    which print a ``ValueError`` as one line (``vlret train: rank 0: all_gather waited ...``,
    status 2), end the rank with that line rather than a traceback."""


def init_distributed(*, backend: str | None = None, timeout: float | None = None) -> DistEnv:
    """Initialise the default process group from torchrun's environment when ``WORLD_SIZE > 1``.

    Backend: NCCL when CUDA is available, else gloo. Already initialised groups are reused
    (with their own timeout). ``timeout``: seconds a collective waits for the other ranks
    (``train.dist_timeout``; default :data:`DIST_TIMEOUT`), see "A stalled rank" above.

    Raises:
        ValueError: ``timeout`` is not a number of seconds > 0.
    """
    global _CREATED_GROUP, _TIMEOUT
    seconds = DIST_TIMEOUT if timeout is None else check_timeout(timeout)
    if dist.is_available() and dist.is_initialized():
        return DistEnv(dist.get_rank(), dist.get_world_size(), int(os.environ.get("LOCAL_RANK", 0)))
    env = env_from_torchrun()
    if not env.enabled:
        return env
    if backend is None:
        backend = "nccl" if torch.cuda.is_available() else "gloo"
    if backend == "nccl":
        torch.cuda.set_device(env.local_rank)
    dist.init_process_group(
        backend=backend,
        rank=env.rank,
        world_size=env.world_size,
        timeout=datetime.timedelta(seconds=seconds),
    )
    _CREATED_GROUP = True
    _TIMEOUT = seconds
    return env


def timeout_message(operation: str, timeout: float | None = None) -> str:
    """The one line of a collective that timed out on this rank: who waited, for whom, how
    long, and the key that sets it."""
    me, world = rank(), world_size()
    others = [r for r in range(world) if r != me]
    if len(others) == 1:
        who = f"rank {others[0]}"
    else:  # the backends do not say which peer stopped answering
        who = f"one of ranks {others}" if others else "the other ranks"
    seconds = _TIMEOUT if timeout is None else timeout
    return (
        f"rank {me}: {operation} waited {seconds:g} s for {who}, which stopped or is stuck "
        f"(a paused process, a data read that never returns); the job ends after "
        f"{TIMEOUT_KEY} = {seconds:g} s (raise it if a step legitimately takes longer)"
    )


def _timed_out(err: BaseException) -> bool:
    text = str(err).lower()
    return isinstance(err, RuntimeError) and ("timed out" in text or "timeout" in text)


def explain_timeout(err: BaseException, operation: str = "a collective") -> BaseException:
    """``err`` as :class:`DistributedTimeout` when it is a backend's timeout of a collective
    (gloo's "Timed out waiting ...", NCCL's blocking-wait timeout), else ``err`` itself: for
    errors of collectives outside this module (DistributedDataParallel's gradient
    all-reduce in ``backward``)."""
    if isinstance(err, DistributedTimeout) or not _timed_out(err):
        return err
    return DistributedTimeout(timeout_message(operation))


@contextlib.contextmanager
def collective(operation: str) -> Iterator[None]:
    """Run a collective; a backend timeout becomes :class:`DistributedTimeout`."""
    try:
        yield
    except RuntimeError as err:
        explained = explain_timeout(err, operation)
        if explained is err:
            raise
        raise explained from None


def shutdown_distributed() -> None:
    """Destroy the default process group if :func:`init_distributed` created it.

    A group initialised by the caller before is left alone. Safe to call more than once.
    """
    global _CREATED_GROUP
    if _CREATED_GROUP and dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
    _CREATED_GROUP = False


def world_size() -> int:
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def rank() -> int:
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def is_main_process() -> bool:
    return rank() == 0


def barrier() -> None:
    if world_size() > 1:
        with collective("barrier"):
            dist.barrier()


def gather_with_grad(local: torch.Tensor) -> torch.Tensor:
    """All-gather ``local`` ``(B, ...)`` from every rank into ``(N*B, ...)`` in rank order.

    The slot of this rank holds ``local`` itself, so gradient flows to the local shard; the
    other ranks' rows are constants here (their own rank differentiates them). Every rank must
    pass the same ``B``. Single process: returns ``local``.
    """
    world = world_size()
    if world == 1:
        return local
    parts = [torch.empty_like(local) for _ in range(world)]
    with collective("all_gather"):
        dist.all_gather(parts, local.detach().contiguous())
    parts[rank()] = local
    return torch.cat(parts, dim=0)


class _GatherSumGrad(torch.autograd.Function):
    @staticmethod
    def forward(ctx, local: torch.Tensor) -> torch.Tensor:
        world = world_size()
        parts = [torch.empty_like(local) for _ in range(world)]
        with collective("all_gather"):
            dist.all_gather(parts, local.contiguous())
        ctx.rank, ctx.rows = rank(), local.shape[0]
        return torch.cat(parts, dim=0)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:
        grad = grad.contiguous()
        with collective("all_reduce of the gathered gradient"):
            dist.all_reduce(grad)  # gloo has no reduce_scatter; the sum over ranks, then our slice
        return grad[ctx.rank * ctx.rows : (ctx.rank + 1) * ctx.rows]


def gather_sum_grad(local: torch.Tensor) -> torch.Tensor:
    """All-gather ``local`` ``(B, ...)`` into ``(N*B, ...)``; the backward *sums* the gradient
    that every rank's loss sends to each slot and hands each rank its own slice.

    For losses split into local shards (each rank computes only its own pairs' terms,
    ``shard=`` of :meth:`vlret.losses.PairLoss.forward`): rank ``r``'s embeddings also appear
    as candidates in the other ranks' terms, and those gradients come back to it here. Single
    process: returns ``local``.
    """
    if world_size() == 1:
        return local
    return _GatherSumGrad.apply(local)


def gather_tokens(words: torch.Tensor, lengths: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Every rank's ``words (B, L_r, D)`` zero-padded to the longest ``L`` of any rank and
    gathered into ``(N*B, L, D)`` with :func:`gather_sum_grad` (the gradient that all ranks'
    scores send to a caption's words is summed and returned to its rank), and the lengths
    ``(N*B,)``. Single process: the inputs as they are."""
    if world_size() == 1:
        return words, lengths
    width = torch.tensor([words.shape[1]], dtype=torch.long, device=words.device)
    with collective("all_reduce"):
        dist.all_reduce(width, op=dist.ReduceOp.MAX)
    words = torch.nn.functional.pad(words, (0, 0, 0, int(width) - words.shape[1]))
    return gather_sum_grad(words), gather_no_grad(lengths.to(words.device))


def all_reduce_sum(value: torch.Tensor) -> torch.Tensor:
    """The sum of ``value`` over ranks (a copy; no gradient)."""
    value = value.detach().clone()
    if world_size() > 1:
        with collective("all_reduce"):
            dist.all_reduce(value)
    return value


def gather_no_grad(local: torch.Tensor) -> torch.Tensor:
    """All-gather without gradient (ids, indices)."""
    world = world_size()
    if world == 1:
        return local
    parts = [torch.empty_like(local) for _ in range(world)]
    with collective("all_gather"):
        dist.all_gather(parts, local.contiguous())
    return torch.cat(parts, dim=0)


def average_replicas(module: torch.nn.Module) -> None:
    """By hand, what DistributedDataParallel does for a step that called ``module`` through its
    wrapper: average each parameter's gradient over the ranks, and give every rank rank 0's
    buffers (BatchNorm statistics; DDP broadcasts them before each forward). No-op in one
    process.

    For a training step that calls the model's own methods (``encode_images``, ``score``)
    instead of the DDP forward, as the pair bank and AOQ's pair-scoring path do
    (:mod:`vlret.train.procedures.replicas`, "Procedures"): without the DDP forward the wrapper
    expects no backward and reduces nothing, so the gradients are each rank's own until this
    runs, after ``backward`` and before the optimiser step. A parameter keeps ``grad = None``
    only where it has none on every rank (a frozen module); else a missing gradient counts as
    zeros. One all-reduce per dtype of the gradients, one broadcast per buffer.
    """
    world = world_size()
    if world == 1:
        return
    params = [p for p in module.parameters() if p.requires_grad]
    if params:
        flags = [int(p.grad is not None) for p in params]
        has = torch.tensor(flags, dtype=torch.int32, device=params[0].device)
        with collective("all_reduce"):
            dist.all_reduce(has)
        used = [p for p, n in zip(params, has.tolist(), strict=True) if n]
        for p in used:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        by_dtype: dict[torch.dtype, list[torch.Tensor]] = {}
        for p in used:
            assert p.grad is not None  # set above
            by_dtype.setdefault(p.grad.dtype, []).append(p.grad)
        for grads in by_dtype.values():
            flat = torch.cat([g.reshape(-1) for g in grads])
            with collective("all_reduce of the gradients"):
                dist.all_reduce(flat)
            flat.div_(world)
            for g, part in zip(grads, flat.split([g.numel() for g in grads]), strict=True):
                g.copy_(part.view_as(g))
    for buffer in module.buffers():
        with collective("broadcast"):
            dist.broadcast(buffer, src=0)


def any_rank(flag: bool, *, device: torch.device) -> bool:
    """Whether ``flag`` is set on any rank (a collective under torchrun; ``device``: where the
    backend reduces)."""
    if world_size() == 1:
        return flag
    t = torch.tensor([1.0 if flag else 0.0], device=device)
    with collective("all_reduce"):
        dist.all_reduce(t)
    return bool(t.item() > 0)


def broadcast_from_main(tensors: Sequence[torch.Tensor]) -> None:
    """Overwrite ``tensors`` in place with rank 0's values (one packed broadcast; no-op in a
    single process). Every rank must call it at the same point; the tensors must be scalars
    or share one shape, on a device the backend supports."""
    if world_size() == 1 or not tensors:
        return
    packed = torch.stack(list(tensors))
    with collective("broadcast"):
        dist.broadcast(packed, src=0)
    for tensor, value in zip(tensors, packed, strict=True):
        tensor.copy_(value)


class ShardedBatchSampler(Sampler[list[int]]):
    """Seeded global batches of ``batch_size`` indices, sharded contiguously over ranks.

    The permutation of epoch ``e`` depends only on ``seed + e`` (not on the global RNG), so a
    resumed run draws the same batches; ``start_batch`` skips the batches already done.
    ``batch_size`` must divide by ``world_size``. With ``drop_last=False`` the final partial
    batch is kept in a single process and dropped under distribution (ranks need equal shards).
    """

    def __init__(
        self,
        n: int,
        batch_size: int,
        *,
        seed: int = 0,
        rank: int = 0,
        world_size: int = 1,
        drop_last: bool = True,
        shuffle: bool = True,
        max_batches: int | None = None,
    ) -> None:
        if batch_size % world_size:
            raise ValueError(
                f"train.batch_size ({batch_size}) must be a multiple of the number of ranks "
                f"({world_size}); it is the global batch"
            )
        if n < batch_size and (drop_last or world_size > 1):
            raise ValueError(
                f"the training split has {n} captions, fewer than one batch of {batch_size}"
            )
        self.n, self.batch_size, self.seed = n, batch_size, seed
        self.rank, self.world_size = rank, world_size
        self.drop_last = drop_last or world_size > 1
        self.shuffle = shuffle
        self.max_batches = max_batches
        self.epoch = 0
        self.start_batch = 0

    def set_epoch(self, epoch: int, *, start_batch: int = 0) -> None:
        self.epoch, self.start_batch = epoch, start_batch

    def loader(self, dataset: Any, *, num_workers: int, seed: int) -> DataLoader:
        """The DataLoader of ``dataset``'s batches in this sampler's order, with its own
        generator seeded with ``seed``: creating an iterator must not draw from the global
        torch RNG, or a resumed epoch would shift the model's random stream."""
        return DataLoader(
            dataset,
            batch_sampler=self,
            collate_fn=dataset.collate,
            num_workers=num_workers,
            generator=torch.Generator().manual_seed(seed),
        )

    def num_batches(self) -> int:
        full, rest = divmod(self.n, self.batch_size)
        count = full + (1 if rest and not self.drop_last else 0)
        return count if self.max_batches is None else min(count, self.max_batches)

    def __len__(self) -> int:
        return max(0, self.num_batches() - self.start_batch)

    def __iter__(self) -> Iterator[list[int]]:
        if self.shuffle:
            gen = torch.Generator().manual_seed(self.seed + self.epoch)
            order = torch.randperm(self.n, generator=gen).tolist()
        else:
            order = list(range(self.n))
        local = self.batch_size // self.world_size
        for b in range(self.start_batch, self.num_batches()):
            batch = order[b * self.batch_size : (b + 1) * self.batch_size]
            if self.world_size > 1:
                batch = batch[self.rank * local : (self.rank + 1) * local]
            yield batch
