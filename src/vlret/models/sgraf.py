"""SGRAF's pair scorer: similarity graph reasoning (SGR) and attention filtration (SAF).

Diao et al., "Similarity Reasoning and Filtration for Image-Text Matching", AAAI 2021,
Sec. 3.1-3.4; the computation follows the authors' released ``EncoderSimilarity``
(Paranioar/SGRAF ``model.py``) step for step, so that an imported official checkpoint gives
the released model's scores. The reference scores one caption at a time against every
image; :class:`SGRAFScorer` scores blocks of images x captions at once under a memory bound.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .attention import (
    CPU_BLOCK_ELEMENTS,
    DEFAULT_MAX_ELEMENTS,
    NORM_EPS,
    check_tokens,
    positive_int,
)
from .sgraf_ops import (
    PRECISIONS,
    GraphStep,
    Operands,
    Scratch,
    batch_norm,
    block_nodes,
    gemm,
    graph_reasoning,
    graph_steps,
    l2norm,
    linear,
    update_running,
)

MODULES = ("sgr", "saf")
#: On CPU, the rows (words) a block's word-region products aim for (see ``_forward``).
_CPU_BLOCK_ROWS = 64
#: On CPU, the bound in bytes (of the products' dtype) on the largest intermediate of a block
#: of a call without autograd: its attended vectors are formed CPU_BLOCK_ELEMENTS at a time,
#: so its blocks can be larger, with fewer per-block steps (see ``plan_blocks``).
CPU_EVAL_BLOCK_BYTES = 2**22


class _GlobalAttention(nn.Module):
    """Self-attention pooling of one side into a global vector (the reference ``VisualSA`` /
    ``TextSA``, paper Sec. 3.1 Eq. 2-3).

    Local branch ``Linear -> [BatchNorm1d(num_regions)] -> Tanh -> Dropout`` on every item,
    global branch ``Linear -> [BatchNorm1d(embed_dim)] -> Tanh -> Dropout`` on the mean of
    the items; the weight of item ``i`` is a softmax over the items of ``common(local_i *
    global)``; the output is the l2-normalised weighted sum of the (input) items. The
    BatchNorms exist on the image side only (``num_regions`` given); ``BatchNorm1d(num_regions)``
    on ``(N, R, D)`` normalises each region *position* over the images and the D features.
    """

    def __init__(self, embed_dim: int, dropout: float, num_regions: int | None) -> None:
        super().__init__()
        self.dropout = dropout
        self.local_fc = nn.Linear(embed_dim, embed_dim)
        self.global_fc = nn.Linear(embed_dim, embed_dim)
        self.common = nn.Linear(embed_dim, 1)
        self.local_bn: nn.BatchNorm1d | None = nn.BatchNorm1d(num_regions) if num_regions else None
        self.global_bn: nn.BatchNorm1d | None = nn.BatchNorm1d(embed_dim) if num_regions else None

    def _branch(self, x: torch.Tensor, fc: nn.Linear, bn: nn.BatchNorm1d | None, low: bool):
        x = gemm(x, fc.weight.to(x.dtype), fc.bias.to(x.dtype), low)
        if bn is not None:
            x = batch_norm(x, bn)
        return F.dropout(x.tanh_(), p=self.dropout, training=self.training)  # x is fresh

    def forward(
        self, items: torch.Tensor, mask: torch.Tensor | None, low: bool = False
    ) -> torch.Tensor:
        """``items (N, K, D)`` (padding zeroed), ``mask (N, K)`` or None -> ``(N, D)``;
        ``low``: the two ``D x D`` products on bfloat16 operands."""
        if mask is None:
            mean = items.mean(dim=1)
        else:
            mean = items.sum(dim=1) / mask.sum(dim=1, keepdim=True).to(items.dtype)
        local = self._branch(items, self.local_fc, self.local_bn, low)
        glob = self._branch(mean, self.global_fc, self.global_bn, low)
        # element-wise, not as batched products: each item set's numbers must not depend
        # on how many sets the call holds (ranks split a batch)
        logits = linear(local * glob.unsqueeze(1), self.common).squeeze(-1)
        if mask is not None:
            logits = logits.masked_fill(~mask, torch.finfo(logits.dtype).min)
        weights = torch.softmax(logits, dim=1)
        return l2norm((weights.unsqueeze(-1) * items).sum(dim=1))


class _GraphStep(nn.Module):
    """One SGR reasoning step (reference ``GraphReasoning``, paper Sec. 3.3 Eq. 6-7)."""

    def __init__(self, sim_dim: int) -> None:
        super().__init__()
        self.query = nn.Linear(sim_dim, sim_dim)
        self.key = nn.Linear(sim_dim, sim_dim)
        self.update = nn.Linear(sim_dim, sim_dim)


class _Filtration(nn.Module):
    """SAF's gate (reference ``AttentionFiltration``, paper Sec. 3.4 Eq. 8-9)."""

    def __init__(self, sim_dim: int) -> None:
        super().__init__()
        self.gate = nn.Linear(sim_dim, 1)
        self.bn = nn.BatchNorm1d(1)


