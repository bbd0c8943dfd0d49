"""``vlret export --format open_clip``, checked without open_clip (it cannot be imported here):

* the state dict's keys and shapes equal an independent list written from open_clip's
  published facts for the exported model config: ``CLIP``'s ViT towers (``visual.conv1``,
  ``class_embedding``, ``positional_embedding``, ``ln_pre``, ``transformer.resblocks.N`` of
  ``torch.nn.MultiheadAttention`` + MLP, ``ln_post``, ``proj``), its text tower at the top
  (``token_embedding``, ``positional_embedding``, ``transformer``, ``ln_final``,
  ``text_projection``) and ``logit_scale``; heads are ``width // head_width``, MLP widths
  ``int(width * mlp_ratio)``;
* the model config holds only fields of open_clip's ``CLIPVisionCfg`` / ``CLIPTextCfg``;
* a forward pass written here the way open_clip computes (pre-norm residual blocks of
  ``nn.MultiheadAttention``, a causal mask, the text pooled at its largest id, ``x @ proj``)
  from the file as open_clip's ``load_checkpoint`` reads it gives vlret's embeddings.
"""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F
from torch import nn

pytest.importorskip("transformers")

from export_helpers import TINY  # noqa: E402
from vlret.data.vocab import HFTokenizer  # noqa: E402
from vlret.models import build_model  # noqa: E402
from vlret.models.clip import CLIPByteTokenizer  # noqa: E402
from vlret.models.export import ExportRefused  # noqa: E402
from vlret.models.export.open_clip import export_open_clip  # noqa: E402

#: open_clip's CLIPVisionCfg / CLIPTextCfg fields (model.py), the ones a config may name.
VISION_FIELDS = {
    "layers", "width", "head_width", "mlp_ratio", "patch_size", "image_size", "ls_init_value",
    "patch_dropout", "attentional_pool", "attn_pooler_queries", "attn_pooler_heads",
    "no_ln_pre", "pos_embed_type", "final_ln_after_pool", "pool_type", "output_tokens",
    "act_kwargs", "norm_kwargs", "timm_model_name", "timm_model_pretrained", "timm_pool",
    "timm_proj", "timm_proj_bias", "timm_drop", "timm_drop_path",
}  # fmt: skip
TEXT_FIELDS = {
    "context_length", "vocab_size", "hf_tokenizer_name", "tokenizer_kwargs", "width", "heads",
    "layers", "mlp_ratio", "ls_init_value", "embed_cls", "pad_id", "no_causal_mask",
    "final_ln_after_pool", "pool_type", "proj_bias", "proj_type", "output_tokens",
    "act_kwargs", "norm_kwargs", "hf_model_name", "hf_model_pretrained", "hf_proj_type",
    "hf_pooler_type",
}  # fmt: skip


def expected_shapes(config: dict) -> dict[str, tuple[int, ...]]:
    """open_clip ``CLIP``'s parameter names and shapes for a ViT model config."""
    embed, vis, txt = config["embed_dim"], config["vision_cfg"], config["text_cfg"]
    shapes: dict[str, tuple[int, ...]] = {}

    def blocks(prefix: str, width: int, layers: int, mlp_ratio: float) -> None:
        hidden = int(width * mlp_ratio)
        for n in range(layers):
            b = f"{prefix}transformer.resblocks.{n}."
            shapes.update({
                b + "ln_1.weight": (width,), b + "ln_1.bias": (width,),
                b + "attn.in_proj_weight": (3 * width, width),
                b + "attn.in_proj_bias": (3 * width,),
                b + "attn.out_proj.weight": (width, width), b + "attn.out_proj.bias": (width,),
                b + "ln_2.weight": (width,), b + "ln_2.bias": (width,),
                b + "mlp.c_fc.weight": (hidden, width), b + "mlp.c_fc.bias": (hidden,),
                b + "mlp.c_proj.weight": (width, hidden), b + "mlp.c_proj.bias": (width,),
            })  # fmt: skip

    w, grid = vis["width"], vis["image_size"] // vis["patch_size"]
    shapes.update({
        "visual.class_embedding": (w,),
        "visual.positional_embedding": (grid * grid + 1, w),
        "visual.proj": (w, embed),
        "visual.conv1.weight": (w, 3, vis["patch_size"], vis["patch_size"]),
        "visual.ln_pre.weight": (w,), "visual.ln_pre.bias": (w,),
        "visual.ln_post.weight": (w,), "visual.ln_post.bias": (w,),
    })  # fmt: skip
    blocks("visual.", w, vis["layers"], vis.get("mlp_ratio", 4.0))
    tw = txt["width"]
    shapes.update({
        "token_embedding.weight": (txt["vocab_size"], tw),
        "positional_embedding": (txt["context_length"], tw),
        "ln_final.weight": (tw,), "ln_final.bias": (tw,),
        "text_projection": (tw, embed),
        "logit_scale": (),
    })  # fmt: skip
    blocks("", tw, txt["layers"], txt.get("mlp_ratio", 4.0))
    return shapes


