"""``vlret caption``: captions for a split's images from a local Hugging Face captioner.

Captioners (each a local directory saved with ``save_pretrained``, model and processor;
loaded with ``local_files_only=True``, nothing is downloaded):

* ``blip``: ``BlipForConditionalGeneration`` + ``BlipProcessor``;
* ``blip2``: ``Blip2ForConditionalGeneration`` + ``Blip2Processor`` (OPT or Flan-T5 inside);
* ``git``: ``AutoModelForCausalLM`` (``GitForCausalLM``) + ``AutoProcessor``;
* ``auto``: the directory's ``config.json`` ``model_type`` picks one of them.

CoCa (AdaCL's fourth captioner) is not among them: it is an open_clip model, open_clip is no
vlret dependency and cannot be installed in vlret's environment, so ``--arch coca`` (or a
``config.json`` saying ``coca``) is refused with a line saying so. Captions CoCa wrote elsewhere
are used through the captions-file format (:mod:`vlret.data.captioning_files`): one caption per
line in the split's image order, with or without a ``FILE.json`` sidecar, given to
``data.train_captions`` like a file of ``vlret caption`` (docs/captions.md, "Captions made
elsewhere").

Generation is batched, greedy (``beams=1``) or beam search, at most ``max_new_tokens`` new
tokens (30 by default, AdaCL A.1's length). A ``prompt`` (``"a picture of"``) conditions every
image; it is removed from the caption (as LAVIS's BLIP does). Decoder-only models (GIT, BLIP-2
with OPT) pad prompts on the left. ``per_image > 1`` keeps the ``per_image`` best beams of
each image (``num_return_sequences``; needs ``beams >= per_image``).

Resumable: the captions go to ``FILE.partial/``, one JSON per chunk of ``chunk`` images, each
written atomically, beside ``settings.json`` (the model, the split, the generation settings and
the dtype: a rerun with other settings is refused unless ``overwrite``). A rerun skips the
chunks written; once all are there, ``FILE`` and its sidecar ``FILE.json`` are written
atomically (:func:`~vlret.data.captioning_files.write_captions_file`) and ``FILE.partial/``
removed. Each chunk is generated in the same batches whether or not the run was interrupted,
so a resumed run writes the file an uninterrupted one writes.
"""

from __future__ import annotations

import json
import math
import shutil
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from .._files import atomic_write_text, check_output_file
from ..data.captioning_files import clean_caption, sidecar_path, write_captions_file
from .images import SplitImages, split_images

#: ``--arch`` values.
ARCHES = ("blip", "blip2", "git", "auto")
#: ``config.json`` ``model_type`` -> arch.
MODEL_TYPES = {"blip": "blip", "blip-2": "blip2", "git": "git"}
#: Why CoCa, AdaCL's fourth captioner, is refused, and what to do instead.
COCA_NOTE = (
    "CoCa is an open_clip model, which vlret cannot run (open_clip is not installed); caption "
    "elsewhere and give the captions file to data.train_captions (docs/captions.md, 'Captions "
    "made elsewhere')"
)
#: ``--dtype`` values.
DTYPES = ("auto", "float32", "bfloat16", "float16")
#: ``--device`` values.
DEVICES = ("auto", "cpu", "cuda")
#: The folder of a run's chunks: ``FILE`` + this suffix.
PARTIAL_SUFFIX = ".partial"


#: The files a saved tokenizer is read from, any one set complete: the fast tokenizer's
#: ``tokenizer.json``, BERT's ``vocab.txt`` (BLIP, GIT), GPT-2's ``vocab.json`` + ``merges.txt``
#: (OPT in BLIP-2) or a SentencePiece model (T5 in BLIP-2).
TOKENIZER_FILE_SETS = (
    ("tokenizer.json",),
    ("vocab.txt",),
    ("vocab.json", "merges.txt"),
    ("spiece.model",),
    ("tokenizer.model",),
    ("sentencepiece.bpe.model",),
)


