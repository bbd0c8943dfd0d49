"""DIME's interaction module (Qu et al., SIGIR 2021): three routing layers of four cells,
scored block by block over (image block x caption block) pairs.

The names of every parameter are the release's (LgQu/DIME ``models/InteractionModule.py``,
``DynamicInteraction.py``, ``Cells.py``, ``Router.py``, ``SelfAttention.py``,
``Refinement.py``), below ``interaction.``: ``dynamic_itr_l{0,1,2}.{ric,glgc,imrc,cmrc}.router.
mlp.{0,2}``, ``....imrc.sa.att_layer.linears.{0,1,2}``, ``....imrc.sa.feed_forward_layer.
{fc1,fc2}``, ``....glgc.fc_1``, ``....cmrc.refine.{fc_scale,fc_shift,fc_1,fc_2}`` and ``bn``.
The release also holds ``glgc.fc_2`` (never used by its forward; not built here) and
``path_mapping`` (the path regulariser's; built when ``path_hidden`` is set).

The computation, per (image, caption) pair, of the "local" set (``direction = "i2t"``: the
image's regions, guided by the sentence vector; ``"t2i"``: the caption's ``max_words`` token
positions, padding included, guided by the global image vector):

* Router: ``p = ReLU(tanh(W2 ReLU(W1 mean_local(x) + b1) + b2))`` (W2's bias starts at 1.5).
* RIC ``ReLU(x)``; IMRC one post-residual transformer block with 16 heads, no LayerNorm, no
  mask and no output projection (``y = x + MHA(x)``, ``y + FFN(y)``); GLGC ``(1 + n) * x``
  with ``n = fc_1(x) * g`` L2-normalised ACROSS the local axis (``F.normalize(dim=-2)``, eps
  1e-12), ``g`` the guide vector; CMRC: SCAN-style attention (LeakyReLU 0.1, ``F.normalize``
  over the query axis, softmax over the context with ``lambda_softmax``; i2t: the caption's
  real tokens are the context, t2i: the 36 regions), then ``x + fc_2(ReLU(fc_1(x *
  tanh(fc_scale(c)) + fc_shift(c))))``.
* Layer 0 (cells read the raw local set; probabilities per image (i2t) or per caption (t2i))
  and layer 1 (cell ``j`` reads the previous layer's path ``j``; probabilities per pair): for
  each output path ``i``, ``Z_i = sum_j p_j[i] / (sum_j p_j[i] + 1e-8) * E_j + [sum_j p_j[i] <
  1e-4] * E_0``. Layer 2 (one output): ``Z = sum_j (p_j * E_j + [p_j < 1e-4 / 4] * Z_j) /
  (sum_j [p_j < 1e-4 / 4] + sum_j p_j)`` (the cell's INPUT as the skip, no eps).
* Score: ``BatchNorm1d`` over every (image, caption, local) row, ``normalize(mean_local +
  max_local)``, dot with the guide (i2t: the sentence vector, t2i: the global image vector).

Two exact rewrites make the block scorer cheaper than the release's per-caption loops (the
same numbers up to rounding): CMRC's ``fc_scale`` and ``fc_shift`` of the attended context
are the attention-weighted sums of the projected context items (the weights sum to 1), so the
projections run once per caption (i2t) or image (t2i) instead of once per pair and local; and
layer 0's per-side cells (RIC, IMRC, GLGC's ``fc_1``, the routers) run once per image (i2t)
or caption (t2i).

**BatchNorm.** In evaluation mode the final BatchNorm uses its running statistics, so a pair's
score does not depend on the other pairs and the block scorer is exact for any block sizes.
In training mode, as the release, it normalises with the statistics of all (image, caption,
local) rows of the call (and updates the running ones): a training score depends on the whole
batch it is computed with. The BatchNorm is :func:`vlret.models.sgraf_ops.batch_norm` (no
running statistic is saved for the backward, so the ``pair_bank`` procedure's in-place restore
of the buffers after scoring the bank leaves the batch's backward intact).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from ..attention import DEFAULT_MAX_ELEMENTS, positive_int
from ..sgraf_ops import batch_norm

#: DIME's two model directions: the local set is the regions (i2t) or the words (t2i).
DIME_DIRECTIONS = ("i2t", "t2i")
#: Layer 0 / 1 router threshold and the path normalisation's eps (``DynamicInteraction.py``).
ROUTE_THRESHOLD, ROUTE_EPS = 1e-4, 1e-8
#: ``F.normalize``'s eps (GLGC, CMRC's attention, the pooled pair vector).
NORMALIZE_EPS = 1e-12
#: The cells of every layer, in the release's path order.
CELLS = ("ric", "glgc", "imrc", "cmrc")
#: Path probabilities per pair: 4 x 4 from layer 0, 4 x 4 from layer 1, 4 from layer 2.
TOTAL_PATHS = 36


def _normalize(x: torch.Tensor, dim: int) -> torch.Tensor:
    return x / x.norm(dim=dim, keepdim=True).clamp_min(NORMALIZE_EPS)


class Router(nn.Module):
    """A cell's router: ``mlp`` = Linear(D, hidden), ReLU, Linear(hidden, paths)."""

    def __init__(self, dim: int, hidden: int, paths: int) -> None:
        super().__init__()
        self.mlp = nn.Sequential(nn.Linear(dim, hidden), nn.ReLU(), nn.Linear(hidden, paths))
        last = self.mlp[2]
        assert isinstance(last, nn.Linear)
        with torch.no_grad():
            last.bias.fill_(1.5)  # Router.init_weights

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``(..., N, D)`` -> the ``(..., paths)`` path probabilities in ``[0, 1)``."""
        return torch.relu(torch.tanh(self.mlp(x.mean(dim=-2))))


class _AttentionLayer(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.linears = nn.ModuleList(nn.Linear(dim, dim) for _ in range(3))


class _FeedForward(nn.Module):
    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.fc2 = nn.Linear(hidden, dim)


class SelfAttention(nn.Module):
    """IMRC's block: ``att_layer.linears`` (Q, K, V) and ``feed_forward_layer`` (fc1, fc2)."""

    def __init__(self, dim: int, hidden: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.att_layer = _AttentionLayer(dim)
        self.feed_forward_layer = _FeedForward(dim, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``(..., N, D)`` -> ``(..., N, D)``: ``y = x + MHA(x)``, ``y + FFN(y)``."""
        shape = x.shape
        flat = x.reshape(-1, shape[-2], shape[-1])
        m, n, d = flat.shape
        q, k, v = (
            lin(flat).view(m, n, self.heads, d // self.heads).transpose(1, 2)
            for lin in self.att_layer.linears
        )
        attended = F.scaled_dot_product_attention(q, k, v)  # softmax(q k^T / sqrt(d_k)) v
        y = flat + attended.transpose(1, 2).reshape(m, n, d)
        ff = self.feed_forward_layer
        return (y + ff.fc2(torch.relu(ff.fc1(y)))).view(shape)


class Refinement(nn.Module):
    """CMRC's modulation: ``fc_scale``, ``fc_shift``, ``fc_1``, ``fc_2`` (all D -> D)."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.fc_scale = nn.Linear(dim, dim)
        self.fc_shift = nn.Linear(dim, dim)
        self.fc_1 = nn.Linear(dim, dim)
        self.fc_2 = nn.Linear(dim, dim)


class Cell(nn.Module):
    """One cell of a routing layer: its ``router`` (RIC has nothing else)."""

    def __init__(self, dim: int, *, paths: int, router_hidden: int) -> None:
        super().__init__()
        self.router = Router(dim, router_hidden, paths)


class GLGCCell(Cell):
    """GLGC: its router and ``fc_1``."""

    def __init__(self, dim: int, *, paths: int, router_hidden: int) -> None:
        super().__init__(dim, paths=paths, router_hidden=router_hidden)
        self.fc_1 = nn.Linear(dim, dim)


class IMRCCell(Cell):
    """IMRC: its router and the self-attention block ``sa``."""

    def __init__(self, dim: int, *, paths: int, router_hidden: int, hidden: int, heads: int):
        super().__init__(dim, paths=paths, router_hidden=router_hidden)
        self.sa = SelfAttention(dim, hidden, heads)


class CMRCCell(Cell):
    """CMRC: its router and the modulation ``refine``."""

    def __init__(self, dim: int, *, paths: int, router_hidden: int) -> None:
        super().__init__(dim, paths=paths, router_hidden=router_hidden)
        self.refine = Refinement(dim)


class RoutingLayer(nn.Module):
    """The four cells ``ric``, ``glgc``, ``imrc``, ``cmrc`` of one layer with ``paths`` outputs."""

    def __init__(
        self, dim: int, *, paths: int, router_hidden: int, imrc_hidden: int, imrc_heads: int
    ) -> None:
        super().__init__()
        self.paths = paths
        sizes = dict(paths=paths, router_hidden=router_hidden)
        self.ric = Cell(dim, **sizes)
        self.glgc = GLGCCell(dim, **sizes)
        self.imrc = IMRCCell(dim, **sizes, hidden=imrc_hidden, heads=imrc_heads)
        self.cmrc = CMRCCell(dim, **sizes)

    def cells(self) -> tuple[Cell, Cell, Cell, Cell]:
        """The cells in the release's path order (:data:`CELLS`)."""
        return (self.ric, self.glgc, self.imrc, self.cmrc)


def _mix(
    probs: list[torch.Tensor], embs: list[torch.Tensor]
) -> tuple[list[torch.Tensor], torch.Tensor]:
    """Layers 0 and 1: output path ``i`` is ``sum_j p_j[i] / (sum_j p_j[i] + eps) E_j``, plus
    ``E_0`` where ``sum_j p_j[i] < 1e-4``; ``probs[j]`` is ``(..., paths)``, broadcastable
    against the pair axes of ``embs[j]`` ``(I, C, N, D)``. Also returns the normalised
    probabilities ``(..., paths, cells)`` (the release's ``all_path_prob``)."""
    total = sum(probs[1:], probs[0])
    gate = (total < ROUTE_THRESHOLD).to(total.dtype)
    scale = 1.0 / (total + ROUTE_EPS)
    normalised = torch.stack(probs, dim=-1) * scale[..., None]  # (..., paths, cells)
    coef = normalised.clone()
    coef[..., 0] += gate  # E_0 is also each path's fallback
    # accumulate in place from a term of the pair shape (a per-side E_j broadcasts into it)
    shape = torch.broadcast_shapes(*(e.shape for e in embs))
    order = sorted(range(len(embs)), key=lambda j: embs[j].shape != shape)
    out = []
    for i in range(total.shape[-1]):
        c = coef[..., i, :, None, None]  # (..., cells, 1, 1)
        z = embs[order[0]] * c[..., order[0], :, :]
        for j in order[1:]:
            z.addcmul_(embs[j], c[..., j, :, :])
        out.append(z)
    return out, normalised


def _merge(
    probs: list[torch.Tensor], embs: list[torch.Tensor], inputs: list[torch.Tensor]
) -> torch.Tensor:
    """Layer 2 (one output): ``sum_j (p_j E_j + [p_j < 1e-4/4] Z_j) / (sum gates + sum p)``."""
    threshold = ROUTE_THRESHOLD / len(probs)
    num: torch.Tensor | None = None
    den: torch.Tensor | None = None
    for p, e, z in zip(probs, embs, inputs, strict=True):
        gate = (p < threshold).to(p.dtype)
        term = p[..., None] * e + gate[..., None] * z
        num = term if num is None else num + term
        den = gate + p if den is None else den + gate + p
    assert num is not None and den is not None
    return num / den[..., None]


class DIMEInteraction(nn.Module):
    """The routed interaction of DIME and its block scorer (see the module docstring).

    Args:
        dim: ``D`` (256 in the release).
        direction: ``"i2t"`` or ``"t2i"``.
        lambda_softmax: CMRC's softmax inverse temperature (release README: 4 for i2t, 9 for
            t2i).
        router_hidden: The routers' hidden size (512).
        imrc_hidden: IMRC's feed-forward hidden size (512).
        imrc_heads: IMRC's heads (16); must divide ``dim``.
        path_hidden: ``path_mapping``'s output size (128 in the release), used only by the
            path regulariser (``train.procedure = "dime"``); None builds no ``path_mapping``.
    """

    def __init__(
        self,
        dim: int,
        *,
        direction: str = "i2t",
        lambda_softmax: float = 4.0,
        router_hidden: int = 512,
        imrc_hidden: int = 512,
        imrc_heads: int = 16,
        path_hidden: int | None = None,
    ) -> None:
        super().__init__()
        self.dim, self.direction, self.lambda_softmax = dim, direction, lambda_softmax
        self.imrc_heads, self.imrc_hidden = imrc_heads, imrc_hidden
        sizes = dict(router_hidden=router_hidden, imrc_hidden=imrc_hidden, imrc_heads=imrc_heads)
        self.dynamic_itr_l0 = RoutingLayer(dim, paths=len(CELLS), **sizes)
        self.dynamic_itr_l1 = RoutingLayer(dim, paths=len(CELLS), **sizes)
        self.dynamic_itr_l2 = RoutingLayer(dim, paths=1, **sizes)
        self.bn = nn.BatchNorm1d(dim)
        self.path_mapping = nn.Linear(TOTAL_PATHS, path_hidden) if path_hidden else None

    def path_similarity(self, paths: torch.Tensor) -> torch.Tensor:
        """The path regulariser's ``P P^T``: the ``(n_img, n_cap, 36)`` path probabilities
        averaged over the captions (i2t; per image) or the images (t2i; per caption), mapped
        by ``path_mapping`` and L2-normalised (``InteractionModule.forward``).

        Raises:
            ValueError: The module has no ``path_mapping`` (``path_hidden`` unset).
        """
        if self.path_mapping is None:
            raise ValueError("path_hidden: the path regulariser needs path_mapping (set it)")
        mean = paths.mean(dim=1 if self.direction == "i2t" else 0)
        mapped = _normalize(self.path_mapping(mean), dim=-1)
        return mapped @ mapped.t()

    @property
    def layers(self) -> tuple[RoutingLayer, RoutingLayer, RoutingLayer]:
        return (self.dynamic_itr_l0, self.dynamic_itr_l1, self.dynamic_itr_l2)

    # ------------------------------------------------------------------------------ cells

    def _glgc(self, layer: RoutingLayer, x: torch.Tensor, guide: torch.Tensor) -> torch.Tensor:
        n = _normalize(layer.glgc.fc_1(x) * guide, dim=-2)
        return (1 + n) * x

    def _cmrc(
        self,
        layer: RoutingLayer,
        x: torch.Tensor,
        context: torch.Tensor,
        scale: torch.Tensor,
        shift: torch.Tensor,
        mask: torch.Tensor | None,
    ) -> torch.Tensor:
        """``x`` ``(I|1, C|1, N, D)``; ``context`` / ``scale`` / ``shift``: the context items
        and their ``fc_scale`` / ``fc_shift`` projections, ``(C, W, D)`` per caption (i2t) or
        ``(I, R, D)`` per image (t2i); ``mask`` ``(C, W)``: the caption's real tokens (i2t)."""
        if self.direction == "i2t":
            if x.shape[1] == 1:
                raw = torch.einsum("ird,cwd->icrw", x[:, 0], context)
            else:
                raw = torch.einsum("icrd,cwd->icrw", x, context)
        elif x.shape[0] == 1:
            raw = torch.einsum("cwd,ird->icwr", x[0], context)
        else:
            raw = torch.einsum("icwd,ird->icwr", x, context)
        attn = _normalize(F.leaky_relu(raw, 0.1), dim=2) * self.lambda_softmax
        if mask is not None:
            attn = attn.masked_fill(~mask[None, :, None, :], float("-inf"))
        weights = torch.softmax(attn, dim=-1)
        pattern = "icrw,cwd->icrd" if self.direction == "i2t" else "icwr,ird->icwd"
        s, t = torch.einsum(pattern, weights, scale), torch.einsum(pattern, weights, shift)
        refine = layer.cmrc.refine
        return x + refine.fc_2(torch.relu(refine.fc_1(x * torch.tanh(s) + t)))

    # --------------------------------------------------------------------------- scoring

    def block_features(
        self,
        local: torch.Tensor,
        guide: torch.Tensor,
        context: torch.Tensor,
        mask: torch.Tensor | None,
        side: dict[str, list[torch.Tensor]],
        projections: list[tuple[torch.Tensor, torch.Tensor]],
        paths: list[torch.Tensor] | None = None,
    ) -> torch.Tensor:
        """The refined local sets ``Z`` ``(I, C, N, D)`` of one block, before the BatchNorm.

        Args:
            local: Layer 0's local set, ``(I, 1, N, D)`` (i2t) or ``(1, C, N, D)`` (t2i).
            guide: GLGC's guide, ``(1, C, 1, D)`` (i2t) or ``(I, 1, 1, D)`` (t2i).
            context: CMRC's context items (see :meth:`_cmrc`).
            mask: The real tokens of the block's captions ``(C, W)`` (i2t) or None.
            side: :meth:`side_cells` of the block's local side.
            projections: Per layer, the context items' ``(fc_scale, fc_shift)`` projections.
            paths: Where given, the block's ``(I, C, 36)`` path probabilities are appended
                (layers 0 and 1 normalised, as the release concatenates them).
        """
        l0, l1, l2 = self.layers
        e1 = self._glgc(l0, local, guide)
        e3 = self._cmrc(l0, local, context, *projections[0], mask)
        z, p0 = _mix(side["probs"], [side["ric"][0], e1, side["imrc"][0], e3])
        probs = [cell.router(z[j]) for j, cell in enumerate(l1.cells())]
        embs = [
            torch.relu(z[0]),
            self._glgc(l1, z[1], guide),
            l1.imrc.sa(z[2]),
            self._cmrc(l1, z[3], context, *projections[1], mask),
        ]
        z, p1 = _mix(probs, embs)
        probs = [cell.router(z[j]) for j, cell in enumerate(l2.cells())]
        embs = [
            torch.relu(z[0]),
            self._glgc(l2, z[1], guide),
            l2.imrc.sa(z[2]),
            self._cmrc(l2, z[3], context, *projections[2], mask),
        ]
        if paths is not None:  # the release's order: layer 0 (out x cell), layer 1, layer 2
            lead = p1.shape[:2]
            paths.append(
                torch.cat(
                    [p0.expand(*lead, -1, -1).flatten(2), p1.flatten(2), torch.cat(probs, -1)],
                    dim=-1,
                )
            )
        return _merge(probs, embs, z)

    def side_cells(self, local: torch.Tensor) -> dict[str, list[torch.Tensor]]:
        """Layer 0's per-side part of ``local`` (4-D with one singleton pair axis): RIC, IMRC
        and the four routers' probabilities (``(I, 1, 4)`` or ``(1, C, 4)``)."""
        l0 = self.dynamic_itr_l0
        return {
            "ric": [torch.relu(local)],
            "imrc": [l0.imrc.sa(local)],
            "probs": [cell.router(local) for cell in l0.cells()],
        }

    def pool(self, z: torch.Tensor, guide: torch.Tensor) -> torch.Tensor:
        """``(I, C, N, D)`` refined sets -> ``(I, C)`` scores: BatchNorm (the module's mode),
        ``normalize(mean + max)`` over the locals, dot with ``guide`` (``(1, C, D)`` or
        ``(I, 1, D)``)."""
        i, c, n, d = z.shape
        z = batch_norm(z.reshape(-1, d), self.bn).view(i, c, n, d)
        pooled = _normalize(z.mean(dim=2) + z.amax(dim=2), dim=-1)
        return (pooled * guide).sum(-1)

    def plan_blocks(
        self, n_img: int, n_cap: int, regions: int, words: int, max_elements: int | None
    ) -> tuple[int, int]:
        """``(images, captions)`` a block: as many pairs as keep the largest intermediate
        (a pair's ``N`` locals times the widest of ``D``, IMRC's hidden size, its ``heads x N``
        attention logits and the CMRC context) within ``max_elements``, near square."""
        budget = positive_int(
            DEFAULT_MAX_ELEMENTS if max_elements is None else max_elements, "max_elements"
        )
        local_rows, ctx_rows = (regions, words) if self.direction == "i2t" else (words, regions)
        widest = max(self.dim, self.imrc_hidden, self.imrc_heads * local_rows, ctx_rows)
        pairs = max(1, budget // (local_rows * widest))
        bi = min(n_img, max(1, math.isqrt(pairs)))
        bc = min(n_cap, max(1, pairs // bi))
        return min(n_img, max(1, pairs // bc)), bc

    def scores(
        self,
        img: torch.Tensor,
        rgn: torch.Tensor,
        stc: torch.Tensor,
        wrd: torch.Tensor,
        n_words: torch.Tensor,
        *,
        max_elements: int | None = None,
        paths_out: list[torch.Tensor] | None = None,
    ) -> torch.Tensor:
        """The ``(n_img, n_cap)`` scores of every image with every caption.

        Args:
            img: ``(n_img, D)`` global image vectors.
            rgn: ``(n_img, R, D)`` region vectors.
            stc: ``(n_cap, D)`` sentence vectors.
            wrd: ``(n_cap, W, D)`` token vectors (t2i: all ``max_words`` positions).
            n_words: ``(n_cap,)`` real tokens per caption (the CMRC context of i2t).
            max_elements: Bound on the numbers of a block's largest intermediate (default
                :data:`~vlret.models.attention.DEFAULT_MAX_ELEMENTS`); at least one pair a
                block.
            paths_out: Where given, the ``(n_img, n_cap, 36)`` path probabilities of every pair
                are appended (the path regulariser's input, :meth:`path_similarity`).

        Returns:
            The scores; in training mode the BatchNorm statistics span all pairs of the call.
        """
        n_img, n_cap = rgn.shape[0], wrd.shape[0]
        i2t = self.direction == "i2t"
        bi, bc = self.plan_blocks(n_img, n_cap, rgn.shape[1], wrd.shape[1], max_elements)
        context = wrd if i2t else rgn
        projections = [
            (layer.cmrc.refine.fc_scale(context), layer.cmrc.refine.fc_shift(context))
            for layer in self.layers
        ]
        if i2t:
            mask = torch.arange(wrd.shape[1], device=wrd.device)[None, :] < n_words[:, None]
            side = self.side_cells(rgn[:, None])
        else:
            side = self.side_cells(wrd[None])
        training = self.training
        rows: list[torch.Tensor] = []
        kept: list[list[torch.Tensor]] = []
        path_rows: list[list[torch.Tensor]] = []
        for i0 in range(0, n_img, bi):
            isl = slice(i0, i0 + bi)
            row: list[torch.Tensor] = []
            path_row: list[torch.Tensor] = []
            for c0 in range(0, n_cap, bc):
                csl = slice(c0, c0 + bc)
                if i2t:
                    local, guide = rgn[isl, None], stc[None, csl, None]
                    ctx, proj = wrd[csl], [(s[csl], t[csl]) for s, t in projections]
                    block_side = {k: [v[isl] for v in vs] for k, vs in side.items()}
                    block_mask = mask[csl]
                else:
                    local, guide = wrd[None, csl], img[isl, None, None]
                    ctx, proj = rgn[isl], [(s[isl], t[isl]) for s, t in projections]
                    block_side = {k: [v[:, csl] for v in vs] for k, vs in side.items()}
                    block_mask = None
                z = self.block_features(
                    local,
                    guide,
                    ctx,
                    block_mask,
                    block_side,
                    proj,
                    path_row if paths_out is not None else None,
                )
                if training:
                    row.append(z)
                else:
                    row.append(self.pool(z, guide[:, :, 0]))
            path_rows.append(path_row)
            if training:
                kept.append(row)
            else:
                rows.append(torch.cat(row, dim=1))
        if paths_out is not None:
            paths_out.append(torch.cat([torch.cat(r, dim=1) for r in path_rows], dim=0))
        if training:  # one BatchNorm over every pair's rows, as the release's batch
            z = torch.cat([torch.cat(row, dim=1) for row in kept], dim=0)
            guide = stc[None] if i2t else img[:, None]
            return self.pool(z, guide)
        return torch.cat(rows, dim=0)


__all__ = ["CELLS", "DIME_DIRECTIONS", "TOTAL_PATHS", "DIMEInteraction", "Router", "RoutingLayer"]
