"""Multi-modal Transformer (Gabeur, Sun, Alahari, Schmid, "Multi-modal Transformer for Video
Retrieval", ECCV 2020).

Video side (:class:`MMTVideoEncoder`, Sec. 3.1-3.2), per expert ``e``:

* every real frame is projected to ``d_model`` and L2-normalised (the released code's
  ``ReduceDim``); a pooled expert counts as one frame;
* one aggregation token, the same projection of the max-pool of the expert's real frames
  (Sec. 3.1, "F_agg = maxpool(F)"; the released code's ``out_tok = "mxp"``);
* each token gets its expert's embedding (``E`` learned vectors) and a temporal embedding
  (learned, indexed by the frame's position ``1..T``; the aggregation tokens use index 0, as
  the released code's ``tint`` encoding), then LayerNorm and dropout (BERT's embedding layer);
* a transformer encoder (BERT-style post-LayerNorm, GELU; 4 layers, 4 heads, feed-forward
  3072, dropout 0.1 in the released MSR-VTT config) runs over all tokens of all experts, with a
  key padding mask for padding frames and absent experts;
* the output at an expert's aggregation token, L2-normalised, is that expert's embedding.

Text side (:class:`MMTTextEncoder`, Sec. 3.3): a BERT from a local Hugging Face directory; its
[CLS] output goes through one gated embedding unit per expert, and (after dropout) a linear
layer gives the mixture logits (the released ``txt_wgh = "emb"``).

Deviations: the released MMT keeps absent experts in the mixture (``keep_missing_modalities``)
and reads their (meaningless) aggregation outputs; here, as in CE, the mixture renormalises
over the experts the video has, and absent experts are masked out of the attention. Its
temporal index is the feature's time stamp in seconds; here it is the frame's position. There
is no video [CLS] token (unused by the released MSR-VTT config, ``vid_wgh = "none"``) and no
BatchNorm in the text gated units (``txt_pro = "gbn"`` has one).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import torch
from torch import nn

from ..attention import positive_int
from ..image import lengths_to_mask
from ..text import check_local_dir, import_transformers
from .common import (
    ExpertInputs,
    GatedEmbeddingUnit,
    MultiExpertModel,
    check_experts,
    dropout_rate,
    l2norm,
    masked_max,
)


class MMTVideoEncoder(nn.Module):
    """MMT's video side: ``ExpertInputs`` -> ``(N, E, D)`` L2-normalised expert embeddings.

    Args:
        experts: ``name -> input dim``, in the model's order.
        embed_dim: ``D``, also the transformer's width.
        num_layers: Transformer layers.
        num_heads: Attention heads (must divide ``embed_dim``).
        ff_dim: Feed-forward size.
        dropout: Dropout in the embeddings and the transformer.
        max_frames: Largest number of frames of a temporal expert (size of the temporal
            embedding table, plus one for the aggregation tokens).

    Raises:
        ValueError: An invalid setting (the message names it).
    """

    def __init__(
        self,
        experts: Mapping[str, int],
        *,
        embed_dim: int = 512,
        num_layers: int = 4,
        num_heads: int = 4,
        ff_dim: int = 3072,
        dropout: float = 0.1,
        max_frames: int = 30,
    ) -> None:
        super().__init__()
        self.in_dim = check_experts(experts)
        self.embed_dim = positive_int(embed_dim, "embed_dim")
        heads = positive_int(num_heads, "num_heads")
        if embed_dim % heads:
            raise ValueError(f"num_heads: {heads} does not divide embed_dim {embed_dim}")
        self.max_frames = positive_int(max_frames, "max_frames")
        rate = dropout_rate(dropout, "dropout")
        self.project = nn.ModuleList(nn.Linear(d, embed_dim) for d in self.in_dim.values())
        self.expert_embed = nn.Embedding(len(self.in_dim), embed_dim)
        self.temporal_embed = nn.Embedding(self.max_frames + 1, embed_dim)
        self.norm = nn.LayerNorm(embed_dim, eps=1e-12)
        self.dropout = nn.Dropout(rate)
        layer = nn.TransformerEncoderLayer(
            embed_dim,
            heads,
            dim_feedforward=positive_int(ff_dim, "ff_dim"),
            dropout=rate,
            activation="gelu",
            batch_first=True,
            norm_first=False,
            layer_norm_eps=1e-12,
        )
        self.encoder = nn.TransformerEncoder(
            layer, positive_int(num_layers, "num_layers"), enable_nested_tensor=False
        )
        for emb in (self.expert_embed, self.temporal_embed):
            nn.init.normal_(emb.weight, std=0.02)  # BERT's initializer_range

    def forward(self, inputs: ExpertInputs) -> torch.Tensor:
        tokens: list[torch.Tensor] = []
        keeps: list[torch.Tensor] = []
        expert_ids: list[int] = []
        time_ids: list[int] = []
        agg_index: list[int] = []
        start = 0
        for e, (fc, x, mask) in enumerate(
            zip(self.project, inputs.features, inputs.masks, strict=True)
        ):
            n, frames = mask.shape
            if frames > self.max_frames:
                name = list(self.in_dim)[e]
                raise ValueError(
                    f"max_frames: expert {name!r} has {frames} frames per video; the model's "
                    f"temporal embeddings cover {self.max_frames} (raise model.max_frames)"
                )
            agg = l2norm(fc(masked_max(x, mask)))  # (N, D)
            seq = l2norm(fc(x))  # (N, T, D)
            tokens += [agg.unsqueeze(1), seq]
            keeps += [inputs.present[:, e : e + 1], mask]
            expert_ids += [e] * (frames + 1)
            time_ids += list(range(frames + 1))
            agg_index.append(start)
            start += frames + 1
        x = torch.cat(tokens, dim=1)
        keep = torch.cat(keeps, dim=1)
        x = torch.where(keep.unsqueeze(-1), x, 0.0)
        device = x.device
        x = x + self.expert_embed(torch.tensor(expert_ids, device=device))
        x = x + self.temporal_embed(torch.tensor(time_ids, device=device))
        x = self.dropout(self.norm(x))
        # a video with no expert at all attends to its (zero) first aggregation token only, so
        # the softmax has a key; its outputs are discarded (encode_images masks absent experts)
        empty = ~keep.any(dim=1)
        keep = keep.clone()
        keep[:, 0] |= empty
        out = self.encoder(x, src_key_padding_mask=~keep)
        return l2norm(out[:, agg_index])


class MMTTextEncoder(nn.Module):
    """BERT (local directory) [CLS] -> one gated embedding unit per expert, and linear mixture
    logits (after dropout).

    Args:
        path: Local directory of a ``save_pretrained`` BERT model (never downloaded).
        num_experts: ``E``.
        embed_dim: ``D``.
        dropout: Dropout before the mixture layer (the released code's ``moe_txt_dropout``).

    Raises:
        ImportError: ``transformers`` is not installed.
        FileNotFoundError: ``path`` is not a directory.
        ValueError: An invalid size or rate.
    """

    def __init__(
        self, path: str | Path, *, num_experts: int, embed_dim: int = 512, dropout: float = 0.1
    ) -> None:
        super().__init__()
        transformers = import_transformers("the MMT text encoder")
        self.path = check_local_dir(path, "a BERT model")
        self.bert = transformers.BertModel.from_pretrained(
            str(self.path), local_files_only=True, add_pooling_layer=False
        ).float()
        hidden = self.bert.config.hidden_size
        n_exp = positive_int(num_experts, "num_experts")
        self.geu = nn.ModuleList(GatedEmbeddingUnit(hidden, embed_dim) for _ in range(n_exp))
        self.dropout = nn.Dropout(dropout_rate(dropout, "text.dropout"))
        self.mixture = nn.Linear(hidden, n_exp)

    def forward(
        self, captions: torch.Tensor, lengths: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(N, L)`` ids -> (``(N, E, D)`` L2-normalised embeddings, ``(N, E)`` logits)."""
        mask = lengths_to_mask(lengths, captions.shape[1])
        cls = self.bert(
            input_ids=captions, attention_mask=mask.long(), return_dict=True
        ).last_hidden_state[:, 0]
        emb = torch.stack([geu(cls) for geu in self.geu], dim=1)
        return emb, self.mixture(self.dropout(cls))

    def extra_repr(self) -> str:
        return f"path={str(self.path)!r}"


class MultiModalTransformer(MultiExpertModel):
    """MMT (Gabeur et al., ECCV 2020): :class:`MMTVideoEncoder` + :class:`MMTTextEncoder`,
    scored by the renormalised mixture of per-expert cosines (module docstring).

    Args:
        experts: ``name -> input dim``, in the model's order.
        text_path: Local BERT directory.
        embed_dim: ``D`` (the video transformer's width; 512 in the paper).
        num_layers: Video transformer layers.
        num_heads: Video transformer heads.
        ff_dim: Video transformer feed-forward size.
        dropout: Video transformer dropout.
        max_frames: Largest number of frames of a temporal expert.
        text_dropout: Dropout before the text mixture layer.
        config: The resolved config the model was built from.

    Raises:
        ValueError: An invalid setting (the message names it).
    """

    def __init__(
        self,
        experts: Mapping[str, int],
        *,
        text_path: str | Path,
        embed_dim: int = 512,
        num_layers: int = 4,
        num_heads: int = 4,
        ff_dim: int = 3072,
        dropout: float = 0.1,
        max_frames: int = 30,
        text_dropout: float = 0.1,
        config: Mapping[str, object] | None = None,
    ) -> None:
        video = MMTVideoEncoder(
            experts,
            embed_dim=embed_dim,
            num_layers=num_layers,
            num_heads=num_heads,
            ff_dim=ff_dim,
            dropout=dropout,
            max_frames=max_frames,
        )
        text = MMTTextEncoder(
            text_path, num_experts=len(video.in_dim), embed_dim=embed_dim, dropout=text_dropout
        )
        super().__init__(video, text, embed_dim=embed_dim, config=config)
        self.tokenizer_path = str(text.path)


__all__ = ["MMTTextEncoder", "MMTVideoEncoder", "MultiModalTransformer"]
