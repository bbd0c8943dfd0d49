"""From a :class:`~vlret.run.config.RunConfig` to datasets, caption encoders, models, losses
and the optimiser.

Shared by the trainer and ``vlret eval`` (which rebuilds them from the config stored in a
checkpoint).
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import torch
from torch import nn

from ..data import (
    DataFormatError,
    RetrievalDataset,
    Vocabulary,
    build_vocab,
    check_features,
    load_hf_tokenizer,
)
from ..data.bad_samples import SkipsBadImages
from ..data.caption_length import cap_caption_tokens
from ..data.captioning_files import captions_vocab_splits
from ..data.config import DataConfig
from ..data.formats import MissingDataKey, StreamOptions, get_format, open_dataset
from ..data.noisy import apply_noise_index, configured_noise
from ..data.paths import check_data_paths
from .config import ConfigError, RunConfig
from .config_sections import build_section
from .loss_config import LossConfig
from .offline_draw import with_offline_negatives
from .pair_scoring import check_pair_scoring, scores_pairs


def model_tokenizer_path(model: dict[str, Any]) -> str | None:
    """The local Hugging Face directory whose tokenizer a BERT or CLIP model config expects
    (None for a CLIP built from a ``preset``, which has no directory)."""
    if model.get("kind") in ("bert", "clip"):
        return str(model["path"]) if model.get("path") is not None else None
    text = model.get("text")
    bert = model.get("kind") == "mmt" or (isinstance(text, dict) and text.get("kind") == "bert")
    if isinstance(text, dict) and bert and "path" in text:
        return str(text["path"])
    return None


def clip_text_positions(model: dict[str, Any]) -> int | None:
    """A CLIP model config's text ``max_position_embeddings`` (its folder's ``config.json``,
    or its ``preset`` with ``model.config``), which its captions are truncated to
    (:class:`~vlret.data.vocab.HFTokenizer`); None for another model, or a folder or preset
    no model can be built from (building it names why)."""
    if model.get("kind") != "clip":
        return None
    from ..models.clip import clip_preset_config
    from ..models.clip_folder import text_max_positions

    try:
        if model.get("path") is not None:
            return text_max_positions(str(model["path"]))
        text = clip_preset_config(str(model.get("preset")), model.get("config"))["text_config"]
    except (OSError, ValueError):
        return None
    value = text.get("max_position_embeddings")
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def _clip_preset_encoder(data: DataConfig, model: dict[str, Any], source: str) -> Any:
    """A CLIP built from ``model.preset`` has no tokenizer directory: its captions go through
    ``data.tokenizer`` (a local CLIP tokenizer directory, e.g. the 49408-token BPE saved with
    any Hugging Face CLIP; returns None, the caller loads it) or, with ``model.tokenizer =
    "bytes"``, :class:`~vlret.models.clip.CLIPByteTokenizer`; neither is a one-line error."""
    choice = model.get("tokenizer")
    if data.tokenizer is not None:
        if choice is not None:
            raise ConfigError(
                source, "model.tokenizer", f"{choice!r} and data.tokenizer both given; keep one"
            )
        return None
    if choice != "bytes":
        raise ConfigError(
            source,
            "data.tokenizer",
            "a CLIP built from model.preset has no tokenizer directory: set data.tokenizer to "
            "a local CLIP tokenizer directory (tokenizer.save_pretrained of a Hugging Face CLIP) "
            'or model.tokenizer = "bytes" (UTF-8 bytes; vlret never downloads)',
        )
    from ..models.clip import CLIPByteTokenizer

    try:
        return CLIPByteTokenizer.for_preset(str(model["preset"]), model.get("config"))
    except ValueError as err:
        raise _model_error(source, err) from None


def _checked_clip_tokenizer(encoder: Any, model: dict[str, Any], source: str) -> Any:
    """``encoder`` unless its ids overflow the preset CLIP's token embeddings (an index error
    at the first step otherwise)."""
    from ..models.clip import clip_preset_config

    try:
        text = clip_preset_config(str(model["preset"]), model.get("config"))["text_config"]
    except ValueError as err:
        raise _model_error(source, err) from None
    size = len(encoder.tokenizer)
    if isinstance(text.get("vocab_size"), int) and size > text["vocab_size"]:
        raise ConfigError(
            source,
            "data.tokenizer",
            f"its {size} tokens overflow the CLIP text tower's vocab_size {text['vocab_size']} "
            "(model.config.text_config.vocab_size)",
        )
    return encoder


def build_encoder(
    data: DataConfig, *, model: dict[str, Any] | None = None, source: str = "<config>"
) -> Any:
    """The caption encoder: ``data.tokenizer`` (a local HF tokenizer directory), the tokenizer
    of a BERT / CLIP model's directory, ``data.vocab`` (a vocab JSON), or a vocabulary built
    from the train (+dev) captions. A CLIP built from a ``preset``: ``data.tokenizer`` or, with
    ``model.tokenizer = "bytes"``, :class:`~vlret.models.clip.CLIPByteTokenizer`."""
    check_data_paths(data)  # a path written from data.root: the fix, before anything is read
    model = model or {}
    if model.get("kind") == "clip" and model.get("preset") is not None:
        byte_level = _clip_preset_encoder(data, model, source)
        if byte_level is not None:
            return byte_level
        positions = clip_text_positions(model)
        encoder = load_hf_tokenizer(str(data.tokenizer), max_positions=positions)
        return _checked_clip_tokenizer(encoder, model, source)
    tokenizer = data.tokenizer or model_tokenizer_path(model)
    if tokenizer is not None and data.tokenizer is None and model.get("kind") == "clip":
        from ..models.clip_folder import check_clip_tokenizer  # no 2-token stand-in

        check_clip_tokenizer(tokenizer)
    if tokenizer is not None:
        return load_hf_tokenizer(tokenizer, max_positions=clip_text_positions(model))
    if data.vocab is not None:
        return Vocabulary.load(data.vocab)
    record = get_format(data.format)
    if data.train_captions is not None and record.captions_files:
        sets = [open_dataset(data, s) for s in captions_vocab_splits(data)]  # files only
        return build_vocab([c for ds in sets for c in ds.captions], min_count=data.min_count)
    if record.vocabulary is None:
        why = f"format {data.format!r} builds no vocabulary: give data.tokenizer or data.vocab"
        raise ConfigError(source, "data.tokenizer", why)
    try:
        return record.vocabulary(data)
    except MissingDataKey as err:
        raise ConfigError(source, f"data.{err.key}", err.why) from None


def encoder_state(encoder: Any, config: RunConfig) -> dict[str, Any]:
    """What a checkpoint stores to rebuild the encoder without the training data."""
    if isinstance(encoder, Vocabulary):
        return {"kind": "vocab", "idx2word": list(encoder.idx2word), "tokenizer": encoder.tokenizer}
    from ..models.clip import CLIPByteTokenizer

    if isinstance(encoder, CLIPByteTokenizer):
        return {"kind": "clip_bytes", **encoder.state()}
    return {"kind": "hf", "path": config.data.tokenizer or model_tokenizer_path(config.model)}


# An encoder state's "tokenizer" -> Vocabulary(tokenizer=...). "nltk_word_tokenize" is what
# vlret import-checkpoint writes for the reference code's NLTK tokenisation; a state without
# the key (checkpoints before it existed) is "vlret".
_STATE_TOKENIZERS = {"vlret": "vlret", "nltk": "nltk", "nltk_word_tokenize": "nltk"}


def encoder_from_state(state: dict[str, Any], *, model: dict[str, Any] | None = None) -> Any:
    """The caption encoder an :func:`encoder_state` (or an imported checkpoint) describes;
    ``model`` (the stored model section): a CLIP's tokenizer truncates to its text positions."""
    if state["kind"] == "vocab":
        name = state.get("tokenizer", "vlret")
        if not isinstance(name, str) or name not in _STATE_TOKENIZERS:
            raise ValueError(
                f"encoder state tokenizer {name!r} is unknown; expected one of "
                f"{sorted(_STATE_TOKENIZERS)}"
            )
        return Vocabulary(state["idx2word"], tokenizer=_STATE_TOKENIZERS[name])
    if state["kind"] == "clip_bytes":
        from ..models.clip import CLIPByteTokenizer

        return CLIPByteTokenizer(**{k: v for k, v in state.items() if k != "kind"})
    return load_hf_tokenizer(state["path"], max_positions=clip_text_positions(model or {}))