def bpe_encoder() -> HFTokenizer:
    """A CLIP-shaped Hugging Face tokenizer: 49,408 ids, start 49406 and end 49407 (its
    vocabulary is not OpenAI's: the export checks the shape open_clip's config can name)."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    vocab = {f"w{i}": i for i in range(49406)}
    vocab.update({"<|startoftext|>": 49406, "<|endoftext|>": 49407})
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="w0"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.post_processor = processors.TemplateProcessing(
        single="<|startoftext|> $A <|endoftext|>",
        special_tokens=[("<|startoftext|>", 49406), ("<|endoftext|>", 49407)],
    )
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<|startoftext|>",
        eos_token="<|endoftext|>",
        pad_token="<|endoftext|>",
        unk_token="w0",
    )
    return HFTokenizer(fast, max_positions=77)


def tiny(**vision) -> nn.Module:
    config = {**TINY, "vision_config": {**TINY["vision_config"], **vision}}
    torch.manual_seed(0)
    model = build_model({"kind": "clip", "preset": "ViT-B-32", "config": config}).eval()
    with torch.no_grad():  # non-trivial biases and norms
        for name, param in model.named_parameters():
            if name.endswith("bias") or "norm" in name:
                param.add_(0.1 * torch.randn_like(param))
    return model


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    out = tmp_path_factory.mktemp("oc") / "oc"
    model = tiny()
    notes = export_open_clip(model, encoder=bpe_encoder(), out=out, logit_scale=3.0)
    return model, out, notes


def _load(out):  # open_clip's load_state_dict: torch.load(weights_only=True), a plain dict
    return torch.load(out / "open_clip_pytorch_model.bin", map_location="cpu", weights_only=True)


def test_keys_and_shapes_are_open_clips_for_the_config(exported):
    _, out, notes = exported
    config = json.loads((out / "open_clip_model_config.json").read_text())
    state = _load(out)
    assert {k: tuple(v.shape) for k, v in state.items()} == expected_shapes(config)
    assert all(v.dtype == torch.float32 for v in state.values())
    assert config == {
        "embed_dim": 16,
        "quick_gelu": False,
        "vision_cfg": {
            "image_size": 32, "layers": 2, "width": 32, "head_width": 8, "mlp_ratio": 2.0,
            "patch_size": 8,
        },
        "text_cfg": {
            "context_length": 77, "vocab_size": 49408, "width": 32, "heads": 4, "layers": 2,
            "mlp_ratio": 2.0,
        },
    }  # fmt: skip
    assert set(config["vision_cfg"]) <= VISION_FIELDS and set(config["text_cfg"]) <= TEXT_FIELDS
    hub = json.loads((out / "open_clip_config.json").read_text())
    assert hub["model_cfg"] == config
    assert (
        hub["preprocess_cfg"]["size"] == 32 and hub["preprocess_cfg"]["resize_mode"] == "shortest"
    )
    assert float(state["logit_scale"]) == 3.0
    assert notes == []  # the preset's transform is open_clip's (rounded crop offsets)


def _block(x, state, prefix, heads, causal):
    """open_clip's ResidualAttentionBlock (pre-norm; batch first)."""
    width = x.shape[-1]
    attn = nn.MultiheadAttention(width, heads, batch_first=True)
    attn.load_state_dict(
        {k[len(prefix + "attn.") :]: v for k, v in state.items() if k.startswith(prefix + "attn.")}
    )
    h = F.layer_norm(x, (width,), state[prefix + "ln_1.weight"], state[prefix + "ln_1.bias"])
    x = x + attn(h, h, h, need_weights=False, attn_mask=causal)[0]
    h = F.layer_norm(x, (width,), state[prefix + "ln_2.weight"], state[prefix + "ln_2.bias"])
    h = F.gelu(F.linear(h, state[prefix + "mlp.c_fc.weight"], state[prefix + "mlp.c_fc.bias"]))
    return x + F.linear(h, state[prefix + "mlp.c_proj.weight"], state[prefix + "mlp.c_proj.bias"])


