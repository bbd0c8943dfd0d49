"""A synthetic person-search world in the CUHK-PEDES layout (``vlret synth persons``).

A person is a set of clothing attributes (:data:`FIELDS`): hair length and colour, the upper
garment's type and colour, the lower garment's type and colour, the shoes' colour, a hat (or
none) and a bag (none, a backpack or a handbag) with its colour; a skin tone is drawn too but
never captioned. Each person gets several pictures (:mod:`~.persons_render`): the pose, the
view, the background and the lighting change between pictures, the colours and shapes of the
attribute-defined parts do not. Each picture gets captions from a grammar with synonyms
(:mod:`~.persons_language`; the colour words of :mod:`~.language`) and varied clause order;
most describe every attribute group, some only one to three of them, and a group may state
only its colour or only its type.

The world is learnable but not trivial: a share of the people (``twin_rate``) are *near
twins*, a copy of an earlier person of the same split with one or two captioned attributes
changed, so a caption must carry several attributes to single a person out; no two people
share every captioned attribute; and the train, val and test people are disjoint, so the test
split measures generalisation to new combinations.

On disk::

    DIR/reid_raw.json   [{"split", "captions", "file_path", "processed_tokens", "id"}, ...]
    DIR/imgs/persons/p00001_s000000.jpg ...
    DIR/world.json      the generation: seed, sizes, vocabulary, people, poses, mentions
    DIR/features/{train,val,test}_ims.npy   with ``--features``: region features per picture
                        (:mod:`~.persons_features`, the same extractor for every world)

as CUHK-PEDES writes it: one record per picture, ``id`` from 1 (train people first, then val,
then test), ``file_path`` relative to ``DIR/imgs/`` (the folder is not the split),
``processed_tokens`` the lower-cased words of each caption (``re.findall("[a-z]+")``, so
``t-shirt`` is ``["t", "shirt"]`` and punctuation is dropped; the released file's exact
tokeniser is not published). A seed and the sizes give byte-identical files: streams are keyed
by the seed, the purpose and the person.

With the defaults (200 / 50 / 50 people, 4 pictures each, 2 captions per picture, 96 x 32
JPEGs; about a second to write), an attribute oracle that ranks first the test people agreeing
with everything a caption states finds a single candidate for about three test captions in
four (``tests/test_synth_persons.py``): the rest fit two or more people, so text-to-image R@1
is not saturated even by a perfect attribute reader.
"""

from __future__ import annotations

import io
import json
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from .._files import atomic_write_text, check_output_dir
from .io import UNFINISHED_FILE, _world_writes, finish_world, is_unfinished
from .language import COLOURS
from .persons_features import (
    caption_style,
    check_domain,
    domain_lighting,
    feature_space,
    region_features,
)
from .persons_language import FIELDS, GROUPS, VOCABULARY, make_caption, processed_tokens
from .persons_render import Pose, render_person, sample_pose

#: The annotation file (CUHK-PEDES's name) and the image folder it is relative to.
ANNOTATION_FILE = "reid_raw.json"
IMAGE_FOLDER = "imgs"
#: The side file describing the generation.
WORLD_FILE = "world.json"
#: The folder of the precomputed features (``--features``): ``{split}_ims.npy``.
FEATURES_FOLDER = "features"
#: The sub-folder of ``imgs/`` holding the pictures (CUHK-PEDES mixes source folders, none
#: of them the split).
PICTURE_FOLDER = "persons"
SPLITS = ("train", "val", "test")
IMAGE_FORMATS = ("jpg", "png")
JPEG_QUALITY = 90
#: Defaults of :func:`write_persons` (``vlret synth persons``).
DEFAULT_SIZES = {"train": 200, "val": 50, "test": 50}
DEFAULT_IMAGES_PER_ID = 4
DEFAULT_CAPTIONS_PER_IMAGE = 2
DEFAULT_HEIGHT, DEFAULT_WIDTH = 96, 32
DEFAULT_TWIN_RATE = 0.25

#: Colour indices (into :data:`~.language.COLOURS`) shoes, hats and bags are drawn from.
_SHOE_COLOURS = (0, 1, 4, 5, 8, 9)
_ACCESSORY_COLOURS = (0, 1, 2, 3, 4, 5, 8, 9)
_P_HAT, _P_BACKPACK, _P_HANDBAG = 0.3, 0.3, 0.25
_N_SKIN = 3
# Random-stream purposes (np.random.default_rng([seed, purpose, ...])).
_PEOPLE, _PICTURES, _FEATURES = 1, 2, 3