def vocab_size(encoder: Any) -> int | None:
    """``len(vocabulary)`` for the GRU's word embeddings; ``None`` for HF tokenizers."""
    return len(encoder) if isinstance(encoder, Vocabulary) else None


def build_train_dataset(
    data: DataConfig,
    split: str,
    encoder: Any,
    *,
    image_transform: Any = None,
    stream: StreamOptions | None = None,
) -> RetrievalDataset:
    """The training split: :func:`~vlret.data.formats.open_dataset`, then the noisy
    correspondence the config asks for (``data.noise_index`` or ``data.noise_ratio``:
    :mod:`vlret.data.noisy`). The only
    builder that applies it, so validation, the test splits and ``vlret eval`` read the clean
    pairs. The set carries ``corrupted``, ``original_txt_to_img`` and ``noise`` (all False,
    the pairing itself and None for clean training).

    With ``data.offline_negatives`` (AOQ) the set is then wrapped so each item also yields its
    offline negatives (:class:`~vlret.data.offline_negatives.OfflineNegativesDataset`, drawing
    among the first ``data.offline_candidates``), after the file was checked against the set's
    sizes and its training pairs (``txt_to_img``, the noisy ones under noise).

    A split read from image files (Karpathy, person search) skips and counts its bad images,
    named by ``data.image_root`` when too many (:class:`~vlret.data.bad_samples.SkipsBadImages`;
    a CSV's names ``data.csv``, as it was read); the other formats keep the one-line error
    naming the file. A streaming format's training split (``stream``: the loop's settings) is
    the stream itself: it skips and counts its bad samples, and no noise or offline negatives
    apply to it (the config checks refuse them)."""
    dataset = open_dataset(
        data, split, encoder=encoder, image_transform=image_transform, stream=stream
    )
    if stream is not None:  # a stream skips and counts its bad samples itself
        return cast("RetrievalDataset", dataset)
    if isinstance(dataset, SkipsBadImages) and not dataset.counts_skipped:
        dataset.skip_bad_images(key="data.image_root", max_bad_fraction=data.max_bad_fraction)
    dataset = with_training_noise(data, dataset)
    if data.offline_negatives is None:
        return dataset
    return cast("RetrievalDataset", with_offline_negatives(data, dataset, split))