def _check_tokenizer_files(model_dir: Path, arch: str) -> None:
    """Refuse a captioner folder without its tokenizer's files: transformers would build a
    stand-in tokenizer of two tokens and every caption would decode empty."""
    if not model_dir.is_dir():
        return  # from_pretrained names the folder
    if any(all((model_dir / n).is_file() for n in names) for names in TOKENIZER_FILE_SETS):
        return
    expected = " or ".join(" + ".join(names) for names in TOKENIZER_FILE_SETS)
    raise CaptioningError(
        f"{model_dir}: no tokenizer files for the {arch} captioner (expected {expected}, as "
        "its processor's save_pretrained writes them)"
    )


class CaptioningError(ValueError):
    """Bad input to ``vlret caption`` (a one-line message naming the argument or file)."""


@dataclass(frozen=True)
class CaptionSettings:
    """How captions are generated (the ``vlret caption`` options of the same names).

    Attributes:
        batch_size: Images per ``generate`` call.
        beams: Beam width (1: greedy).
        max_new_tokens: Tokens generated at most per caption (AdaCL: 30).
        prompt: Text every caption starts from (removed from the caption), or None.
        per_image: Captions kept per image (the best beams; at most ``beams``).
        dtype: ``auto`` (bfloat16 on a CUDA device that supports it, else float16 there;
            float32 on the CPU), ``float32``, ``bfloat16`` or ``float16`` (CUDA only).
        device: ``auto`` (CUDA when available), ``cpu`` or ``cuda``.
        chunk: Images per resumable chunk.
    """

    batch_size: int = 16
    beams: int = 1
    max_new_tokens: int = 30
    prompt: str | None = None
    per_image: int = 1
    dtype: str = "auto"
    device: str = "auto"
    chunk: int = 256

    def check(self) -> None:
        """Raise :class:`CaptioningError` naming the first bad setting."""
        for name in ("batch_size", "beams", "max_new_tokens", "per_image", "chunk"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                flag = "--" + name.replace("_", "-")
                raise CaptioningError(f"{flag}: expected a positive integer, got {value!r}")
        if self.per_image > self.beams:
            raise CaptioningError(
                f"--per-image {self.per_image}: keeps the best beams, so it needs --beams "
                f">= {self.per_image} (got --beams {self.beams})"
            )
        if self.dtype not in DTYPES:
            raise CaptioningError(f"--dtype: expected one of {DTYPES}, got {self.dtype!r}")
        if self.device not in DEVICES:
            raise CaptioningError(f"--device: expected one of {DEVICES}, got {self.device!r}")
        if self.prompt is not None and not self.prompt.strip():
            raise CaptioningError("--prompt: empty; leave it out for unconditional captions")


def resolve_arch(model_dir: str | Path, arch: str = "auto") -> str:
    """The captioner kind of ``model_dir``: ``arch``, or with ``auto`` its ``config.json``'s
    ``model_type`` (:data:`MODEL_TYPES`).

    Raises:
        FileNotFoundError: ``model_dir`` or its ``config.json`` is missing.
        CaptioningError: An unknown ``arch`` or ``model_type``.
    """
    model_dir = Path(model_dir)
    if arch not in ARCHES:
        why = f": {COCA_NOTE}" if arch.lower() == "coca" else ""
        raise CaptioningError(f"--arch: expected one of {', '.join(ARCHES)}, got {arch!r}{why}")
    config = model_dir / "config.json"
    if not model_dir.is_dir():
        raise FileNotFoundError(
            f"{model_dir}: missing; expected a local Hugging Face captioner directory "
            "(save_pretrained of the model and its processor)"
        )
    if not config.is_file():
        raise FileNotFoundError(
            f"{config}: missing; {model_dir} is no Hugging Face model directory"
        )
    if arch != "auto":
        return arch
    try:
        model_type = json.loads(config.read_text(encoding="utf-8")).get("model_type")
    except (UnicodeDecodeError, json.JSONDecodeError, AttributeError) as err:
        raise CaptioningError(f"{config}: not a model config ({err})") from None
    if model_type not in MODEL_TYPES:
        why = f"; {COCA_NOTE}" if str(model_type).lower() == "coca" else ""
        raise CaptioningError(
            f"{config}: model_type {model_type!r} is no captioner vlret runs; expected one of "
            f"{', '.join(repr(t) for t in MODEL_TYPES)} (or pass --arch){why}"
        )
    return MODEL_TYPES[model_type]


def resolve_device(device: str = "auto") -> torch.device:
    """``auto``: CUDA when available, else the CPU; ``cuda`` without CUDA is refused."""
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda" and not torch.cuda.is_available():
        raise CaptioningError("--device cuda: no CUDA device is available (use cpu or auto)")
    return torch.device(device)


def resolve_dtype(dtype: str, device: torch.device) -> torch.dtype:
    """The model's dtype: ``auto`` is bfloat16 on a CUDA device that supports it (float16 on
    one that does not) and float32 on the CPU; float16 on the CPU is refused."""
    if dtype == "auto":
        if device.type != "cuda":
            return torch.float32
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    if dtype == "float16" and device.type != "cuda":
        raise CaptioningError(
            "--dtype float16: needs a CUDA device (on the CPU: float32 or bfloat16)"
        )
    return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[dtype]


class Captioner:
    """A loaded captioner: ``captioner(images)`` -> ``per_image`` captions per image.

    Args:
        model_dir: The local directory (model and processor).
        arch: ``blip``, ``blip2`` or ``git`` (:func:`resolve_arch`).
        device: Where it runs.
        dtype: Its weights' dtype (the pixels are cast to it).

    Raises:
        CaptioningError: The directory holds no loadable model or processor of ``arch``.
    """

    def __init__(
        self, model_dir: str | Path, arch: str, *, device: torch.device, dtype: torch.dtype
    ) -> None:
        from .._extras import require

        transformers = require("transformers", "vlret caption")
        self.model_dir = Path(model_dir)
        self.arch = arch
        self.device = device
        self.dtype = dtype
        classes = {
            "blip": ("BlipForConditionalGeneration", "BlipProcessor"),
            "blip2": ("Blip2ForConditionalGeneration", "Blip2Processor"),
            "git": ("AutoModelForCausalLM", "AutoProcessor"),
        }[arch]
        _check_tokenizer_files(self.model_dir, arch)
        try:
            model_cls = getattr(transformers, classes[0])
            processor_cls = getattr(transformers, classes[1])
            self.processor = processor_cls.from_pretrained(self.model_dir, local_files_only=True)
            self.model = model_cls.from_pretrained(
                self.model_dir, local_files_only=True, dtype=dtype
            )
        except (OSError, ValueError, TypeError, KeyError) as err:
            # the whole first line: transformers names the missing file at its end
            first = (str(err).strip().splitlines() or [type(err).__name__])[0]
            raise CaptioningError(
                f"{self.model_dir}: not a loadable {arch} captioner ({first})"
            ) from None
        self.model.to(device).eval()
        self.tokenizer = self.processor.tokenizer
        config = self.model.config
        text = getattr(config, "text_config", None)
        self.decoder_only = arch == "git" or not getattr(text, "is_encoder_decoder", False)
        if arch in ("git", "blip2") and self.decoder_only:
            self.tokenizer.padding_side = "left"

    def _inputs(self, images: Sequence[Any], prompt: str | None) -> dict[str, Any]:
        if prompt is None or self.arch != "git":
            texts = None if prompt is None else [prompt] * len(images)
            inputs = dict(self.processor(images=list(images), text=texts, return_tensors="pt"))
        else:  # GIT: [CLS] + the prompt's tokens, no [SEP] (the model continues the text)
            inputs = dict(self.processor(images=list(images), return_tensors="pt"))
            ids = self.tokenizer(prompt, add_special_tokens=False)["input_ids"]
            start = self.tokenizer.cls_token_id
            row = ([start] if start is not None else []) + list(ids)
            inputs["input_ids"] = torch.tensor([row] * len(images), dtype=torch.long)
        inputs.pop("token_type_ids", None)
        out = {k: v.to(self.device) for k, v in inputs.items() if isinstance(v, torch.Tensor)}
        out["pixel_values"] = out["pixel_values"].to(self.dtype)
        return out

    @torch.inference_mode()
    def __call__(self, images: Sequence[Any], settings: CaptionSettings) -> list[list[str]]:
        """``settings.per_image`` captions for each image (cleaned to one line each)."""
        inputs = self._inputs(images, settings.prompt)
        out = self.model.generate(
            **inputs,
            max_new_tokens=settings.max_new_tokens,
            num_beams=settings.beams,
            num_return_sequences=settings.per_image,
            do_sample=False,
        )
        given = inputs.get("input_ids")
        if given is not None and out.shape[1] >= given.shape[1]:
            given = given.repeat_interleave(settings.per_image, dim=0)
            if bool((out[:, : given.shape[1]] == given).all()):  # decoder-only: the input
                out = out[:, given.shape[1] :]
        texts = [
            clean_caption(t) for t in self.tokenizer.batch_decode(out, skip_special_tokens=True)
        ]
        if settings.prompt is not None:
            texts = [_strip_prompt(t, settings.prompt) for t in texts]
        k = settings.per_image
        return [texts[i * k : (i + 1) * k] for i in range(len(images))]


def _strip_prompt(text: str, prompt: str) -> str:
    """``text`` without a leading ``prompt`` (compared without case)."""
    head = clean_caption(prompt)
    if text.lower().startswith(head.lower()):
        return text[len(head) :].strip()
    return text


@dataclass(frozen=True)
class CaptionRun:
    """What :func:`caption_split` did.

    Attributes:
        path: The captions file (written when ``finished``).
        images: Images of the split.
        generated: Images captioned by this call.
        skipped: Images whose chunk an earlier call had written.
        finished: Whether the file was written (False: stopped after ``stop_after_chunks``).
        empty: Empty captions in the file.
    """

    path: Path
    images: int
    generated: int
    skipped: int
    finished: bool
    empty: int = 0


def _chunk_path(partial: Path, index: int) -> Path:
    return partial / f"chunk_{index:06d}.json"


def _read_chunk(path: Path, start: int, count: int, per_image: int) -> list[list[str]] | None:
    """A chunk written by an earlier call, or None when absent or not whole."""
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None
    captions = record.get("captions") if isinstance(record, dict) else None
    if record.get("start") != start or not isinstance(captions, list) or len(captions) != count:
        return None
    if not all(isinstance(c, list) and len(c) == per_image for c in captions):
        return None
    return captions


def _prepare_partial(partial: Path, record: dict[str, Any], overwrite: bool) -> None:
    """Start ``partial`` for ``record``'s run, or keep an earlier one of the same settings. An
    earlier run that wrote no chunk (its model failed to load) left nothing to lose: its
    folder is started over whatever its settings were."""
    settings_path = partial / "settings.json"
    if partial.is_symlink() or (partial.exists() and not partial.is_dir()):
        raise CaptioningError(
            f"{partial}: the chunks' folder is a symbolic link or a file; vlret keeps its "
            "chunks in a folder of its own: remove it"
        )
    if partial.is_dir() and (overwrite or not any(partial.glob("chunk_*.json"))):
        shutil.rmtree(partial)
    if partial.is_dir() and settings_path.is_file():
        try:
            earlier = json.loads(settings_path.read_text(encoding="utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError):
            earlier = None
        if earlier == record:
            return
        differ = sorted(
            k for k in set(record) | set(earlier or {}) if (earlier or {}).get(k) != record.get(k)
        )
        what = differ[0] if differ else "settings"
        raise CaptioningError(
            f"{partial}: holds the chunks of a run with other settings ({what}: "
            f"{(earlier or {}).get(what)!r}, now {record.get(what)!r}); pass --overwrite to "
            "start over"
        )
    partial.mkdir(parents=True, exist_ok=True)
    atomic_write_text(settings_path, json.dumps(record, indent=1, sort_keys=True) + "\n")


def caption_split(
    model_dir: str | Path,
    data: str | Path,
    split: str,
    out: str | Path,
    *,
    format: str | None = None,
    arch: str = "auto",
    settings: CaptionSettings | None = None,
    overwrite: bool = False,
    progress: bool = False,
    stop_after_chunks: int | None = None,
    load_captioner: Callable[..., Captioner] = Captioner,
) -> CaptionRun:
    """Caption every image of ``split`` of the dataset in ``data`` into the captions file
    ``out`` (module docstring; :func:`~.images.split_images` for where images come from).

    Args:
        model_dir: The local captioner directory.
        data: The data folder (or a Karpathy JSON).
        split: The split.
        out: The captions file; ``out.json`` is its sidecar, ``out.partial/`` the chunks.
        format: ``precomp`` or ``karpathy`` (None: detected).
        arch: ``blip``, ``blip2``, ``git`` or ``auto``.
        settings: Generation settings (defaults: :class:`CaptionSettings`).
        overwrite: Replace an existing ``out`` and discard the chunks of an earlier run.
        progress: Show a progress bar (images and images/s), under the rule of ``vlret._progress``
            (a terminal, rank 0, tqdm installed); off by default, as every library call.
        stop_after_chunks: Return after generating that many chunks, without writing ``out``
            (what an interrupted run leaves; tests).
        load_captioner: Builds the :class:`Captioner` (called only when a chunk is missing).

    Returns:
        What was done.

    Raises:
        OutputPathError: ``out`` exists and ``overwrite`` is not set, or is no regular file.
        FileNotFoundError: ``model_dir``, ``data`` or an image is missing.
        CaptioningError: A bad setting, arch or model directory.
        DataFormatError: The data holds no images for the split, or is malformed.
    """
    settings = settings or CaptionSettings()
    settings.check()
    # the output-path rule (docs/training.md): the file and its sidecar, before any work
    out = check_output_file(out, "--out", "train_caps.txt", overwrite=overwrite)
    check_output_file(sidecar_path(out), "--out", "train_caps.txt.json", overwrite=None)
    kind = resolve_arch(model_dir, arch)
    device = resolve_device(settings.device)
    dtype = resolve_dtype(settings.dtype, device)
    images: SplitImages = split_images(data, split, format=format)
    n = len(images)
    generation = {
        k: v for k, v in asdict(settings).items() if k not in ("device", "batch_size", "chunk")
    }
    generation["dtype"] = str(dtype).removeprefix("torch.")
    record = {
        "model_dir": str(Path(model_dir).resolve()),
        "arch": kind,
        "data": images.describe,
        "format": images.format,
        "split": split,
        "images": n,
        "batch_size": settings.batch_size,
        "chunk": settings.chunk,
        **generation,
    }
    partial = out.with_name(out.name + PARTIAL_SUFFIX)
    _prepare_partial(partial, record, overwrite)
    chunks: list[list[list[str]] | None] = []
    for c in range(math.ceil(n / settings.chunk)):
        start = c * settings.chunk
        count = min(settings.chunk, n - start)
        chunks.append(_read_chunk(_chunk_path(partial, c), start, count, settings.per_image))
    skipped = sum(len(c) for c in chunks if c is not None)
    captioner = None
    bar = None
    if progress and skipped < n:
        from .._progress import progress_bar

        bar = progress_bar(total=n, initial=skipped, unit="img", desc=f"caption {split}")
    generated = written = 0
    try:
        for c, done in enumerate(chunks):
            if done is not None:
                continue
            if stop_after_chunks is not None and written >= stop_after_chunks:
                return CaptionRun(out, n, generated, skipped, False)
            if captioner is None:
                captioner = load_captioner(model_dir, kind, device=device, dtype=dtype)
            start = c * settings.chunk
            stop = min(start + settings.chunk, n)
            result: list[list[str]] = []
            for b in range(start, stop, settings.batch_size):
                batch = [images.load(i) for i in range(b, min(b + settings.batch_size, stop))]
                result.extend(captioner(batch, settings))
                if bar is not None:
                    bar.update(len(batch))
            text = json.dumps({"start": start, "captions": result}, ensure_ascii=False)
            atomic_write_text(_chunk_path(partial, c), text + "\n")
            chunks[c] = result
            generated += stop - start
            written += 1
    finally:
        if bar is not None:
            bar.close()
    flat = [text for chunk in chunks if chunk is not None for per in chunk for text in per]
    empty = sum(1 for t in flat if not t)
    write_captions_file(
        out,
        flat,
        split=split,
        captions_per_image=settings.per_image,
        source=f"{kind}:{record['model_dir']}",
        **{k: v for k, v in record.items() if k not in ("split", "images")},
        empty_captions=empty,
    )
    shutil.rmtree(partial)
    return CaptionRun(out, n, generated, skipped, True, empty)


__all__ = [
    "ARCHES",
    "DEVICES",
    "DTYPES",
    "MODEL_TYPES",
    "CaptionRun",
    "CaptionSettings",
    "Captioner",
    "CaptioningError",
    "caption_split",
    "resolve_arch",
    "resolve_device",
    "resolve_dtype",
]