@dataclass
class PersonsWorld:
    """A generated world in memory: ``people[i]`` is the person of raw id ``i + 1`` (field ->
    value index, -1 for an absent hat or bag, plus ``skin``), ``split_of[i]`` its split,
    ``twin_of[i]`` the raw id it was copied from (or ``None``); ``pictures`` are
    ``(raw id, serial, pose, captions, mentions)`` in file order, ``mentions`` one dict per
    caption (field -> canonical value name stated)."""

    seed: int
    sizes: dict[str, int]
    images_per_id: int
    captions_per_image: int
    height: int
    width: int
    image_format: str
    twin_rate: float
    domain: int = 0
    people: list[dict[str, int]] = field(default_factory=list)
    split_of: list[str] = field(default_factory=list)
    twin_of: list[int | None] = field(default_factory=list)
    pictures: list[tuple[int, int, Pose, list[str], list[dict[str, str]]]] = field(
        default_factory=list
    )

    def file_path(self, raw_id: int, serial: int) -> str:
        """A picture's ``file_path`` (relative to ``imgs/``)."""
        return f"{PICTURE_FOLDER}/p{raw_id:05d}_s{serial:06d}.{self.image_format}"

    def named(self, raw_id: int) -> dict[str, str | None]:
        """The captioned attributes of person ``raw_id`` by canonical name (``None``: absent)."""
        person = self.people[raw_id - 1]
        return {f: (VOCABULARY[f][person[f]][0] if person[f] >= 0 else None) for f in FIELDS}


def _check_int(name: str, value: object, low: int, high: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int | np.integer):
        raise ValueError(f"{name} must be an integer, got {value!r}")
    if value < low or (high is not None and value > high):
        upper = f"..{high}" if high is not None else " or more"
        raise ValueError(f"{name} must be {low}{upper}, got {value}")
    return int(value)


def _sample_person(rng: np.random.Generator) -> dict[str, int]:
    bag = -1
    u = rng.random()
    if u < _P_BACKPACK:
        bag = 0
    elif u < _P_BACKPACK + _P_HANDBAG:
        bag = 1
    hat = int(rng.choice(_ACCESSORY_COLOURS)) if rng.random() < _P_HAT else -1
    return {
        "hair_length": int(rng.integers(2)),
        "hair_colour": int(rng.integers(len(VOCABULARY["hair_colour"]))),
        "upper_type": int(rng.integers(len(VOCABULARY["upper_type"]))),
        "upper_colour": int(rng.integers(len(COLOURS))),
        "lower_type": int(rng.choice(3, p=[0.6, 0.2, 0.2])),
        "lower_colour": int(rng.integers(len(COLOURS))),
        "shoes_colour": int(rng.choice(_SHOE_COLOURS)),
        "hat_colour": hat,
        "bag_type": bag,
        "bag_colour": int(rng.choice(_ACCESSORY_COLOURS)) if bag >= 0 else -1,
        "skin": int(rng.integers(_N_SKIN)),
    }


def _twin(rng: np.random.Generator, base: dict[str, int]) -> dict[str, int]:
    """``base`` with one or two captioned attributes resampled (a different value each)."""
    out = dict(base)
    fresh = _sample_person(rng)
    changes = rng.choice(["upper", "lower", "hair", "shoes", "hat", "bag"], 1 + rng.integers(2))
    for group in sorted(set(changes.tolist())):
        fields = GROUPS[group]
        pick = fields[int(rng.integers(len(fields)))] if group != "hat" else "hat_colour"
        if group == "bag" and (out["bag_type"] < 0 or fresh["bag_type"] < 0):
            pick = "bag"  # add, drop or swap the whole bag
        if pick == "bag":
            out["bag_type"], out["bag_colour"] = fresh["bag_type"], fresh["bag_colour"]
        else:
            out[pick] = fresh[pick]
    out["skin"] = fresh["skin"]
    return out


def _key(person: dict[str, int]) -> tuple[int, ...]:
    return tuple(person[f] for f in FIELDS)