def open_clip_image(state, config, pixels):
    vis = config["vision_cfg"]
    w = vis["width"]
    x = F.conv2d(pixels, state["visual.conv1.weight"], stride=vis["patch_size"])
    x = x.flatten(2).transpose(1, 2)
    x = torch.cat([state["visual.class_embedding"].expand(len(x), 1, w), x], dim=1)
    x = x + state["visual.positional_embedding"]
    x = F.layer_norm(x, (w,), state["visual.ln_pre.weight"], state["visual.ln_pre.bias"])
    for n in range(vis["layers"]):
        x = _block(x, state, f"visual.transformer.resblocks.{n}.", w // vis["head_width"], None)
    x = F.layer_norm(x, (w,), state["visual.ln_post.weight"], state["visual.ln_post.bias"])
    return x[:, 0] @ state["visual.proj"]


def open_clip_text(state, config, ids):
    txt = config["text_cfg"]
    tw, length = txt["width"], txt["context_length"]
    x = state["token_embedding.weight"][ids] + state["positional_embedding"][: ids.shape[1]]
    causal = torch.full((length, length), float("-inf")).triu(1)[: ids.shape[1], : ids.shape[1]]
    for n in range(txt["layers"]):
        x = _block(x, state, f"transformer.resblocks.{n}.", txt["heads"], causal)
    x = F.layer_norm(x, (tw,), state["ln_final.weight"], state["ln_final.bias"])
    return x[torch.arange(len(ids)), ids.argmax(dim=-1)] @ state["text_projection"]


def test_an_open_clip_style_forward_of_the_file_gives_vlrets_embeddings(exported):
    model, out, _ = exported
    state, config = _load(out), json.loads((out / "open_clip_model_config.json").read_text())
    torch.manual_seed(1)
    pixels = torch.randn(3, 3, 32, 32)
    rows = [[49406, 5, 17, 49407], [49406, 49407], [49406, *range(100, 175), 49407]]
    ids = torch.zeros(len(rows), 77, dtype=torch.long)  # open_clip pads with 0 to 77
    for i, row in enumerate(rows):
        ids[i, : len(row)] = torch.tensor(row)
    lengths = torch.tensor([len(r) for r in rows])
    with torch.no_grad():
        assert (
            open_clip_image(state, config, pixels) - model.encode_images(pixels)
        ).abs().max() < 1e-5
        ours = model.encode_texts(ids, lengths)
        assert (open_clip_text(state, config, ids) - ours).abs().max() < 1e-5
        assert (ours[0] - ours[1]).abs().max() > 1e-2


@pytest.mark.parametrize(
    ("change", "words"),
    [
        ({"hidden_act": "gelu_new"}, "hidden_act is 'gelu_new' (vision) and 'gelu' (text)"),
        ({"layer_norm_eps": 1e-6}, "vision_config layer_norm_eps 1e-06 is not open_clip's 1e-5"),
        # 61 / 28 * 28 is 60.99...: open_clip's int(width * mlp_ratio) would build 60
        ({"hidden_size": 28, "intermediate_size": 61}, "intermediate_size 61 is not int(width"),
    ],
)
def test_what_open_clip_cannot_express_is_refused(tmp_path, change, words):
    with pytest.raises(ExportRefused, match=words.replace("(", r"\(").replace(")", r"\)")):
        export_open_clip(tiny(**change), encoder=bpe_encoder(), out=tmp_path / "x")
    assert not (tmp_path / "x").exists()


def test_a_tokenizer_other_than_open_clips_own_is_refused(tmp_path):
    byte_level = CLIPByteTokenizer(bos_id=49406, eos_id=49407)
    with pytest.raises(ExportRefused, match="vlret's byte tokenizer; open_clip tokenizes"):
        export_open_clip(tiny(), encoder=byte_level, out=tmp_path / "x")
    small = bpe_encoder()
    small.tokenizer.add_tokens(["extra"])
    with pytest.raises(ExportRefused, match="has 49409 tokens"):
        export_open_clip(tiny(), encoder=small, out=tmp_path / "x")