class SGRAFScorer(nn.Module):
    """SGRAF's similarity encoder: the ``(n_img, n_cap)`` scores in (0, 1) of every pair.

    Per pair of an image's regions ``v_1..v_R`` and a caption's words ``e_1..e_L`` (both
    projected and l2-normalised), following the reference ``EncoderSimilarity``:

    1. global vectors (Sec. 3.1): image ``g = SA_img(V)`` once per image, caption ``c =
       SA_txt(E)`` once per caption (see :class:`_GlobalAttention`); global node ``s_0 =
       l2norm(W_sg (g - c)^2 + b)``;
    2. local nodes (Sec. 3.2): each word attends over the regions with the clipped-l2norm
       step of :func:`~vlret.models.cross_attention.attention_weights` (``lambda_softmax``,
       9 in the reference), the attended vector ``a_k`` is l2-normalised, and ``s_k =
       l2norm(W_sl (a_k - e_k)^2 + b)``;
    3. ``module="sgr"`` (Sec. 3.3): ``sgr_steps`` steps over the ``L + 1`` nodes, each
       ``s <- ReLU(W_r (softmax_q((W_q s_p + b) . (W_k s_q + b)) s) + b)`` (the softmax runs
       over the nodes ``q`` aggregated; the aggregated values are the nodes themselves, not
       a projection); the pair's vector is the global node after the last step. The edge
       logits are computed as ``(W_k^T W_q s_p + W_k^T b_q) . s_q + (W_q^T b_k . s_p + b_q .
       b_k)``, the same numbers up to rounding with one ``S x S`` product per node instead
       of two, and the last step updates the global node only (the others are not read).
       ``module="saf"`` (Sec. 3.4): gates ``sigmoid(BN(w^T s_p + b))`` with a
       ``BatchNorm1d(1)`` over the scalars, L1-normalised over the nodes (sum + 1e-8), the
       pair's vector ``l2norm(sum_p gate_p s_p)``;
    4. score ``sigmoid(w_e^T s + b)``.

    All l2norms divide by the norm plus 1e-8 as the reference's ``l2norm`` does. A caption's
    words at or past its length never take part: not in its mean, its global attention, the
    region attention's normalisation, nor as SGR/SAF nodes (the reference slices them off).

    **BatchNorm.** Training mode normalises with batch statistics as the reference does:

    - the image global branch's two BatchNorms see the images of the call (computed once
      per call, before any blocking);
    - SAF's BatchNorm: the reference runs its per-caption loop, so each caption's gates are
      normalised with the statistics of *that caption's* pairs with every image of the call
      (``n_img x (L_c + 1)`` scalars), and the running statistics take one update per
      caption, in caption order. This scorer does the same, over all image blocks: in
      training mode with ``module="saf"`` every block's nodes are kept until the statistics
      are known (autograd keeps them anyway), so ``max_elements`` bounds each block's
      intermediates but not the kept nodes (``n_img x n_cap x (L + 1) x sim_dim``).

    The trainer therefore scores the batch's images against the batch's captions so that
    these statistics cover them; under torchrun a rank sees only its local images, so its
    statistics (like any non-synchronised BatchNorm) differ from one process's. Evaluation
    mode uses the running statistics and every pair's score is independent of the others.
    Dropout (``dropout``, 0.4 in the reference) acts on both branches of both global
    attentions in training mode.

    **Parameters**: :meth:`reference_names` maps every reference ``sim_enc.`` name (BatchNorm
    buffers included) to this module's (``image_global``, ``text_global``, ``local_proj``,
    ``global_proj``, ``head``, ``sgr.{i}.query`` / ``.key`` / ``.update``, ``saf.gate`` /
    ``saf.bn``). The global attentions (``VisualSA``/``TextSA``) belong to the reference's
    similarity encoder (``sim_enc``), not to its image or text encoder. ``num_regions`` is the
    region count the image BatchNorm is built for (36 in the reference, hard-coded there);
    inputs must have exactly that many regions. Initialisation: :meth:`reset_parameters`.

    Args:
        embed_dim: Size ``D`` of the region and word features.
        sim_dim: Size of the similarity nodes (256 in the reference).
        module: ``"sgr"`` or ``"saf"``.
        sgr_steps: SGR reasoning steps (3 in the reference; ignored for SAF).
        lambda_softmax: Inverse temperature of the word-to-region attention.
        dropout: Dropout of the global attentions in training mode, in ``[0, 1)``.
        num_regions: The region count the image BatchNorm is built for.
        matmul_precision: ``"float32"`` (default): every product in the working dtype (the
            inputs' dtype, float32 at least). ``"bfloat16"``: in calls under
            :func:`torch.no_grad` or :func:`torch.inference_mode` (evaluation), the products
            (the word-region scores, the attended vectors, the local and global projections,
            SGR's node, edge-logit and mixing products, SAF's gate and gated sum and the global
            attentions' ``D x D`` products) run on bfloat16 operands with float32 accumulation
            and a bfloat16 result; norms, softmaxes, differences and squares stay in the
            working dtype (SGR's nodes stay bfloat16 between steps: its ReLU is exact). Every
            element-wise pass runs in one dtype, converting once before or after it: mixed
            dtypes would run element by element. With grad mode on the call
            computes in the working dtype. Each rounding is relative ``2^-8`` at most;
            ``benchmarks/bench_cross_attention.py`` prints the largest score change and how
            many caption pairs change order against float64 (on models whose scores spread
            over (0, 1), changes of about ``1e-2``). Several times faster where bfloat16
            products are (CPUs with AVX512-BF16 or AMX, GPUs with tensor cores). May be
            changed after construction (checked when set).

    Raises:
        ValueError: An unknown ``module`` or ``matmul_precision``, a size that is not a
            positive int, a ``lambda_softmax`` that is not positive and finite, or
            ``dropout`` outside ``[0, 1)``.
    """

    def __init__(
        self,
        embed_dim: int = 1024,
        sim_dim: int = 256,
        module: str = "sgr",
        sgr_steps: int = 3,
        *,
        lambda_softmax: float = 9.0,
        dropout: float = 0.4,
        num_regions: int = 36,
        matmul_precision: str = "float32",
    ) -> None:
        super().__init__()
        if module not in MODULES:
            raise ValueError(f"module must be one of {MODULES}, got {module!r}")
        positive_int(embed_dim, "embed_dim")
        positive_int(sim_dim, "sim_dim")
        positive_int(sgr_steps, "sgr_steps")
        positive_int(num_regions, "num_regions")
        lam = float(lambda_softmax)
        if not (lam > 0 and lam < float("inf")):
            raise ValueError(f"lambda_softmax must be positive and finite, got {lambda_softmax}")
        if not 0.0 <= float(dropout) < 1.0:
            raise ValueError(f"dropout must lie in [0, 1), got {dropout}")
        self.matmul_precision = matmul_precision  # checked by the property
        self.embed_dim, self.sim_dim, self.module = embed_dim, sim_dim, module
        self.sgr_steps = sgr_steps if module == "sgr" else 0
        self.lambda_softmax, self.dropout, self.num_regions = lam, float(dropout), num_regions

        self.image_global = _GlobalAttention(embed_dim, self.dropout, num_regions)
        self.text_global = _GlobalAttention(embed_dim, self.dropout, None)
        self.local_proj = nn.Linear(embed_dim, sim_dim)
        self.global_proj = nn.Linear(embed_dim, sim_dim)
        self.head = nn.Linear(sim_dim, 1)
        if module == "sgr":
            self.sgr = nn.ModuleList(_GraphStep(sim_dim) for _ in range(sgr_steps))
        else:
            self.saf = _Filtration(sim_dim)
        self.reset_parameters()

    @property
    def matmul_precision(self) -> str:
        """``"float32"`` or ``"bfloat16"`` (see the class doc); checked when set."""
        return self._matmul_precision

    @matmul_precision.setter
    def matmul_precision(self, value: str) -> None:
        if value not in PRECISIONS:
            raise ValueError(f"matmul_precision must be one of {PRECISIONS}, got {value!r}")
        self._matmul_precision = value

    def reset_parameters(self) -> None:
        """Re-initialise as the reference ``init_weights`` does.

        Every linear layer Xavier-uniform (``U(-r, r)``, ``r = sqrt(6 / (fan_in + fan_out))``)
        with zero bias, BatchNorm weight 1 and bias 0 (running statistics reset).
        """
        for m in self.modules():
            if isinstance(m, nn.Linear):
                nn.init.xavier_uniform_(m.weight)
                nn.init.zeros_(m.bias)
            elif isinstance(m, nn.BatchNorm1d):
                m.reset_parameters()

    @staticmethod
    def reference_names(module: str = "sgr", sgr_steps: int = 3) -> dict[str, str]:
        """Map the reference ``sim_enc`` state-dict names to this module's.

        Covers every parameter and buffer of both sides exactly once, BatchNorm
        ``running_mean``, ``running_var`` and ``num_batches_tracked`` included (checkpoints
        from PyTorch before 0.4.1 lack ``num_batches_tracked``).

        Args:
            module: ``"sgr"`` or ``"saf"`` (the reference's ``opt.module_name`` lower-cased).
            sgr_steps: The reference's ``opt.sgr_step``.

        Returns:
            ``{reference name: this module's name}``.

        Raises:
            ValueError: An unknown ``module`` or a ``sgr_steps`` that is not a positive int.
        """
        if module not in MODULES:
            raise ValueError(f"module must be one of {MODULES}, got {module!r}")
        positive_int(sgr_steps, "sgr_steps")
        lin = ("weight", "bias")
        bn = (*lin, "running_mean", "running_var", "num_batches_tracked")
        layers: list[tuple[str, str, tuple[str, ...]]] = [
            ("v_global_w.embedding_local.0", "image_global.local_fc", lin),
            ("v_global_w.embedding_local.1", "image_global.local_bn", bn),
            ("v_global_w.embedding_global.0", "image_global.global_fc", lin),
            ("v_global_w.embedding_global.1", "image_global.global_bn", bn),
            ("v_global_w.embedding_common.0", "image_global.common", lin),
            ("t_global_w.embedding_local.0", "text_global.local_fc", lin),
            ("t_global_w.embedding_global.0", "text_global.global_fc", lin),
            ("t_global_w.embedding_common.0", "text_global.common", lin),
            ("sim_tranloc_w", "local_proj", lin),
            ("sim_tranglo_w", "global_proj", lin),
            ("sim_eval_w", "head", lin),
        ]
        if module == "sgr":
            for i in range(sgr_steps):
                layers += [
                    (f"SGR_module.{i}.graph_query_w", f"sgr.{i}.query", lin),
                    (f"SGR_module.{i}.graph_key_w", f"sgr.{i}.key", lin),
                    (f"SGR_module.{i}.sim_graph_w", f"sgr.{i}.update", lin),
                ]
        else:
            layers += [
                ("SAF_module.attn_sim_w", "saf.gate", lin),
                ("SAF_module.bn", "saf.bn", bn),
            ]
        return {f"{ref}.{p}": f"{ours}.{p}" for ref, ours, params in layers for p in params}

    def extra_repr(self) -> str:
        return (
            f"module={self.module!r}, sgr_steps={self.sgr_steps}, "
            f"lambda_softmax={self.lambda_softmax}, dropout={self.dropout}, "
            f"num_regions={self.num_regions}"
        )

    # ------------------------------------------------------------------ forward

    def forward(
        self,
        regions: torch.Tensor,
        words: torch.Tensor,
        word_lengths: torch.Tensor,
        *,
        max_elements: int | None = None,
    ) -> torch.Tensor:
        """Score every (image, caption) pair.

        Computed in the inputs' dtype promoted to float32 at least, with autocast disabled
        inside (a trainer's mixed precision does not reach the scorer). Pairs are scored in
        blocks of images x captions whose largest intermediate (the attended vector of every
        word of every pair, ``L x D`` numbers a pair) is bounded; on CPU blocks are at most
        :data:`~vlret.models.attention.CPU_BLOCK_ELEMENTS`, so that the element-wise passes
        over the attended vectors stay in the CPU caches (without autograd, blocks of
        :data:`CPU_EVAL_BLOCK_BYTES` whose attended vectors are formed that many at a time:
        see :meth:`plan_blocks`). Captions are processed longest
        first, each block trimmed to its longest caption; the columns come back in call
        order.

        Args:
            regions: ``(n_img, R, D)`` region features, ``R == num_regions``.
            words: ``(n_cap, L, D)`` word features.
            word_lengths: ``(n_cap,)`` real words per caption, in ``1..L``.
            max_elements: Bound on a block's largest intermediate (default
                :data:`~vlret.models.attention.DEFAULT_MAX_ELEMENTS`, at least one pair a
                block).

        Returns:
            The ``(n_img, n_cap)`` scores in (0, 1).

        Raises:
            ValueError: Malformed tokens (:func:`~vlret.models.attention.check_tokens`), a
                region count other than ``num_regions``, a feature size other than
                ``embed_dim``, a bad ``max_elements``, or fewer than 2 images in training.
        """
        # Autocast would run the GEMMs in half precision and return half scores; the scorer
        # keeps float32 at least, as for half inputs.
        with torch.autocast(device_type=regions.device.type, enabled=False):
            return self._forward(regions, words, word_lengths, max_elements)

    def _forward(
        self,
        regions: torch.Tensor,
        words: torch.Tensor,
        word_lengths: torch.Tensor,
        max_elements: int | None,
    ) -> torch.Tensor:
        lengths = check_tokens(regions, words, word_lengths)
        if regions.shape[1] != self.num_regions:
            raise ValueError(
                f"regions must have num_regions={self.num_regions} regions (the image "
                f"BatchNorm's size), got {regions.shape[1]}"
            )
        if regions.shape[2] != self.embed_dim:
            raise ValueError(
                f"regions and words must have embed_dim={self.embed_dim} features, "
                f"got {regions.shape[2]}"
            )
        if max_elements is None:
            max_elements = DEFAULT_MAX_ELEMENTS
        budget = positive_int(max_elements, "max_elements")
        n_img, n_cap = regions.shape[0], words.shape[0]
        dtype = torch.promote_types(torch.promote_types(regions.dtype, words.dtype), torch.float32)
        if n_img == 0 or n_cap == 0:
            return regions.new_zeros((n_img, n_cap), dtype=dtype)
        if self.training and n_img < 2:
            raise ValueError(
                "regions: training mode needs at least 2 images (the image BatchNorm "
                f"normalises over the images of the call), got {n_img}"
            )
        regions = regions.to(dtype)
        width = words.shape[1]
        mask = torch.arange(width, device=words.device).unsqueeze(0) < lengths.unsqueeze(1)
        # Padding is zeroed so that garbage there can never leak (0 * inf) into real pairs.
        words = words.to(dtype).masked_fill(~mask.unsqueeze(-1), 0.0)

        ops = self._operands(dtype)
        img_glob = self.image_global(regions, None, ops.low)  # once per image, (n_img, D)
        cap_glob = self.text_global(words, mask, ops.low)  # once per caption, (n_cap, D)

        # Captions longest first (the reference loader's order already), so that each block
        # is trimmed to its own longest caption and shorter captions fill larger blocks.
        order = None
        if bool((lengths[1:] > lengths[:-1]).any()):
            order = torch.argsort(lengths, descending=True, stable=True)
            words, mask, cap_glob, lengths = (
                words[order],
                mask[order],
                cap_glob[order],
                lengths[order],
            )
        tops = lengths.tolist()

        deferred = self.module == "saf" and self.saf.bn.training
        regions_mm, words_mm = regions.to(ops.mm_dtype), words.to(ops.mm_dtype)
        gram = regions @ regions.transpose(1, 2) if ops.low else None  # (n_img, R, R)
        rows, kept = [], []
        eval_dtype = None if ops.scratch is None else ops.mm_dtype  # None: with autograd
        plan = self.plan_blocks(n_img, tops, regions.device, budget, eval_dtype=eval_dtype)
        for c0, c1, top, img_block in plan:
            w_b, m_b = (words[c0:c1, :top], words_mm[c0:c1, :top]), mask[c0:c1, :top]
            row = []
            for i0 in range(0, n_img, img_block):
                i1 = min(n_img, i0 + img_block)
                nodes, node_mask = block_nodes(
                    regions_mm[i0:i1],
                    img_glob[i0:i1],
                    w_b,
                    cap_glob[c0:c1],
                    m_b,
                    ops,
                    None if gram is None else gram[i0:i1],
                    self.lambda_softmax,
                    keep=deferred,
                )
                if deferred:
                    kept.append((c0, c1, nodes, node_mask))
                else:
                    row.append(self._finish(nodes, node_mask, None, ops.steps, dtype, ops.scratch))
            if row:
                rows.append(torch.cat(row, dim=0))
        inverse = None if order is None else torch.argsort(order)
        if deferred:
            scores = self._finish_saf_training(kept, n_img, lengths, inverse, dtype)
        else:
            scores = torch.cat(rows, dim=1)
        return scores if inverse is None else scores.index_select(1, inverse)

    def plan_blocks(
        self,
        n_img: int,
        lengths: list[int],
        device: torch.device,
        max_elements: int = DEFAULT_MAX_ELEMENTS,
        *,
        eval_dtype: torch.dtype | None = None,
    ) -> list[tuple[int, int, int, int]]:
        """The blocks :meth:`forward` scores: ``(c0, c1, top, img_block)`` for captions
        ``c0:c1`` of the length-sorted (longest first) ``lengths``, trimmed to ``top``
        words, against the images in runs of ``img_block``.

        A block's largest intermediate (the ``top x D`` attended vectors of each pair, or
        its ``(top + 1) x sim_dim`` nodes) stays within ``max_elements``, on CPU within
        :data:`~vlret.models.attention.CPU_BLOCK_ELEMENTS` (the element-wise passes then run
        in the caches); for a call without autograd whose products run in ``eval_dtype``
        (its attended vectors formed that many at a time), within
        :data:`CPU_EVAL_BLOCK_BYTES` of that dtype. On CPU a
        block also takes enough captions for its word-region products to have
        ``_CPU_BLOCK_ROWS`` rows (one caption alone gives them ``top`` rows: thin, slow
        GEMMs); on a GPU it takes as many images as fit first.
        """
        cpu_budget = CPU_BLOCK_ELEMENTS
        if eval_dtype is not None:
            cpu_budget = CPU_EVAL_BLOCK_BYTES // eval_dtype.itemsize
        budget = min(max_elements, cpu_budget) if device.type == "cpu" else max_elements
        r, d, out, c0 = self.num_regions, self.embed_dim, [], 0
        while c0 < len(lengths):
            top = lengths[c0]
            per_pair = max(top * max(d, r), (top + 1) * max(self.sim_dim, top + 1), d)
            pairs = max(1, budget // per_pair)
            captions = -(-_CPU_BLOCK_ROWS // top) if device.type == "cpu" else 1
            img_block = min(n_img, max(1, pairs // captions))
            c1 = min(len(lengths), c0 + max(1, pairs // img_block))
            out.append((c0, c1, top, img_block))
            c0 = c1
        return out

    def _operands(self, dtype: torch.dtype) -> Operands:
        """The products' operands of one call in the working ``dtype`` (bfloat16 copies for
        ``matmul_precision="bfloat16"`` in a call without autograd)."""
        grad = torch.is_grad_enabled()
        low = self.matmul_precision == "bfloat16" and not grad
        mm = torch.bfloat16 if low else dtype
        local = self.local_proj.weight.to(dtype), self.local_proj.bias.to(dtype)
        steps = graph_steps(self.sgr, dtype, low, offset=grad) if self.module == "sgr" else []
        return Operands(
            low=low,
            mm_dtype=mm,
            local_w=local[0].to(mm),
            local_b=local[1].to(mm),
            global_w=self.global_proj.weight.to(mm),
            global_b=self.global_proj.bias.to(dtype),
            steps=steps,
            scratch=None if grad else Scratch(),
        )

    def _finish(
        self,
        nodes: torch.Tensor,
        node_mask: torch.Tensor,
        saf_stats: tuple[torch.Tensor, torch.Tensor] | None,
        steps: list[GraphStep],
        dtype: torch.dtype,
        scratch: Scratch | None = None,
    ) -> torch.Tensor:
        """``(ib, cb)`` scores in the working ``dtype`` from a block's nodes. ``saf_stats``:
        per-caption ``(mean, var)`` of SAF's BatchNorm, shape ``(cb,)`` each, or None for its
        running statistics; ``steps``: SGR's prepared step matrices
        (:func:`~vlret.models.sgraf_ops.graph_steps`, once per call); ``scratch``: the
        call's buffers (calls without autograd)."""
        if self.module == "sgr":
            vec = graph_reasoning(nodes, node_mask, steps, dtype, scratch)
        else:
            gates = self._gates(nodes, dtype)  # (ib, cb, L + 1)
            bn = self.saf.bn
            if saf_stats is None:
                assert bn.running_mean is not None and bn.running_var is not None  # tracked
                mean, var = bn.running_mean.to(gates.dtype), bn.running_var.to(gates.dtype)
            else:
                mean, var = saf_stats[0].unsqueeze(-1), saf_stats[1].unsqueeze(-1)
            scale = bn.weight.to(gates.dtype) / torch.sqrt(var + bn.eps)
            gates = torch.sigmoid((gates - mean) * scale + bn.bias.to(gates.dtype))
            gates = gates * node_mask
            gates = gates / (gates.abs().sum(dim=-1, keepdim=True) + NORM_EPS)  # l1norm
            vec = l2norm((gates.unsqueeze(-2).to(nodes.dtype) @ nodes).squeeze(-2).to(dtype))
        return torch.sigmoid(linear(vec, self.head)).squeeze(-1)

    def _gates(self, nodes: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """SAF's ``(ib, cb, K)`` gate logits ``w^T s_p + b`` (the product in the nodes' dtype)
        in the working ``dtype``."""
        return linear(nodes, self.saf.gate).squeeze(-1).to(dtype)

    def _finish_saf_training(
        self,
        kept: list[tuple[int, int, torch.Tensor, torch.Tensor]],
        n_img: int,
        lengths: torch.Tensor,
        inverse: torch.Tensor | None,
        dtype: torch.dtype,
    ) -> torch.Tensor:
        """SAF in training mode: each caption's BatchNorm statistics over all its pairs first
        (``inverse`` puts the sorted captions back in call order for the running update),
        in the working ``dtype``."""
        device = kept[0][2].device
        gates = [self._gates(nodes, dtype) * nm for _, _, nodes, nm in kept]
        count = (lengths.to(dtype) + 1) * n_img  # scalars per caption
        total = torch.zeros(lengths.shape[0], dtype=dtype, device=device)
        for (c0, c1, *_), g in zip(kept, gates, strict=True):
            total = total.index_add(0, torch.arange(c0, c1, device=device), g.sum(dim=(0, 2)))
        mean = total / count
        sq = torch.zeros_like(total)
        for (c0, c1, _, nm), g in zip(kept, gates, strict=True):
            dev = (g - mean[c0:c1].unsqueeze(-1)) * nm
            sq = sq.index_add(0, torch.arange(c0, c1, device=device), dev.square().sum(dim=(0, 2)))
        var = sq / count
        unbiased = var * count / (count - 1)
        if inverse is None:
            update_running(self.saf.bn, mean.unsqueeze(1), unbiased.unsqueeze(1))
        else:
            update_running(self.saf.bn, mean[inverse].unsqueeze(1), unbiased[inverse].unsqueeze(1))
        rows: dict[int, list[torch.Tensor]] = {}  # caption block -> image blocks in order
        for c0, c1, nodes, nm in kept:
            stats = mean[c0:c1], var[c0:c1]
            rows.setdefault(c0, []).append(self._finish(nodes, nm, stats, [], dtype))
        return torch.cat([torch.cat(row, dim=0) for row in rows.values()], dim=1)


__all__ = ["CPU_EVAL_BLOCK_BYTES", "MODULES", "SGRAFScorer"]