def sample_people(
    seed: int, sizes: dict[str, int], twin_rate: float
) -> tuple[list[dict[str, int]], list[str], list[int | None]]:
    """The people of every split (train, val, test in order), no two alike in every captioned
    attribute; a near twin copies an earlier person of its own split."""
    rng = np.random.default_rng([int(seed), _PEOPLE])
    people: list[dict[str, int]] = []
    split_of: list[str] = []
    twin_of: list[int | None] = []
    seen: set[tuple[int, ...]] = set()
    for split in SPLITS:
        first = len(people)
        for _ in range(sizes[split]):
            for _attempt in range(1000):
                base = None
                if len(people) > first and rng.random() < twin_rate:
                    base = first + int(rng.integers(len(people) - first))
                person = _sample_person(rng) if base is None else _twin(rng, people[base])
                if _key(person) not in seen:
                    break
            else:  # pragma: no cover - the attribute space is far larger than any world
                raise ValueError("could not draw distinct people; lower the sizes")
            seen.add(_key(person))
            people.append(person)
            split_of.append(split)
            twin_of.append(None if base is None else base + 1)
    return people, split_of, twin_of


# ------------------------------------------------------------------------------ the world


def generate_persons(
    *,
    seed: int = 0,
    sizes: dict[str, int] | None = None,
    images_per_id: int = DEFAULT_IMAGES_PER_ID,
    captions_per_image: int = DEFAULT_CAPTIONS_PER_IMAGE,
    height: int = DEFAULT_HEIGHT,
    width: int = DEFAULT_WIDTH,
    image_format: str = "jpg",
    twin_rate: float = DEFAULT_TWIN_RATE,
    domain: int = 0,
) -> PersonsWorld:
    """The world in memory (nothing rendered): people, poses and captions.

    Args:
        seed: The world's seed.
        sizes: People per split, ``{"train": N, "val": N, "test": N}`` (default
            :data:`DEFAULT_SIZES`; a missing split takes its default; ``val`` may be 0, the
            others need 1 or more).
        images_per_id: Pictures per person (1 or more).
        captions_per_image: Captions per picture (1 or more; CUHK-PEDES has 2).
        height: Picture height in pixels (24 or more).
        width: Picture width in pixels (8 or more).
        image_format: ``jpg`` (quality 90) or ``png``.
        twin_rate: The chance that a person is a near twin of an earlier one of its split.
        domain: The camera network and annotators (:mod:`~.persons_features`): 0, the
            default, or another domain, whose captions prefer other words and whose pictures
            and features get the domain's cast.
    """
    seed = _check_int("seed", seed, 0)
    domain = check_domain(domain)
    unknown = sorted(set(sizes or {}) - set(SPLITS))
    if unknown:
        raise ValueError(f"sizes: unknown split {unknown[0]!r}; expected {', '.join(SPLITS)}")
    sizes = {s: (sizes or {}).get(s, DEFAULT_SIZES[s]) for s in SPLITS}
    for split in SPLITS:
        _check_int(f"{split} identities (--{split}-ids)", sizes[split], int(split != "val"))
    images_per_id = _check_int("images_per_id", images_per_id, 1)
    captions_per_image = _check_int("captions_per_image", captions_per_image, 1)
    height = _check_int("height", height, 24, 4096)
    width = _check_int("width", width, 8, 4096)
    if image_format not in IMAGE_FORMATS:
        raise ValueError(f"image_format must be one of {IMAGE_FORMATS}, got {image_format!r}")
    if not 0.0 <= float(twin_rate) < 1.0:
        raise ValueError(f"twin_rate must be in [0, 1), got {twin_rate}")
    world = PersonsWorld(
        seed, dict(sizes), images_per_id, captions_per_image, height, width, image_format,
        float(twin_rate), domain,
    )  # fmt: skip
    world.people, world.split_of, world.twin_of = sample_people(seed, sizes, twin_rate)
    style = caption_style(domain)
    serial = 0
    for raw_id, person in enumerate(world.people, start=1):
        rng = np.random.default_rng([seed, _PICTURES, raw_id])
        for _ in range(images_per_id):
            pose = domain_lighting(sample_pose(rng), domain)
            made = [make_caption(rng, person, style) for _ in range(captions_per_image)]
            world.pictures.append(
                (raw_id, serial, pose, [c for c, _ in made], [m for _, m in made])
            )
            serial += 1
    return world