def with_training_noise(data: DataConfig, dataset: RetrievalDataset) -> RetrievalDataset:
    """The clean training split ``dataset`` with the run's noisy correspondence applied
    (``data.noise_index`` or ``data.noise_ratio``; unchanged, with ``corrupted`` all False,
    when clean): the pairs the run trains on."""
    noise = configured_noise(
        dataset,
        index=data.noise_index,
        noise_format=data.noise_format,
        ratio=data.noise_ratio,
        seed=data.noise_seed,
    )
    return apply_noise_index(dataset, noise)


def check_split_features(
    datasets: Sequence[RetrievalDataset | None],
    *,
    in_dim: int | None,
    world: int = 1,
    device: torch.device | str = "cpu",
) -> None:
    """NaN / inf and the feature size of ``datasets`` (the train and dev splits) before any
    step. Under torchrun rank 0 passes the splits and the others none; every rank stops when
    rank 0 finds a problem (its ``DataFormatError``, a ``ValueError`` on the others)."""
    error: DataFormatError | None = None
    try:
        for dataset in datasets:
            if dataset is not None:
                check_features(dataset, in_dim=in_dim)
    except DataFormatError as err:
        error = err
    if world > 1:
        failed = torch.tensor([float(error is not None)], device=device)
        torch.distributed.all_reduce(failed)
        if failed.item() and error is None:
            raise ValueError("rank 0 found a problem in the data (its message says which)")
    if error is not None:
        raise error


def _model_error(source: str, err: Exception) -> ConfigError:
    """A ``build_model`` error as a ConfigError keyed ``model`` / ``model.<sub key>``."""
    text = str(err)
    if text.startswith("model: "):
        text = text[len("model: ") :]
    head, sep, rest = text.partition(": ")
    if sep and head and " " not in head:
        return ConfigError(source, f"model.{head}", rest)
    return ConfigError(source, "model", text)


