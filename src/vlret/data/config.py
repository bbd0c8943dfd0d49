"""The ``[data]`` section of a run config: where the data lives, how it is read and augmented.

The data layer owns it: the readers (:mod:`vlret.data.paths`, :mod:`vlret.data.noisy`, the
captions files, the transforms) take a :class:`DataConfig`, and the run config
(:mod:`vlret.run.config`) builds one from a config file's ``[data]`` table with the declared
machinery (:func:`vlret._settings.build`). Each key is one :func:`~vlret._settings.setting`
field: its default, its one-line description and its constraint. The checks between keys of
this section and others (a format's own keys, AOQ's loss, the model's image size) are the run
config's (:mod:`vlret.run.config_checks`).
"""

from __future__ import annotations

from dataclasses import dataclass

from .._settings import MAX_CAPTIONS, MAX_STEPS, MAX_WORKERS, OneOf, Range, Text, setting
from .caption_augment import TEXT_AUGMENTS
from .formats import format_names
from .formats.pedes.letterbox import PERSON_TRANSFORMS
from .noisy import MAX_NOISE_SEED, NOISE_FORMATS
from .transforms import INTERPOLATIONS, TRAIN_TRANSFORMS

#: The values of ``data.format`` (the person-search ones: :mod:`vlret.data.formats.pedes`).
DATA_FORMATS = format_names()

_CAPTIONS_FILE = Text("a captions file (docs/captions.md)")