def encode_picture(world: PersonsWorld, pixels: np.ndarray) -> bytes:
    """The file bytes of a rendered picture in the world's format."""
    from PIL import Image

    buf = io.BytesIO()
    image = Image.fromarray(pixels, "RGB")
    if world.image_format == "jpg":
        image.save(buf, format="JPEG", quality=JPEG_QUALITY)
    else:
        image.save(buf, format="PNG")
    return buf.getvalue()


def annotation_records(world: PersonsWorld) -> list[dict[str, Any]]:
    """The ``reid_raw.json`` list: one record per picture, keys in CUHK-PEDES's order."""
    return [
        {
            "split": world.split_of[raw_id - 1],
            "captions": captions,
            "file_path": world.file_path(raw_id, serial),
            "processed_tokens": [processed_tokens(c) for c in captions],
            "id": raw_id,
        }
        for raw_id, serial, _pose, captions, _mentions in world.pictures
    ]


def split_features(world: PersonsWorld, split: str) -> np.ndarray:
    """The precomputed region features of ``split``'s pictures in file order
    (:func:`~.persons_features.region_features`; ``(images, REGIONS, FEATURE_DIM)``)."""
    pictures = [
        (world.people[raw_id - 1], pose)
        for raw_id, _serial, pose, _captions, _mentions in world.pictures
        if world.split_of[raw_id - 1] == split
    ]
    rng = np.random.default_rng([world.seed, _FEATURES, SPLITS.index(split)])
    return region_features(feature_space(), pictures, domain=world.domain, rng=rng)


def split_counts(world: PersonsWorld) -> dict[str, dict[str, int]]:
    """People, pictures and captions per split (splits with people only)."""
    out: dict[str, dict[str, int]] = {}
    for split in SPLITS:
        n = world.sizes[split]
        if n:
            images = n * world.images_per_id
            out[split] = {
                "identities": n,
                "images": images,
                "captions": images * world.captions_per_image,
            }
    return out


def world_record(world: PersonsWorld, *, features: bool = False) -> dict[str, Any]:
    """What ``world.json`` holds: the generation's settings (``features``: whether
    ``features/`` was written) and vocabulary, each person's attributes and each picture's pose
    and per-caption mentions."""
    return {
        "generator": "vlret synth persons",
        "layout": "cuhk-pedes",
        "seed": world.seed,
        "sizes": dict(world.sizes),
        "images_per_id": world.images_per_id,
        "captions_per_image": world.captions_per_image,
        "image": {"height": world.height, "width": world.width, "format": world.image_format},
        "twin_rate": world.twin_rate,
        "domain": world.domain,
        "features": features,
        "splits": split_counts(world),
        "vocabulary": {f: [list(v) for v in values] for f, values in VOCABULARY.items()},
        "groups": {g: list(fs) for g, fs in GROUPS.items()},
        "identities": [
            {
                "id": raw_id,
                "split": world.split_of[raw_id - 1],
                "attributes": world.named(raw_id),
                "skin": world.people[raw_id - 1]["skin"],
                "twin_of": world.twin_of[raw_id - 1],
            }
            for raw_id in range(1, len(world.people) + 1)
        ],
        "images": [
            {
                "file_path": world.file_path(raw_id, serial),
                "id": raw_id,
                "pose": pose.to_json(),
                "mentions": mentions,
            }
            for raw_id, serial, pose, _captions, mentions in world.pictures
        ],
    }


def summary_line(world: PersonsWorld, root: str | Path) -> str:
    """The one line ``vlret synth persons`` prints: people, pictures and captions per split."""
    parts = [
        f"{split} {c['identities']} identities, {c['images']} images, {c['captions']} captions"
        for split, c in split_counts(world).items()
    ]
    domain = f", domain {world.domain}" if world.domain else ""
    return (
        f"{root}: synthetic persons world (CUHK-PEDES layout, seed {world.seed}{domain}, "
        f"{world.height}x{world.width} {world.image_format}): " + "; ".join(parts)
    )


