"""What vlret reads of a Hugging Face CLIP folder besides the network: its image preprocessing,
its tokenizer files and its weights file, each checked before use so that a folder written by
another ``transformers`` version is read as that version wrote it, or refused in one line.

**Image preprocessing.** ``transformers`` 4 saved the image processor as
``preprocessor_config.json`` with its keys at the top level (``CLIPImageProcessor``, or the
older ``CLIPFeatureExtractor`` with ``size`` and ``crop_size`` as plain ints, as
``openai/clip-vit-base-patch32`` still ships it). ``transformers`` 5's
``CLIPProcessor.save_pretrained`` writes ``processor_config.json`` instead, the image
processor's keys nested under ``"image_processor"``. :func:`find_image_processor` reads them in
``transformers``' own order: ``processor_config.json``'s ``image_processor`` if it has one, else
``preprocessor_config.json``. :func:`parse_image_processor` turns the keys into an
:class:`ImagePreprocessing` with ``transformers``' meaning: ``size`` (an int or
``{"shortest_edge"}``: the shorter side; ``{"height", "width"}`` or ``[h, w]``: that exact
size), ``crop_size``, ``do_resize``, ``do_center_crop``, ``do_rescale`` / ``rescale_factor``,
``do_normalize`` / ``image_mean`` / ``image_std``, ``resample`` (PIL's filter number) and
``do_convert_rgb``; an absent key takes ``CLIPImageProcessor``'s default, as ``transformers``
does. ``do_convert_rgb = false`` is read but every image is still converted to RGB: the vision
tower takes three channels (``transformers`` would fail on a grey image instead). What
``transformers`` would do differently (a ``size`` with ``longest_edge``, an image processor of
another model) is refused, naming the file and the key.

A folder with neither file is refused unless the caller names the defaults to use
(``default_preprocessing``, :data:`DEFAULT_PREPROCESSINGS`): ``"openai-clip"`` is OpenAI's CLIP
pipeline at the vision config's ``image_size`` (bicubic resize of the shorter side, centre crop,
CLIP's mean and std), which is what vlret used before it read processor files at all.

**Tokenizer.** ``transformers`` 5 builds a placeholder tokenizer holding only the special tokens
when a CLIP folder has no tokenizer files (every caption becomes unknown tokens, every score
equal); :func:`check_clip_tokenizer` refuses that folder first. Captions are truncated to the
text tower's ``max_position_embeddings`` (:func:`text_max_positions`) where the tokenizer's own
``model_max_length`` is larger or unset (``CLIPTokenizer(vocab_file, merges_file)`` saves
~1e30), silently, as ``CLIPProcessor`` truncates to 77; a smaller ``model_max_length`` is kept.

**Weights.** ``CLIPModel.from_pretrained`` reads ``model.safetensors`` or ``pytorch_model.bin``
(either possibly sharded); :func:`check_clip_weights` names the folder when none is there.
"""

from __future__ import annotations

import json
import pickle
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from .text import check_local_dir, import_transformers

#: transformers 5: ``{"image_processor": {...}, "processor_class": "CLIPProcessor"}``
PROCESSOR_FILE = "processor_config.json"
#: transformers 4 (and the Hub's CLIP folders): the image processor's keys at the top level
PREPROCESSOR_FILE = "preprocessor_config.json"
#: The named preprocessing defaults a caller may opt into for a folder with no processor file.
DEFAULT_PREPROCESSINGS = ("openai-clip",)
#: The image processor classes whose defaults :func:`parse_image_processor` fills in.
CLIP_PROCESSOR_TYPES = (
    "CLIPImageProcessor",
    "CLIPImageProcessorFast",
    "CLIPImageProcessorPil",
    "CLIPFeatureExtractor",
)
#: PIL's filter numbers as ``transformers`` stores ``resample`` (``PILImageResampling``).
PIL_FILTERS = {0: "nearest", 1: "lanczos", 2: "bilinear", 3: "bicubic", 4: "box", 5: "hamming"}
#: Files of a CLIP tokenizer: the fast one's, or the BPE's vocabulary and merges (either set).
TOKENIZER_FILE_SETS = (("tokenizer.json",), ("vocab.json", "merges.txt"))
#: What ``CLIPModel.from_pretrained`` loads weights from, in its order.
WEIGHT_FILES = (
    "model.safetensors",
    "model.safetensors.index.json",
    "pytorch_model.bin",
    "pytorch_model.bin.index.json",
)


