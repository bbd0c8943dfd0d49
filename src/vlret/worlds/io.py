"""Writing a world to disk in the real formats (SCAN precomp, Karpathy JSON with rendered
images, MSR-VTT) through :mod:`vlret.data.writers`, plus the side files with the facts,
relevance, clone groups and the clean mask (``docs/synthetic.md``).
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import shutil
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any, cast

import numpy as np

from .._files import (
    WriteFailed,
    atomic_write_text,
    check_output_dir,
    refuse_non_regular_inside,
    write_failure,
)
from ..data.formats.karpathy_json import KarpathyImage, KarpathySentence
from ..data.formats.msrvtt import DATA_JSON, FEATURES_NPY, JSFUSION_CSV, TRAIN_9K_CSV
from ..data.writers import (
    karpathy_tokens,
    write_jsfusion_csv,
    write_karpathy_json,
    write_msrvtt_json,
    write_msrvtt_train_csv,
    write_precomp,
    write_video_features,
)
from .config import CAPTION_FORMS, EDIT_KINDS, FORMATS, NoiseSpec, SyntheticConfig, get_preset
from .hint import META_FILE, RANDOM_BERT_DIR, config_hint, shard_hint
from .language import N_FACTS, fact_names
from .pixels import (
    DEFAULT_SHARD_SIZE,
    IMAGEFOLDER,
    SHARD_FOLDER,
    check_pixel_options,
    render_jpeg,
    write_pixels,
)
from .relevance import relevance_pairs
from .scenes import Scene
from .splits import SyntheticSplit
from .video_experts import SyntheticExperts, expert_dims, expert_frames
from .world import SyntheticWorld, generate_world

#: Written into a world's folder before its first file and removed once the world is whole
#: (``synthetic.json`` and, for ``vlret synth --random-bert``, the BERT): a folder holding it
#: is a world whose writing stopped half-way (a failure, Ctrl-C, a full disk), which a rerun
#: replaces without ``overwrite``; a whole world still needs ``overwrite``.
UNFINISHED_FILE = "synthetic.unfinished"


def _mark_unfinished(root: Path) -> None:
    """Create ``root`` marked unfinished, and drop what described or belonged to an earlier
    world there: its ``synthetic.json`` (the folder no longer holds that world once writing
    starts) and its random BERT (made from the earlier world's captions)."""
    root.mkdir(parents=True, exist_ok=True)
    atomic_write_text(
        root / UNFINISHED_FILE,
        "vlret synth stopped before this synthetic world was whole; rerun it to replace the "
        "world (no --overwrite needed)\n",
    )
    (root / META_FILE).unlink(missing_ok=True)
    if (root / RANDOM_BERT_DIR).is_dir():
        shutil.rmtree(root / RANDOM_BERT_DIR)


def finish_world(root: str | Path) -> None:
    """Mark the world in ``root`` whole (:data:`UNFINISHED_FILE` removed): what
    :func:`write_synthetic` with ``finish=False`` leaves to its caller once the caller's own
    files (``vlret synth``'s random BERT) are written."""
    (Path(root) / UNFINISHED_FILE).unlink(missing_ok=True)


def is_unfinished(root: str | Path) -> bool:
    """Whether ``root`` holds a world whose writing stopped half-way."""
    return (Path(root) / UNFINISHED_FILE).is_file()


class WorldWriteFailed(WriteFailed):
    """Writing a world into a folder failed for want of room or permission (a full disk, a file
    size limit, a folder made read-only): one line naming the folder and the cause. The folder
    stays marked unfinished (:data:`UNFINISHED_FILE`), so a rerun replaces it."""

    def __init__(self, root: Path, cause: str, code: int) -> None:
        OSError.__init__(self, code, os.strerror(code), str(root))
        self.code = code
        self.kept = False
        self.cause = cause

    def __str__(self) -> str:
        return (
            f"{self.filename}: the synthetic world was not written whole ({self.cause}); the "
            "folder is marked unfinished and a rerun replaces it"
        )


#: numpy's message for a write(2) that came back short (it drops the errno)
_SHORT_WRITE = re.compile(r"(\d+) requested and (\d+) written")


@contextlib.contextmanager
def _world_writes(root: Path) -> Iterator[None]:
    """Turn a write that failed for room or permission into :class:`WorldWriteFailed`."""
    try:
        yield
    except WorldWriteFailed:
        raise
    except OSError as err:
        cause = write_failure(err)
        short = _SHORT_WRITE.fullmatch(str(err))
        if cause is None and short is not None:
            cause = (
                f"a write came short, {short[1]} bytes asked and {short[2]} written: the disk "
                "is full or a file size limit was reached"
            )
        if cause is None:
            raise
        raise WorldWriteFailed(root, cause, err.errno or errno.EIO) from err


def _require_pillow(what: str = "rendering the karpathy format's images") -> None:
    """Refuse (:class:`~vlret._extras.MissingExtra`) a rendered-image world without Pillow."""
    from .._extras import require

    require("PIL", what)


def _image_ids(world: SyntheticWorld) -> dict[str, list[int]]:
    out, next_id = {}, 1000
    for name, split in world.splits.items():
        out[name] = list(range(next_id, next_id + split.num_images))
        next_id += split.num_images
    return out


def _write_precomp(world: SyntheticWorld, root: Path) -> dict[str, Any]:
    ids = _image_ids(world)
    files = {}
    for name, split in world.splits.items():
        k = world.config.captions_per_image
        per = ids[name] if name == "train" else [i for i in ids[name] for _ in range(k)]
        assert split.features is not None  # a precomp world is never multi-expert
        paths = write_precomp(root, name, split.features, split.captions("precomp"), ids=per)
        files[name] = {key: p.name for key, p in paths.items()}
    return files


_KARPATHY_SPLIT = {"dev": "val", "test": "test", "testall": "test"}


def _karpathy_image(
    imgid: int, label: str, sents: tuple[KarpathySentence, ...], *, coco: bool
) -> KarpathyImage:
    """Image ``imgid`` of a Karpathy JSON, named as in the COCO or Flickr30K release."""
    sentids = tuple(s.sentid for s in sents)
    if not coco:
        return KarpathyImage(imgid, f"{1000000000 + imgid}.jpg", label, sentids, sents)
    cocoid = 100000 + imgid
    folder = "train2014" if label == "train" else "val2014"
    filename = f"COCO_{folder}_{cocoid:012d}.jpg"
    return KarpathyImage(imgid, filename, label, sentids, sents, filepath=folder, cocoid=cocoid)


def _write_karpathy(world: SyntheticWorld, root: Path, *, render_images: bool) -> dict[str, Any]:
    coco = world.config.dataset == "coco"
    dataset = "coco" if coco else "flickr30k"
    images: list[KarpathyImage] = []
    scenes: list[Scene] = []
    sentid = 0
    for name, split in world.splits.items():
        raws = split.captions("raw")
        k = world.config.captions_per_image
        n_train = int(round(0.73 * split.num_images))  # COCO: Karpathy train, then restval
        for i in range(split.num_images):
            if name == "train":
                label = "restval" if coco and i >= n_train else "train"
            else:
                label = _KARPATHY_SPLIT[name]
            texts = raws[i * k : (i + 1) * k]
            sents = tuple(
                KarpathySentence(sentid + c, t, tuple(karpathy_tokens(t)))
                for c, t in enumerate(texts)
            )
            sentid += k
            images.append(_karpathy_image(len(images), label, sents, coco=coco))
            scenes.append(split.scenes[i])
    json_path = write_karpathy_json(root / f"dataset_{dataset}.json", images, dataset=dataset)
    out: dict[str, Any] = {"json": json_path.name}
    if render_images:
        image_root = root / "images"
        for im, scene in zip(images, scenes, strict=True):
            path = im.path(image_root)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(render_jpeg(scene, seed=world.seed, imgid=im.imgid))
        out["image_root"] = "images"
    return out


_MSRVTT_SPLIT = {"train": "train", "dev": "validate", "test": "test", "testall": "test"}


def _write_msrvtt(world: SyntheticWorld, root: Path) -> dict[str, Any]:
    """The MSR-VTT annotation files and the features: ``video_feats.npy`` + ``video_ids.txt``,
    or for a multi-expert world the expert layout of :mod:`vlret.data.formats.experts.features` in
    ``root``."""
    videos: list[tuple[str, str]] = []
    captions: dict[str, list[str]] = {}
    feats: list[np.ndarray | None] = []  # None: a multi-expert world's splits
    vid_of: dict[str, list[str]] = {}
    for name, split in world.splits.items():
        texts = split.captions("msrvtt")
        k = world.config.captions_per_image
        vid_of[name] = []
        for i in range(split.num_images):
            vid = f"video{len(videos)}"
            videos.append((vid, _MSRVTT_SPLIT[name]))
            captions[vid] = texts[i * k : (i + 1) * k]
            vid_of[name].append(vid)
        feats.append(split.features)
    write_msrvtt_json(root / DATA_JSON, videos, captions)
    test_name = "test" if "test" in vid_of else ("testall" if "testall" in vid_of else None)
    test_1ka: list[str] = []
    if test_name is not None:
        test = vid_of[test_name]
        test_1ka = test[len(test) - min(world.config.n_1ka, len(test)) :]
    held = set(test_1ka)
    write_msrvtt_train_csv(root / TRAIN_9K_CSV, [v for v, _ in videos if v not in held])
    write_jsfusion_csv(root / JSFUSION_CSV, [(v, captions[v][0]) for v in test_1ka])
    out: dict[str, Any] = {}
    if world.config.multi_expert:
        (root / FEATURES_NPY).unlink(missing_ok=True)  # an overwritten frame-feature world's
        out["experts"] = _write_experts(world, root, [v for v, _ in videos])
    else:
        (root / "experts.json").unlink(missing_ok=True)  # an overwritten expert world's
        frames = cast("list[np.ndarray]", feats)  # a single-feature world's splits have them
        write_video_features(root, [v for v, _ in videos], np.concatenate(frames))
    first = len(vid_of[test_name]) - len(test_1ka) if test_name else 0
    return {
        **out,
        "json": DATA_JSON,
        "train_csv": TRAIN_9K_CSV,
        "jsfusion_csv": JSFUSION_CSV,
        "videos": {name: [vids[0], vids[-1]] for name, vids in vid_of.items()},
        "1k-A test": {"split": test_name, "first_image": first, "caption": 0},
    }


def _write_experts(world: SyntheticWorld, root: Path, video_ids: list[str]) -> str:
    """Every split's experts, in video order, through the shared expert-layout writer."""
    from ..data.formats.experts.features import EXPERTS_JSON, write_expert_features

    # a multi-expert world's splits have experts
    experts = [cast(SyntheticExperts, split.experts) for split in world.splits.values()]
    entries = {
        name: [e for split_experts in experts for e in split_experts.entries(name)]
        for name in experts[0].names
    }
    spans = expert_frames(world.config)
    write_expert_features(
        root,
        video_ids,
        entries,
        max_frames={name: spans[name][1] for name in entries if name in spans},
        overwrite=True,  # check_out_dir already refused an existing world unless overwrite
    )
    return EXPERTS_JSON


def _write_side_files(
    world: SyntheticWorld, root: Path, *, relevance_splits: Sequence[str]
) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, split in world.splits.items():
        files = {}
        np.savez_compressed(
            root / f"{name}_synth.npz",
            image_fact_indptr=split.image_facts.indptr,
            image_fact_indices=split.image_facts.indices,
            caption_fact_indptr=split.caption_facts.indptr,
            caption_fact_indices=split.caption_facts.indices,
            txt_to_img=split.txt_to_img.astype(np.int32),
            scenes=split.scene_array(),
            caption_form=split.caption_form,
            edit_kind=split.edit_kind,
            edit_parent=split.edit_parent,
        )
        files["synth"] = f"{name}_synth.npz"
        np.save(root / f"{name}_groups.npy", split.groups)
        files["groups"] = f"{name}_groups.npy"
        if name in relevance_splits:
            txt, img = relevance_pairs(split.caption_facts, split.image_facts)
            np.savez_compressed(
                root / f"{name}_relevance.npz",
                txt=txt,
                img=img,
                shape=np.array([split.num_captions, split.num_images], dtype=np.int64),
            )
            files["relevance"] = f"{name}_relevance.npz"
        if world.noise is not None and name == "train":
            np.save(root / "train_clean.npy", split.clean)
            files["clean"] = "train_clean.npy"
        out[name] = files
    return out


def _summary(split: SyntheticSplit) -> dict[str, Any]:
    edits = np.bincount(split.edit_kind, minlength=len(EDIT_KINDS))
    forms = np.bincount(split.caption_form, minlength=len(CAPTION_FORMS))
    return {
        "images": split.num_images,
        "captions": split.num_captions,
        "images_in_clone_groups": int((split.edit_kind > 0).sum()),
        "edit_kinds": {k: int(v) for k, v in zip(EDIT_KINDS, edits, strict=True)},
        "caption_forms": {k: int(v) for k, v in zip(CAPTION_FORMS, forms, strict=True)},
        "clean_captions": int(split.clean.sum()),
        "features": list(split.features.shape) if split.features is not None else None,
        **({"experts": split.experts.summary()} if split.experts is not None else {}),
    }


def _write_world(
    world: SyntheticWorld,
    root: Path,
    format: str,
    relevance_splits: Sequence[str] | None,
    *,
    render_images: bool,
    pixels: Mapping[str, Any],
) -> None:
    """Write ``world`` into ``root``, marked unfinished from the first file on, in ``format``
    with its side files and the pictures ``pixels`` asks for (:func:`~.pixels.write_pixels`'
    options), ``synthetic.json`` last (:func:`write_synthetic`)."""
    _mark_unfinished(root)
    if format == "precomp":
        format_files = _write_precomp(world, root)
    elif format == "karpathy":
        format_files = _write_karpathy(world, root, render_images=render_images)
    else:
        format_files = _write_msrvtt(world, root)
    if relevance_splits is None:
        relevance_splits = [s for s in world.splits if s != "train"]
    side = _write_side_files(world, root, relevance_splits=relevance_splits)
    pictures = write_pixels(world, root, **pixels) if pixels else {}
    config = world.config
    meta = {
        "vlret_synthetic": 1,
        "preset": config.name,
        "format": format,
        "seed": world.seed,
        "noise": asdict(world.noise) if world.noise is not None else None,
        "config": asdict(config),
        "splits": {name: _summary(split) for name, split in world.splits.items()},
        "format_files": format_files,
        "side_files": side,
        "train_config_hint": config_hint(
            root=root,
            format=format,
            files=format_files,
            captions_per_image=config.captions_per_image,
            feature_dim=config.feature_dim,
            has_dev="dev" in world.splits,
            experts=expert_dims() if config.multi_expert else None,
        ),
        **pictures,
        **(
            {"webdataset_config_hint": shard_hint(root, pictures["webdataset"])}
            if "webdataset" in pictures
            else {}
        ),
        "n_facts": N_FACTS,
        "facts": fact_names(),
        "edit_kinds": list(EDIT_KINDS),
        "caption_forms": list(CAPTION_FORMS),
    }
    # `vlret demo` reuses a world whose meta file it can read: write it whole or not at all
    atomic_write_text(root / META_FILE, json.dumps(meta, indent=1))


def write_synthetic(
    preset: str | SyntheticConfig,
    out_dir: str | Path,
    *,
    format: str | None = None,
    seed: int = 0,
    noise: str | NoiseSpec | Mapping[str, Any] | None = None,
    relevance_splits: Sequence[str] | None = None,
    render_images: bool = True,
    webdataset: bool = False,
    imagefolder: bool = False,
    shard_size: int = DEFAULT_SHARD_SIZE,
    shard_samples: str = "pairs",
    progress: Callable[[str], None] | None = None,
    overwrite: bool = False,
    finish: bool = True,
    **overrides: Any,
) -> Path:
    """Generate a world and write it to ``out_dir`` in ``format``; returns ``out_dir``.

    ``format`` defaults to ``msrvtt`` for a multi-expert world (``video-experts``, the only
    format it has) and to ``precomp`` otherwise.

    * ``precomp``: ``{split}_ims.npy`` / ``_caps.txt`` / ``_ids.txt`` (train ids per image,
      the others per caption, as in the real folders);
    * ``karpathy``: ``dataset_flickr30k.json`` (``dataset_coco.json`` for coco-like, train
      split into train + restval) and, with ``render_images`` (needs Pillow), a small JPEG per
      scene under ``images/``;
    * ``msrvtt``: ``MSRVTT_data.json`` (dev is ``validate``), the 9k train CSV (every video
      but the 1k-A test ones), ``MSRVTT_JSFUSION_test.csv`` (the last ``n_1ka`` test videos,
      first caption each), ``video_feats.npy`` + ``video_ids.txt`` (a multi-expert world:
      ``experts.json``, ``video_ids.txt`` and ``<expert>.npy`` / ``.present.npy`` /
      ``.frames.npy``, :func:`vlret.data.formats.experts.features.write_expert_features`).

    With ``webdataset`` and ``imagefolder`` (Pillow; webdataset for the shards), the rendered
    pictures too (:mod:`~.pixels`): shards of ``shard_size`` samples in the img2dataset
    layout under ``webdataset/<split>/`` (train: one sample per (image, caption) pair, or per
    image with ``shard_samples="images"``; dev and test: one per image), and one folder per
    class under ``imagefolder/<category|colour>/<split>/``; ``progress`` is called with a line
    per shard and per folder written.

    Side files (any format): ``synthetic.json`` (config, counts, fact names, a config hint
    for ``vlret train``), ``{split}_synth.npz`` (facts, scenes, edits), ``{split}_groups.npy``,
    ``{split}_relevance.npz`` for ``relevance_splits`` (default: every split but train) and
    ``train_clean.npy`` with ``noise``. ``overrides`` are :class:`SyntheticConfig` fields
    (``feature_dim``, ``regions``, ``frames``, ``captions_per_image``, ``splits``, ...).
    An existing non-empty ``out_dir`` (an earlier world included: data trained on must not
    change under a model) is refused unless ``overwrite`` is set, or it holds a world whose
    writing stopped half-way (:data:`UNFINISHED_FILE`, written before the first file and
    removed after the last one; ``finish=False`` leaves it for the caller to remove with
    :func:`finish_world`). Everything is checked, and the world generated, before the first
    file is written: a missing extra (Pillow for rendered images, webdataset for the shards)
    writes nothing.
    """
    multi_expert = get_preset(preset, **overrides).multi_expert
    if format is None:
        format = "msrvtt" if multi_expert else "precomp"
    if format not in FORMATS:
        raise ValueError(f"format must be one of {FORMATS}, got {format!r}")
    if multi_expert and format != "msrvtt":
        raise ValueError(
            f"format {format!r}: a multi-expert world (video-experts) is written in the msrvtt "
            "format only (its experts have the MSR-VTT multi-expert layout)"
        )
    pixels: dict[str, Any] = {}
    if webdataset or imagefolder:
        check_pixel_options(shard_size=shard_size, shard_samples=shard_samples)
        pixels = {
            "webdataset": webdataset,
            "imagefolder": imagefolder,
            "shard_size": shard_size,
            "shard_samples": shard_samples,
            "progress": progress,
        }
    root = check_output_dir(out_dir, "out_dir")
    check_out_dir(root, overwrite=overwrite)
    if render_images and format == "karpathy":
        _require_pillow()
    if webdataset:
        from .._extras import require

        require("webdataset", "writing webdataset shards (--webdataset)")
    if pixels:
        _require_pillow("rendering the pictures (--webdataset, --imagefolder)")
    world = generate_world(preset, seed=seed, noise=noise, **overrides)
    earlier = (root / META_FILE).is_file() or is_unfinished(root)
    for folder in ("images", SHARD_FOLDER, IMAGEFOLDER):
        if earlier and (root / folder).is_dir():
            shutil.rmtree(root / folder)  # stale pictures of an earlier synthetic world
    with _world_writes(root):
        _write_world(
            world, root, format, relevance_splits, render_images=render_images, pixels=pixels
        )
    if finish:
        finish_world(root)
    return root


def check_out_dir(root: Path, *, overwrite: bool, flag: str = "overwrite=True") -> None:
    """Refuse (``FileExistsError`` naming ``root`` and ``flag``) a non-empty ``root``, an
    earlier synthetic world included, unless ``overwrite``; ``ValueError`` for a file. A world
    whose writing stopped half-way (:data:`UNFINISHED_FILE`) is not refused: a rerun
    replaces it."""
    if root.exists() and not root.is_dir():
        raise ValueError(f"out_dir {root} exists and is not a directory")
    if root.is_dir() and (overwrite or is_unfinished(root)):
        refuse_non_regular_inside(root)  # the world is written into it file by file
    if overwrite or not root.is_dir() or is_unfinished(root) or not any(root.iterdir()):
        return
    meta_path = root / META_FILE
    if meta_path.is_file():
        try:
            meta = json.loads(meta_path.read_text(encoding="utf-8"))
            what = f" ({meta.get('preset')}, seed {meta.get('seed')}, {meta.get('format')})"
        except (json.JSONDecodeError, AttributeError):
            what = ""
        raise FileExistsError(
            f"{root} already holds a synthetic world{what}; pass {flag} to replace it"
        )
    raise FileExistsError(
        f"{root} is not empty and holds no {META_FILE}; pass {flag} to write into it anyway"
    )


#: The :class:`SyntheticConfig` fields among :func:`synth_main`'s options.
_CONFIG_FIELDS = frozenset(SyntheticConfig.__dataclass_fields__)


def synth_main(preset: str, out: str | Path, *, random_bert: bool = False, **options: Any) -> Path:
    """Entry point of ``vlret synth PRESET --out DIR``: :func:`write_synthetic` with
    ``options`` (``format``, ``seed``, ``noise`` as ``"MODE:RATE"``, ``relevance_splits``,
    ``render_images``, the pictures' ``webdataset``, ``imagefolder``, ``shard_size``,
    ``shard_samples`` and ``progress``, ``overwrite`` and :class:`SyntheticConfig` fields such as
    ``feature_dim``, ``regions``, ``frames``, ``captions_per_image``); ``None`` values mean
    the preset's default. With ``random_bert`` (``--random-bert``), also
    ``DIR/random-bert``, a small random BERT on the world's words
    (:func:`~.bert.write_random_bert`: MMT's text side on a multi-expert world; the BERT text
    sides of DIME, CHAN and USER on a precomp one). Returns the output folder.

    Everything the world needs is checked before anything is written: an MSR-VTT-format or
    precomp world and transformers for ``random_bert`` (:class:`~vlret._extras.MissingExtra`
    naming the extra), Pillow for rendered images, webdataset for shards, and the folder: a
    non-empty ``out`` (an earlier world included) is refused unless ``overwrite``
    (``--overwrite``) or it holds a world whose writing stopped half-way
    (:data:`UNFINISHED_FILE`; the folder stays marked until the BERT is written too)."""
    from .._extras import require

    options = {k: v for k, v in options.items() if v is not None}
    if random_bert:
        config = get_preset(preset, **{k: v for k, v in options.items() if k in _CONFIG_FIELDS})
        fmt = options.get("format") or ("msrvtt" if config.multi_expert else "precomp")
        if fmt not in ("msrvtt", "precomp"):
            raise ValueError(
                f"--random-bert needs an MSR-VTT-format world (the video or video-experts "
                f"preset, --format msrvtt) or a precomp one, got format {fmt!r}"
            )
        require("transformers", "--random-bert")
    root = check_output_dir(out, "--out")
    check_out_dir(root, overwrite=bool(options.get("overwrite")), flag="--overwrite")
    path = write_synthetic(preset, root, finish=not random_bert, **options)
    if random_bert:
        from .bert import write_random_bert

        with _world_writes(path):
            write_random_bert(path / RANDOM_BERT_DIR, _world_captions(path, fmt))
            finish_world(path)
    return path


def _world_captions(path: Path, fmt: str) -> list[str]:
    """Every caption of a written world: its MSR-VTT JSON's, or a precomp world's
    ``{split}_caps.txt`` lines (the words a random BERT's vocabulary is made of)."""
    if fmt == "msrvtt":
        from ..data.formats.msrvtt import read_msrvtt_json

        return [c for cs in read_msrvtt_json(path / DATA_JSON).captions.values() for c in cs]
    return [
        line.strip()
        for caps in sorted(path.glob("*_caps.txt"))
        for line in caps.read_text(encoding="utf-8").splitlines()
        if line.strip()
    ]


__all__ = [
    "UNFINISHED_FILE",
    "WorldWriteFailed",
    "check_out_dir",
    "finish_world",
    "is_unfinished",
    "synth_main",
    "write_synthetic",
]