def _check_persons_dir(root: Path, *, overwrite: bool) -> None:
    """Refuse a non-empty ``root`` (a persons world included) unless ``overwrite``; a world
    whose writing stopped half-way is replaced."""
    if overwrite or not root.is_dir() or is_unfinished(root) or not any(root.iterdir()):
        return
    if (root / WORLD_FILE).is_file():
        raise FileExistsError(
            f"{root} already holds a synthetic persons world; pass --overwrite to replace it"
        )
    raise FileExistsError(
        f"{root} is not empty and holds no {WORLD_FILE}; pass --overwrite to write into it anyway"
    )


def write_persons(
    out: str | Path,
    *,
    overwrite: bool = False,
    seed: int = 0,
    sizes: dict[str, int] | None = None,
    images_per_id: int = DEFAULT_IMAGES_PER_ID,
    captions_per_image: int = DEFAULT_CAPTIONS_PER_IMAGE,
    height: int = DEFAULT_HEIGHT,
    width: int = DEFAULT_WIDTH,
    image_format: str = "jpg",
    twin_rate: float = DEFAULT_TWIN_RATE,
    domain: int = 0,
    features: bool = False,
) -> PersonsWorld:
    """Generate a world (:func:`generate_persons`, same arguments) and write it into ``out``
    (the module's layout); returns the world. ``features`` also writes the precomputed region
    features, ``features/{split}_ims.npy`` (:func:`split_features`).

    Everything is checked before the first file: the arguments, Pillow, and the folder (a
    non-empty one is refused unless ``overwrite``; its earlier ``imgs/``, ``reid_raw.json``
    and ``world.json`` are then replaced). The folder is marked unfinished
    (``synthetic.unfinished``) until ``world.json``, the last file, is written, so a rerun
    replaces a world whose writing stopped half-way.
    """
    from .._extras import require

    world = generate_persons(
        seed=seed, sizes=sizes, images_per_id=images_per_id,
        captions_per_image=captions_per_image, height=height, width=width,
        image_format=image_format, twin_rate=twin_rate, domain=domain,
    )  # fmt: skip
    require("PIL", "rendering the persons world's pictures")
    root = check_output_dir(out, "--out")
    _check_persons_dir(root, overwrite=overwrite)
    with _world_writes(root):
        root.mkdir(parents=True, exist_ok=True)
        atomic_write_text(
            root / UNFINISHED_FILE,
            "vlret synth persons stopped before this world was whole; rerun it to replace "
            "the world (no --overwrite needed)\n",
        )
        (root / WORLD_FILE).unlink(missing_ok=True)
        (root / ANNOTATION_FILE).unlink(missing_ok=True)
        for folder_name in (IMAGE_FOLDER, FEATURES_FOLDER):
            if (root / folder_name).is_dir():
                shutil.rmtree(root / folder_name)
        folder = root / IMAGE_FOLDER / PICTURE_FOLDER
        folder.mkdir(parents=True)
        for raw_id, serial, pose, _captions, _mentions in world.pictures:
            pixels, _parts = render_person(
                world.people[raw_id - 1], pose, height=world.height, width=world.width
            )
            path = root / IMAGE_FOLDER / world.file_path(raw_id, serial)
            path.write_bytes(encode_picture(world, pixels))
        if features:
            (root / FEATURES_FOLDER).mkdir()
            for split in split_counts(world):
                np.save(root / FEATURES_FOLDER / f"{split}_ims.npy", split_features(world, split))
        atomic_write_text(root / ANNOTATION_FILE, json.dumps(annotation_records(world)))
        record = world_record(world, features=features)
        atomic_write_text(root / WORLD_FILE, json.dumps(record, indent=1) + "\n")
        finish_world(root)
    return world


__all__ = [
    "ANNOTATION_FILE",
    "DEFAULT_CAPTIONS_PER_IMAGE",
    "DEFAULT_HEIGHT",
    "DEFAULT_IMAGES_PER_ID",
    "DEFAULT_SIZES",
    "DEFAULT_TWIN_RATE",
    "DEFAULT_WIDTH",
    "FEATURES_FOLDER",
    "FIELDS",
    "GROUPS",
    "IMAGE_FOLDER",
    "IMAGE_FORMATS",
    "PICTURE_FOLDER",
    "SPLITS",
    "VOCABULARY",
    "WORLD_FILE",
    "PersonsWorld",
    "annotation_records",
    "encode_picture",
    "generate_persons",
    "make_caption",
    "processed_tokens",
    "sample_people",
    "split_counts",
    "split_features",
    "summary_line",
    "world_record",
    "write_persons",
]