@dataclass(frozen=True)
class ImagePreprocessing:
    """A CLIP image processor's steps, as ``transformers`` applies them (module docstring).

    Attributes:
        source: The file (and key) they were read from, for messages.
        resize: The shorter side (int), an exact ``(height, width)``, or None (no resize).
        crop: The centre crop ``(height, width)``, or None (no crop).
        resample: PIL's filter name (``"bicubic"``, ``"bilinear"``, ...).
        rescale_factor: Pixel values (0-255) are multiplied by it (1.0 with ``do_rescale``
            false).
        mean: Per-channel mean, or None for ``CLIPImageProcessor``'s default (OpenAI's CLIP).
        std: Per-channel standard deviation, or None likewise.
    """

    source: str
    resize: int | tuple[int, int] | None
    crop: tuple[int, int] | None
    resample: str
    rescale_factor: float
    mean: tuple[float, float, float] | None
    std: tuple[float, float, float] | None

    @property
    def output_size(self) -> tuple[int, int] | None:
        """``(height, width)`` of every image out of it; None when it depends on the image."""
        if self.crop is not None:
            return self.crop
        return self.resize if isinstance(self.resize, tuple) else None


def _read_json(path: Path) -> dict:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ValueError(f"{path}: not a readable JSON file ({err})") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path}: top level is {type(data).__name__}; expected an object")
    return data


def find_image_processor(folder: str | Path) -> tuple[dict[str, Any], str] | None:
    """The image processor's keys in ``folder`` and where they were found, in ``transformers``'
    order (module docstring); None when the folder holds neither file.

    Raises:
        ValueError: A file is not a JSON object, or its ``image_processor`` is not one.
    """
    folder = Path(folder)
    processor = folder / PROCESSOR_FILE
    if processor.is_file():
        nested = _read_json(processor).get("image_processor")
        if nested is not None:
            if not isinstance(nested, dict):
                raise ValueError(
                    f"{processor}: image_processor is {type(nested).__name__}; expected an object "
                    "of image processor keys"
                )
            return nested, f"{processor} image_processor"
    pre = folder / PREPROCESSOR_FILE
    if pre.is_file():
        return _read_json(pre), str(pre)
    return None


def _flag(cfg: dict[str, Any], key: str, where: str) -> bool:
    value = cfg.get(key, True)  # every do_* of CLIPImageProcessor defaults to true
    if not isinstance(value, bool):
        raise ValueError(f"{where}: {key} must be true or false, got {value!r}")
    return value