@dataclass
class DataConfig:
    """Where the data lives and how captions are encoded: the ``[data]`` section.

    Each key's description, default and constraint is its field's declaration
    (:func:`~vlret._settings.setting`); the key reference of the docs lists them all.
    ``format``: ``precomp`` (SCAN / VSE-infinity folder), ``msrvtt``, ``karpathy``
    (``karpathy_json`` + ``image_root``; images go through the model's transform),
    ``webdataset`` shards or ``csv`` pairs (:mod:`vlret.data.formats.shards`,
    :mod:`vlret.data.formats.csv`) or a person-search set (:mod:`vlret.data.formats.pedes`).
    Relative
    paths start from the current folder (:mod:`vlret.data.paths`).
    """

    root: str = setting(
        doc="the data folder (precomp and MSR-VTT files, person search's defaults are in it)"
    )
    format: str = setting("precomp", "the data layout", choices=DATA_FORMATS)
    train_split: str = setting("train", "the split trained on")
    dev_split: str | None = setting(
        "dev",
        "the split of model selection (`best.pt`); null: no validation, `best.pt` is the last "
        "epoch",
        constraint="MSR-VTT 1k-A: null or `test` (it has no dev split; null by default)",
    )
    dev_max_images: int | None = setting(
        1000,
        "model selection uses the first N dev images (1000: 5000 captions); null: all",
        sane=(1, MAX_STEPS),
    )
    captions_per_image: int = setting(
        5, "captions per image (precomp, Karpathy)", sane=(1, MAX_CAPTIONS)
    )
    captions_per_video: int = setting(20, "captions per video (MSR-VTT)", sane=(1, MAX_CAPTIONS))
    protocol: str = setting("full", "MSR-VTT's split protocol: `full` or `1k-A`")
    features_dir: str | None = setting(
        None, "a folder of precomputed features read instead of `root`'s (`{split}_ims.npy`)"
    )
    experts: str | list[str] | None = setting(
        None,
        "MSR-VTT multi-expert features: `all` or a list of names "
        "(vlret.data.formats.experts.features); a CE / MMT model defaults it to its own experts",
    )
    karpathy_json: str | None = setting(
        None, "the Karpathy split JSON (`dataset_coco.json`, ...)", constraint="format karpathy"
    )
    image_root: str | None = setting(
        None,
        "the folder the image paths of a Karpathy JSON, a CSV or a person-search set start from",
    )
    vocab: str | None = setting(
        None, "a vocabulary JSON; null: built from the train (+dev) captions with `min_count`"
    )
    tokenizer: str | None = setting(
        None, "a local Hugging Face tokenizer folder used instead of a vocabulary"
    )
    min_count: int = setting(
        4, "a word enters the built vocabulary from this many occurrences", sane=(0, MAX_STEPS)
    )
    num_workers: int = setting(
        0, "data-loading worker processes (0: in the training process)", sane=(0, MAX_WORKERS)
    )
    check_features: bool = setting(
        True,
        "scan the train and dev features for NaN / inf and their size before training (one "
        "pass over the files)",
    )
    train_transform: str = setting(
        "none",
        "the training augmentation of the images (webdataset, csv, Karpathy, person search); "
        "`irra`: IRRA's person-search one",
        choices=TRAIN_TRANSFORMS,
        constraint="a format that serves images",
    )
    person_transform: str | None = setting(
        None,
        "how person-search evaluation reads the pictures: `letterbox` (whole, aspect kept, "
        "padded with the mean colour), `resize` (to the model's input, no crop: IRRA's) or "
        "`model` (the model's own transform); null: `resize` with train_transform `irra`, else "
        "`model`, and `letterbox` for a run trained on other data (vlret.data.formats.pedes."
        "letterbox)",
        spec=OneOf((None, *PERSON_TRANSFORMS), words="null or " + ", ".join(PERSON_TRANSFORMS)),
        constraint="person-search formats read it",
    )
    text_augment: str = setting(
        "none",
        "the training augmentation of the captions: `vse_infinity` masks (50%), replaces (10%) "
        "or drops (40%) each word with probability 0.2, as VSE-infinity's BERT data loader "
        "(vlret.data.caption_augment); evaluation captions are never augmented",
        choices=TEXT_AUGMENTS,
        constraint="a BERT (WordPiece) tokenizer",
    )
    max_caption_tokens: int | None = setting(
        None,
        "cut every caption (training and evaluation) to its first N tokens, its start / end "
        "tokens not counted (AdaCL's sentence length 32; vlret.data.caption_length); null: "
        "the encoder's own limit",
        spec=Range(integer=True, ge=1, words="a positive integer"),
        reason="null: the encoder's own limit",
        constraint="a vlret vocabulary or a Hugging Face tokenizer",
    )
    crop_scale: list[float] = setting(
        doc="random-resized crop: the area fraction range",
        factory=lambda: [0.08, 1.0],
        constraint="two numbers, 0 < low <= high <= 1",
    )
    crop_ratio: list[float] = setting(
        doc="random-resized crop: the aspect-ratio range",
        factory=lambda: [0.75, 1.3333],
        constraint="two numbers, 0 < low <= high",
    )
    crop_interpolation: str = setting(
        "bicubic", "random-resized crop: the resampling", choices=INTERPOLATIONS
    )
    hflip: bool = setting(False, "random horizontal flips in training")
    shards: str | list[str] | None = setting(
        None,
        "webdataset: the training shards, a brace pattern (`train/{00000..00003}.tar`) or a "
        "list, of paths or webdataset URLs (`pipe:aws s3 cp s3://b/{0..9}.tar -`, `https://...`)",
        constraint="format webdataset",
    )
    dev_shards: str | list[str] | None = setting(
        None, "webdataset: the dev shards (paths or URLs, as `data.shards`)"
    )
    train_num_samples: int | None = setting(
        None, "webdataset: the samples in one epoch (no file gives a stream's size)"
    )
    shuffle_buffer: int = setting(1000, "webdataset: the sample shuffle buffer")
    resampled: bool = setting(False, "webdataset: draw shards with replacement (open_clip's)")
    max_bad_fraction: float = setting(
        0.01,
        "the share of training samples that may be skipped as unreadable before the run stops",
    )
    max_image_pixels: int = setting(
        25_000_000,
        "the largest image (width x height) any reader decodes, checked from the header: a "
        "larger one is a skipped sample in training, an error naming the file elsewhere",
    )
    csv: str | None = setting(None, "csv: the training pairs file", constraint="format csv")
    dev_csv: str | None = setting(None, "csv: the dev pairs file")
    csv_img_key: str = setting("filepath", "csv: the image path column")
    csv_caption_key: str = setting("title", "csv: the caption column")
    csv_separator: str = setting("\t", "csv: the field separator (a tab: TSV)")
    csv_multiline: bool = setting(
        False,
        "csv: a quoted field may hold line breaks (off: refused naming its lines, as an "
        "unclosed quote reads)",
    )
    annotations: str | None = setting(
        None, "person search: the annotation JSON (default: the format's file in `root`)"
    )
    noise_index: str | None = setting(
        None,
        "noisy correspondence: a released `.npy` index of the shuffled training pairs (NCR's "
        "or DECL's)",
        spec=Text("a .npy noise index"),
        constraint="precomp and karpathy only",
    )
    noise_format: str = setting(
        "auto",
        "which layout `noise_index` has (`auto`: told apart by length, NCR's by default)",
        choices=NOISE_FORMATS,
    )
    noise_ratio: float = setting(
        0.0,
        "without `noise_index`: the share of training captions to shuffle (an index generated "
        "with `noise_seed`)",
        spec=Range(ge=0, le=1, words="a fraction in [0, 1]"),
        reason="0: clean",
    )
    noise_seed: int = setting(
        0,
        "the seed of a generated noise index (`numpy.random.RandomState`'s seeds)",
        spec=Range(integer=True, ge=0, le=MAX_NOISE_SEED),
    )
    offline_negatives: str | None = setting(
        None,
        "AOQ: the `.npz` of `vlret mine-negatives` for the training split",
        spec=Text("a mined .npz file"),
        constraint="loss aoq",
    )
    offline_candidates: int | None = setting(
        300,
        "AOQ: an item draws among its first N candidates (null: all K)",
        spec=Range(integer=True, ge=1, words="a positive number of candidates"),
        reason="null: all K of the file",
    )
    train_captions: str | None = setting(
        None,
        "a captions file read instead of the training annotations (one per line, e.g. `vlret "
        "caption`'s); the vocabulary is built from it",
        spec=_CAPTIONS_FILE,
        constraint="precomp and karpathy only",
    )
    semantic_captions: str | None = setting(
        None,
        "a captions file of the training images that a loss's caption TF-IDF (VSL's Eq. 3) is "
        "fitted on instead of the training captions (e.g. richer annotations than the ones "
        "trained on)",
        spec=_CAPTIONS_FILE,
        constraint="a loss that needs caption semantics (vsl)",
    )
    dev_captions: str | None = setting(
        None,
        "a captions file for the dev split",
        spec=_CAPTIONS_FILE,
        constraint="with a dev_split",
    )
    test_captions: str | None = setting(
        None,
        "a captions file evaluation reads instead of the real test captions",
        spec=_CAPTIONS_FILE,
    )


__all__ = ["DATA_FORMATS", "DataConfig"]