def build_run_model(config: RunConfig, vocab_size: int | None) -> nn.Module:
    """``vlret.models.build_model(config.model)``; its errors become ConfigErrors naming the
    ``model`` key."""
    from ..models import build_model

    try:
        return build_model(config.model, vocab_size=vocab_size)
    except (ValueError, TypeError) as err:
        raise _model_error(config.source, err) from None


def check_model_config(config: RunConfig) -> None:
    """Validate the ``model`` section before the (slow) vocabulary is built, by building the
    model once with a stand-in vocabulary size, and for a model that scores pairs itself the
    settings that need embeddings (:func:`~vlret.run.pair_scoring.check_pair_scoring`).
    Skipped for the pretrained kinds (BERT, CLIP, MMT's BERT), which load weights from disk,
    and for a CVSE model whose concept folder is not written yet; their errors surface at the
    real build. A CVSE model is checked with its folder's vocabulary size."""
    model = config.model
    text = model.get("text")
    text_kind = text.get("kind", "gru") if isinstance(text, dict) else None
    image = model.get("image")
    image_kind = image.get("kind") if isinstance(image, dict) else None
    if model.get("kind", "vse") in ("bert", "clip", "mmt") or text_kind == "bert":
        return
    # a backbone reads a directory or a weights file, or builds a large tower
    if image_kind in ("resnet", "vit", "resnext-wsl"):
        return
    size = text.get("vocab_size") if isinstance(text, dict) else None
    stand_in = 8
    if size is None and model.get("kind") == "cvse":  # its concept folder maps a vocabulary
        from ..models.matchers.cvse_build import concepts_vocab_size

        folder_size = concepts_vocab_size(model.get("concepts"))
        if folder_size is None:  # no folder yet (vlret cvse-concepts): the real build says so
            return
        stand_in = folder_size
    if scores_pairs(build_run_model(config, None if size is not None else stand_in)):
        check_pair_scoring(config)


@dataclass
class StoredRun:
    """What evaluation reads of a checkpoint's stored run config: its data and model sections
    and the model's ``scoring``. The loss section is kept as it was stored (``loss``: plain
    data, never built nor checked), so a checkpoint whose loss this version no longer knows
    still evaluates."""

    data: DataConfig
    model: dict[str, Any]
    #: ``cosine`` or ``dot``: how the two-tower model's embeddings are compared
    scoring: str
    loss: LossConfig
    source: str


def stored_run(raw: Any, *, source: str) -> StoredRun:
    """The :class:`StoredRun` of a checkpoint's stored config ``raw``. The model's ``scoring``
    is the model section's; a checkpoint written before it existed takes it from its loss
    section's ``normalize`` read as plain data (``dot`` when false, else ``cosine``)."""
    if not isinstance(raw, dict):
        raise ConfigError(source, "config", f"expected a table/mapping, got {type(raw).__name__}")
    data = build_section(DataConfig, raw.get("data"), source, "data")
    model = raw.get("model", {})
    if not isinstance(model, dict):
        raise ConfigError(source, "model", f"expected a table/mapping, got {model!r}")
    loss_raw: dict[str, Any] = raw["loss"] if isinstance(raw.get("loss"), dict) else {}
    params = {k: v for k, v in loss_raw.items() if k != "name"}
    scoring = model.get("scoring")
    if scoring is None:  # written before the model carried it
        scoring = "dot" if params.get("normalize", True) is False else "cosine"
    model = _with_trained_preprocessing(model, source)
    return StoredRun(
        data=data,
        model={**model, "scoring": scoring},
        scoring=scoring,
        loss=LossConfig(str(loss_raw.get("name", "")), params),
        source=source,
    )


def _with_trained_preprocessing(model: dict[str, Any], source: str) -> dict[str, Any]:
    """A stored local CLIP whose folder holds no image processor file was trained with OpenAI
    CLIP's preprocessing (vlret used it for such a folder before it refused one): its model
    section gets ``default_preprocessing = "openai-clip"``, with a warning naming the folder,
    so the checkpoint is evaluated as it was trained instead of refused. A folder with a
    processor file is read as it says (:mod:`vlret.models.clip_folder`)."""
    path = model.get("path")
    if model.get("kind") != "clip" or not path or model.get("default_preprocessing") is not None:
        return model
    from ..models.clip_folder import find_image_processor

    try:
        found = find_image_processor(str(path)) if Path(str(path)).is_dir() else True
    except ValueError:  # a broken processor file: loading the model names it
        found = True
    if found is not None:
        return model
    warnings.warn(
        f"{source}: {path} holds no processor_config.json or preprocessor_config.json; its "
        "images are preprocessed as OpenAI CLIP's (default_preprocessing 'openai-clip'), as "
        "vlret trained on such a folder before it refused one; if the folder held a processor "
        "file when this checkpoint was trained, put it back",
        stacklevel=3,
    )
    return {**model, "default_preprocessing": "openai-clip"}