def _positive(value: Any, where: str, key: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{where}: {key} must hold positive integers, got {value!r}")
    return value


def _size(value: Any, where: str, key: str, *, square: bool) -> int | tuple[int, int]:
    """``transformers``' size dict of ``value``: an int is the shorter side (``size``) or a
    square (``crop_size``); ``[h, w]`` and ``{"height", "width"}`` are exact."""
    if isinstance(value, (list, tuple)) and len(value) == 2:
        return _positive(value[0], where, key), _positive(value[1], where, key)
    if isinstance(value, dict):
        keys = set(value)
        if keys == {"height", "width"}:
            return _positive(value["height"], where, key), _positive(value["width"], where, key)
        if keys == {"shortest_edge"} and not square:
            return _positive(value["shortest_edge"], where, key)
    elif not isinstance(value, dict):
        side = _positive(value, where, key)
        return (side, side) if square else side
    expected = '{"height", "width"}' if square else '{"shortest_edge"} or {"height", "width"}'
    raise ValueError(
        f"{where}: {key} {value!r} is not read by vlret; expected an int or {expected}"
    )


def read_channels(value: Any, where: str, key: str) -> tuple[float, float, float]:
    """An image processor's per-channel ``image_mean`` / ``image_std``: 3 numbers, or one
    number that ``transformers`` repeats over the channels.

    Raises:
        ValueError: Anything else, naming ``where``, ``key`` and the value.
    """
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        value = [value] * 3  # transformers repeats a single number over the channels
    ok = isinstance(value, (list, tuple)) and len(value) == 3
    if not ok or any(isinstance(v, bool) or not isinstance(v, (int, float)) for v in value):
        raise ValueError(f"{where}: {key} must be 3 numbers (R, G, B), got {value!r}")
    return float(value[0]), float(value[1]), float(value[2])


def parse_image_processor(cfg: dict[str, Any], where: str) -> ImagePreprocessing:
    """The :class:`ImagePreprocessing` of an image processor's keys (module docstring).

    Args:
        cfg: The keys (:func:`find_image_processor`).
        where: The file they came from, named in every message.

    Raises:
        ValueError: Another model's image processor, a key of the wrong type or value, a
            ``size`` vlret does not read, or steps that do not give one image size.
    """
    kind = cfg.get("image_processor_type", cfg.get("feature_extractor_type"))
    if kind is not None and kind not in CLIP_PROCESSOR_TYPES:
        raise ValueError(
            f"{where}: image_processor_type {kind!r} is not CLIP's; expected one of "
            f"{list(CLIP_PROCESSOR_TYPES)}"
        )
    _flag(cfg, "do_convert_rgb", where)  # read for its type; the tower needs RGB regardless
    size = _size(cfg.get("size", 224), where, "size", square=False)
    resize = size if _flag(cfg, "do_resize", where) else None
    crop = _size(cfg.get("crop_size", 224), where, "crop_size", square=True)
    crop_pair = crop if isinstance(crop, tuple) else (crop, crop)
    resample = cfg.get("resample", 3)
    if isinstance(resample, bool) or resample not in PIL_FILTERS:
        raise ValueError(
            f"{where}: resample must be one of PIL's filter numbers {sorted(PIL_FILTERS)}, "
            f"got {resample!r}"
        )
    factor: Any = cfg.get("rescale_factor", 1 / 255)
    if isinstance(factor, bool) or not isinstance(factor, (int, float)) or not factor > 0:
        raise ValueError(f"{where}: rescale_factor must be a positive number, got {factor!r}")
    mean: tuple[float, float, float] | None = None
    std: tuple[float, float, float] | None = None
    if "image_mean" in cfg:
        mean = read_channels(cfg["image_mean"], where, "image_mean")
    if "image_std" in cfg:
        std = read_channels(cfg["image_std"], where, "image_std")
        if min(std) <= 0:
            raise ValueError(f"{where}: image_std must be positive, got {cfg['image_std']!r}")
    if not _flag(cfg, "do_normalize", where):
        mean, std = (0.0, 0.0, 0.0), (1.0, 1.0, 1.0)
    out = ImagePreprocessing(
        source=where,
        resize=resize,
        crop=crop_pair if _flag(cfg, "do_center_crop", where) else None,
        resample=PIL_FILTERS[resample],
        rescale_factor=float(factor) if _flag(cfg, "do_rescale", where) else 1.0,
        mean=mean,
        std=std,
    )
    if out.output_size is None:
        raise ValueError(
            f"{where}: do_center_crop is false and size is not an exact height and width, so "
            "images keep their own shapes; a CLIP vision tower takes one size"
        )
    if out.crop is not None and isinstance(resize, int) and resize < max(out.crop):
        raise ValueError(
            f"{where}: size {resize} (shorter side) is smaller than crop_size {out.crop}; "
            "transformers would pad the image with zeros, which vlret does not do"
        )
    if (
        out.crop is not None
        and isinstance(resize, tuple)
        and min(resize[0] - out.crop[0], resize[1] - out.crop[1]) < 0
    ):
        raise ValueError(
            f"{where}: size {resize} is smaller than crop_size {out.crop} on a side; "
            "transformers would pad the image with zeros, which vlret does not do"
        )
    return out


def read_preprocessing(
    folder: str | Path, *, default_preprocessing: str | None = None
) -> ImagePreprocessing | None:
    """The image preprocessing of a CLIP folder; None where the caller opted into named
    defaults (``default_preprocessing``) and the folder holds no processor file.

    Args:
        folder: The local CLIP folder.
        default_preprocessing: None (a folder without processor file is refused) or a name in
            :data:`DEFAULT_PREPROCESSINGS`.

    Raises:
        FileNotFoundError: Neither file is there and no defaults were named.
        ValueError: An unknown ``default_preprocessing``, or a file vlret cannot read as
            ``transformers`` would (:func:`parse_image_processor`).
    """
    if default_preprocessing is not None and default_preprocessing not in DEFAULT_PREPROCESSINGS:
        raise ValueError(
            f"default_preprocessing: expected one of {list(DEFAULT_PREPROCESSINGS)} or none, "
            f"got {default_preprocessing!r}"
        )
    found = find_image_processor(folder)
    if found is not None:
        return parse_image_processor(*found)
    if default_preprocessing is None:
        raise FileNotFoundError(
            f"{folder}: no {PROCESSOR_FILE} or {PREPROCESSOR_FILE}, so its image preprocessing "
            "is unknown; save its processor there (CLIPProcessor.save_pretrained) or opt into "
            "OpenAI CLIP's with default_preprocessing 'openai-clip' (the model key; vlret "
            "zeroshot and vlret eval --model-dir: --default-preprocessing)"
        )
    return None


def _tower_int(folder: str | Path, tower: str, key: str, default: int) -> int:
    """``folder/config.json``'s ``tower`` (``vision_config``, ``text_config``) ``key``, or
    ``default`` (the ``transformers`` config's) when absent."""
    config = Path(folder) / "config.json"
    if not config.is_file():
        raise FileNotFoundError(f"{config}: missing; expected a CLIP config.json")
    section = _read_json(config).get(tower) or {}
    value = section.get(key, default) if isinstance(section, dict) else None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{config}: {tower} {key} must be a positive int, got {value!r}")
    return value


def vision_image_size(folder: str | Path) -> int:
    """The vision config's ``image_size`` in ``folder/config.json`` (224 when absent, as
    ``CLIPVisionConfig``'s default).

    Raises:
        FileNotFoundError: No ``config.json``.
        ValueError: It is not a JSON object, or the size is not a positive int.
    """
    return _tower_int(folder, "vision_config", "image_size", 224)


def text_max_positions(folder: str | Path) -> int:
    """The text config's ``max_position_embeddings`` in ``folder/config.json`` (77 when
    absent, as ``CLIPTextConfig``'s default): the most token ids the text tower embeds, which
    the folder's tokenizer truncates to (:class:`vlret.data.vocab.HFTokenizer`).

    Raises:
        FileNotFoundError: No ``config.json``.
        ValueError: It is not a JSON object, or the value is not a positive int.
    """
    return _tower_int(folder, "text_config", "max_position_embeddings", 77)


def check_clip_tokenizer(folder: str | Path) -> Path:
    """``folder`` if it holds a CLIP tokenizer's files (:data:`TOKENIZER_FILE_SETS`).

    Raises:
        FileNotFoundError: ``folder`` is not a directory, or neither set is complete (the
            message names the missing files).
    """
    folder = check_local_dir(folder, "a CLIP model")
    for names in TOKENIZER_FILE_SETS:
        if all((folder / name).is_file() for name in names):
            return folder
    missing = [n for names in TOKENIZER_FILE_SETS for n in names if not (folder / n).is_file()]
    raise FileNotFoundError(
        f"{folder}: no CLIP tokenizer files (missing {', '.join(missing)}; expected tokenizer.json "
        "or vocab.json with merges.txt, as CLIPProcessor.save_pretrained writes them)"
    )


def check_clip_weights(folder: str | Path) -> Path:
    """``folder`` if it holds a file ``CLIPModel.from_pretrained`` loads (:data:`WEIGHT_FILES`).

    Raises:
        FileNotFoundError: None is there; the message names the folder and the files.
    """
    folder = Path(folder)
    if any((folder / name).is_file() for name in WEIGHT_FILES):
        return folder
    raise FileNotFoundError(
        f"{folder}: no CLIP weights (expected {' or '.join(WEIGHT_FILES[::2])}, as "
        "CLIPModel.save_pretrained writes them)"
    )


def _stored_shapes(folder: Path) -> tuple[Path, dict[str, tuple[int, ...]]] | None:
    """The weight file ``CLIPModel.from_pretrained`` would read and its tensors' shapes, read
    without loading the tensors: ``model.safetensors``'s header, or ``pytorch_model.bin``
    through ``torch.load(weights_only=True)`` onto the meta device (so a pickle holding
    anything but tensors is refused here, before ``transformers`` opens it). None for sharded
    weights and for a ``.bin`` torch cannot read (``transformers`` then says why).

    Raises:
        ValueError: A damaged safetensors file, or a ``.bin`` refused by ``weights_only``.
    """
    path = folder / "model.safetensors"
    if path.is_file():
        from safetensors import safe_open  # a dependency of transformers

        try:
            with safe_open(str(path), framework="pt") as weights:
                return path, {k: tuple(weights.get_slice(k).get_shape()) for k in weights.keys()}
        except Exception as err:  # safetensors raises its own SafetensorError
            raise ValueError(f"{path}: not a readable safetensors file ({err})") from None
    path = folder / "pytorch_model.bin"
    if not path.is_file():
        return None
    try:
        with warnings.catch_warnings():  # torch's note on the pickle protocol is not ours
            warnings.simplefilter("ignore")
            try:
                state = torch.load(str(path), map_location="meta", weights_only=True, mmap=True)
            except RuntimeError:  # torch's legacy (non-zip) format cannot be memory-mapped
                state = torch.load(str(path), map_location="meta", weights_only=True)
    except pickle.UnpicklingError:
        raise ValueError(
            f"{path}: refused: it holds pickled objects other than tensors (torch.load "
            "weights_only=True; nothing in it was run)"
        ) from None
    except (RuntimeError, OSError, ValueError, EOFError):  # e.g. the legacy non-zip format
        return None
    if not isinstance(state, dict):
        return None
    return path, {k: tuple(v.shape) for k, v in state.items() if isinstance(v, torch.Tensor)}


def _check_weight_shapes(transformers: Any, folder: Path, config: Any) -> None:
    """Refuse weights whose shapes ``config.json`` does not give, before ``transformers``
    loads anything (it would print its load report and raise)."""
    stored = _stored_shapes(folder)
    if stored is None:
        return
    path, shapes = stored
    with torch.device("meta"):  # shapes only: no memory, no initialisation
        model = transformers.CLIPModel(config)
    expected = {key: tuple(value.shape) for key, value in model.state_dict().items()}
    for key, shape in shapes.items():
        if key in expected and expected[key] != shape:
            vision = config.vision_config
            hint = (
                f" (weights of another image size? config.json: vision_config image_size "
                f"{vision.image_size}, patch_size {vision.patch_size})"
                if "position" in key and key.startswith("vision_model")
                else ""
            )
            raise ValueError(
                f"{path}: {key} has shape {list(shape)} but config.json gives "
                f"{list(expected[key])}{hint}"
            )


def load_clip_model(folder: str | Path) -> Any:
    """``CLIPModel.from_pretrained(folder, local_files_only=True)`` in float32, each way it can
    fail turned into one line naming the folder or file.

    Raises:
        ImportError: ``transformers`` is not installed.
        FileNotFoundError: No weights file (:func:`check_clip_weights`).
        ValueError: ``config.json`` is not a CLIP config; a weight's shape differs from the
            config's (another image size); ``pytorch_model.bin`` holds pickled objects other
            than tensors (refused by ``torch.load(weights_only=True)``, nothing in it run); or
            ``transformers`` cannot load the folder for another reason (its first line).
    """
    transformers = import_transformers("CLIP fine-tuning")
    folder = check_clip_weights(folder)
    try:
        config = transformers.CLIPConfig.from_pretrained(str(folder), local_files_only=True)
    except (OSError, ValueError, TypeError, KeyError) as err:
        first = (str(err).strip().splitlines() or [type(err).__name__])[0]
        raise ValueError(
            f"{folder / 'config.json'}: not a readable CLIP config ({first})"
        ) from None
    _check_weight_shapes(transformers, folder, config)
    try:
        model = transformers.CLIPModel.from_pretrained(
            str(folder), config=config, local_files_only=True
        )
    except pickle.UnpicklingError:
        raise ValueError(
            f"{folder / 'pytorch_model.bin'}: refused: it holds pickled objects other than "
            "tensors (torch.load weights_only=True; nothing in it was run)"
        ) from None
    except (OSError, RuntimeError, ValueError, TypeError) as err:
        first = (str(err).strip().splitlines() or [type(err).__name__])[0]
        raise ValueError(f"{folder}: not a loadable CLIP ({first[:300]})") from None
    return model.float()


__all__ = [
    "CLIP_PROCESSOR_TYPES",
    "DEFAULT_PREPROCESSINGS",
    "PIL_FILTERS",
    "PREPROCESSOR_FILE",
    "PROCESSOR_FILE",
    "TOKENIZER_FILE_SETS",
    "WEIGHT_FILES",
    "ImagePreprocessing",
    "check_clip_tokenizer",
    "check_clip_weights",
    "find_image_processor",
    "load_clip_model",
    "parse_image_processor",
    "read_channels",
    "read_preprocessing",
    "text_max_positions",
    "vision_image_size",
]