def load_trained_model(
    checkpoint: str | Path, *, device: torch.device | str = "cpu"
) -> tuple[nn.Module, StoredRun, Any]:
    """``(model, stored run, caption encoder)`` rebuilt from a training checkpoint, from its
    model and data sections, encoder and scoring only (:func:`stored_run`; never its loss)."""
    from .checkpoint import load_checkpoint

    return trained_model_from_state(load_checkpoint(checkpoint), checkpoint, device=device)


def trained_model_from_state(
    state: dict[str, Any], checkpoint: str | Path, *, device: torch.device | str = "cpu"
) -> tuple[nn.Module, StoredRun, Any]:
    """:func:`load_trained_model` of a checkpoint already read (``state``, named in errors as
    ``checkpoint``), for a caller that reads more of it (``vlret eval``: NCR's networks)."""
    from ..models import build_model

    if "config" not in state or "encoder" not in state:
        raise ValueError(f"{checkpoint}: not a `vlret train` checkpoint (no config or encoder)")
    run = stored_run(state["config"], source=f"{checkpoint} (stored config)")
    encoder = encoder_from_state(state["encoder"], model=run.model)
    # the cap the run trained with (data.max_caption_tokens; absent in older checkpoints)
    cap_caption_tokens(encoder, getattr(run.data, "max_caption_tokens", None))
    try:
        model = build_model(run.model, vocab_size=state.get("vocab_size"))
    except (ValueError, TypeError) as err:
        raise _model_error(run.source, err) from None
    model.load_state_dict(state["model"])
    return model.to(device).eval(), run, encoder


def load_pretrained_clip(
    model_dir: str | Path,
    *,
    device: torch.device | str = "cpu",
    default_preprocessing: str | None = None,
) -> tuple[nn.Module, StoredRun, Any]:
    """``(model, stored run, caption encoder)`` of a local pretrained Hugging Face CLIP that
    vlret never trained (zero-shot retrieval, ``vlret eval --model-dir``): CLIP's own towers
    and projections (``proj_dim = None``, no added layer), its tokenizer (truncating to the
    text tower's ``max_position_embeddings``, :func:`clip_text_positions`), cosine scoring, and a
    stand-in run whose data is Karpathy JSON + images (the data folder's ``images/``, else the
    folder itself; :func:`~vlret.run.eval_data.eval_data_config`).
    ``default_preprocessing`` (``"openai-clip"``): OpenAI CLIP's preprocessing for a folder
    that holds no image processor file, which is otherwise refused
    (:mod:`vlret.models.clip_folder`).

    Raises:
        FileNotFoundError: ``model_dir`` is not a directory, or lacks tokenizer or processor
            files.
        DataFormatError: It holds no loadable tokenizer.
        ValueError: It holds no loadable CLIP (the message names the directory).
    """
    from ..models import build_model, clip_folder

    source = str(clip_folder.check_clip_tokenizer(model_dir))  # before the weights are read
    try:
        model = build_model(
            {
                "kind": "clip",
                "path": source,
                "proj_dim": None,
                "default_preprocessing": default_preprocessing,
            }
        )
    except (OSError, ValueError, TypeError) as err:
        if isinstance(err, FileNotFoundError):
            raise
        first = (str(err).strip().splitlines() or [type(err).__name__])[0]
        raise ValueError(
            f"{source}: not a loadable Hugging Face CLIP directory ({first})"
        ) from None
    encoder = load_hf_tokenizer(source, max_positions=clip_folder.text_max_positions(source))
    data = DataConfig(root=source, format="karpathy", image_root="images", tokenizer=source)
    run = StoredRun(
        data=data,
        model=dict(getattr(model, "config", None) or {}),
        scoring="cosine",
        loss=LossConfig("", {}),
        source=source,
    )
    return model.to(device).eval(), run, encoder
