"""The synthetic person-search world (``vlret synth persons``): byte-identical reruns, the
CUHK-PEDES ``reid_raw.json`` schema checked by a parse written here, disjoint identities
across splits, pictures PIL reads at the declared size, captions that state the person's
attributes (against ``world.json``'s records), pictures of one person that differ while the
attribute-defined parts keep their colours, and the command line's output."""

from __future__ import annotations

import json
import re
from collections import Counter, defaultdict
from itertools import combinations
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("PIL")

from PIL import Image  # noqa: E402

from vlret.worlds.language import COLOURS  # noqa: E402
from vlret.worlds.persons import generate_persons, write_persons  # noqa: E402
from vlret.worlds.persons_render import PARTS, Pose, lit, render_person  # noqa: E402
from vlret.worlds.render import RGB  # noqa: E402

SIZES = {"train": 12, "val": 3, "test": 4}
PER_ID, K = 3, 2
H, W = 48, 16
KEYS = ["split", "captions", "file_path", "processed_tokens", "id"]
COLOUR_FIELDS = ("upper_colour", "lower_colour", "shoes_colour", "hat_colour", "bag_colour")


@pytest.fixture(scope="module")
def world_dir(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("persons") / "w"
    write_persons(
        root, seed=7, sizes=SIZES, images_per_id=PER_ID, height=H, width=W, image_format="png"
    )
    return root


def _load(root: Path) -> tuple[list, dict]:
    records = json.loads((root / "reid_raw.json").read_text(encoding="utf-8"))
    world = json.loads((root / "world.json").read_text(encoding="utf-8"))
    return records, world


def _files(root: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()
    }


def test_same_seed_gives_identical_bytes(tmp_path, world_dir):
    again = tmp_path / "again"
    write_persons(
        again, seed=7, sizes=SIZES, images_per_id=PER_ID, height=H, width=W, image_format="png"
    )
    first, second = _files(world_dir), _files(again)
    assert "reid_raw.json" in first and "world.json" in first
    assert sorted(first) == sorted(second)
    assert all(first[name] == second[name] for name in first)
    other = generate_persons(seed=8, sizes=SIZES, images_per_id=PER_ID, height=H, width=W)
    same = generate_persons(seed=7, sizes=SIZES, images_per_id=PER_ID, height=H, width=W)
    assert [p[3] for p in other.pictures] != [p[3] for p in same.pictures]
    # JPEG pictures are byte-identical too
    a, b = tmp_path / "ja", tmp_path / "jb"
    for root in (a, b):
        write_persons(root, seed=1, sizes={"train": 2, "val": 0, "test": 1}, images_per_id=2)
    assert _files(a) == _files(b)
    assert all(name.endswith(".jpg") for name in _files(a) if name.startswith("imgs/"))


def test_reid_raw_is_cuhk_pedes(world_dir):
    records, world = _load(world_dir)
    assert isinstance(records, list) and len(records) == sum(SIZES.values()) * PER_ID
    ids_of: dict[str, set[int]] = defaultdict(set)
    images_of: Counter = Counter()
    paths = set()
    for n, rec in enumerate(records):
        assert list(rec) == KEYS, f"record {n}"
        assert rec["split"] in ("train", "val", "test")
        assert isinstance(rec["id"], int) and not isinstance(rec["id"], bool)
        ids_of[rec["split"]].add(rec["id"])
        images_of[rec["id"]] += 1
        path = rec["file_path"]
        assert isinstance(path, str) and not path.startswith("/") and ".." not in path
        assert (world_dir / "imgs" / path).is_file()
        assert path not in paths
        paths.add(path)
        assert len(rec["captions"]) == K == len(rec["processed_tokens"])
        for caption, tokens in zip(rec["captions"], rec["processed_tokens"], strict=True):
            assert isinstance(caption, str) and caption.strip()
            # a naive tokeniser: lower case, every non-letter a separator
            words = "".join(ch if "a" <= ch <= "z" else " " for ch in caption.lower()).split()
            assert tokens == words
    # ids from 1, contiguous, train then val then test, every person with its pictures
    assert sorted(images_of) == list(range(1, sum(SIZES.values()) + 1))
    assert set(images_of.values()) == {PER_ID}
    assert {s: len(ids) for s, ids in ids_of.items()} == SIZES
    assert max(ids_of["train"]) < min(ids_of["val"]) <= max(ids_of["val"]) < min(ids_of["test"])
    for a, b in combinations(ids_of.values(), 2):
        assert not a & b
    assert world["splits"] == {
        s: {"identities": n, "images": n * PER_ID, "captions": n * PER_ID * K}
        for s, n in SIZES.items()
    }


def test_pictures_have_the_declared_size(world_dir):
    records, world = _load(world_dir)
    assert world["image"] == {"height": H, "width": W, "format": "png"}
    for rec in records:
        with Image.open(world_dir / "imgs" / rec["file_path"]) as im:
            assert im.format == "PNG" and im.mode == "RGB" and im.size == (W, H)


def _colour_words(world: dict) -> dict[str, set[str]]:
    """Colour word -> the canonical colours it may name (hair colours included)."""
    out: dict[str, set[str]] = defaultdict(set)
    for f in (*COLOUR_FIELDS, "hair_colour"):
        for canonical, *words in world["vocabulary"][f]:
            for word in words:
                out[word].add(canonical)
    return out


def test_captions_state_the_persons_attributes(world_dir):
    records, world = _load(world_dir)
    people = {p["id"]: p["attributes"] for p in world["identities"]}
    vocab = world["vocabulary"]
    colour_words = _colour_words(world)
    by_path = {img["file_path"]: img for img in world["images"]}
    group_counts = []
    for rec in records:
        attrs = people[rec["id"]]
        mentions = by_path[rec["file_path"]]["mentions"]
        assert by_path[rec["file_path"]]["id"] == rec["id"] and len(mentions) == K
        own_colours = {attrs[f] for f in (*COLOUR_FIELDS, "hair_colour") if attrs[f] is not None}
        for caption, stated in zip(rec["captions"], mentions, strict=True):
            text = caption.lower()
            assert stated, caption
            for f, value in stated.items():
                assert attrs[f] == value, (caption, f)
                synonyms = next(v[1:] for v in vocab[f] if v[0] == value)
                assert any(re.search(rf"\b{re.escape(w)}\b", text) for w in synonyms), (caption, f)
            # every colour word of the caption is one of the person's colours
            for word, names in colour_words.items():
                if re.search(rf"\b{re.escape(word)}\b", text):
                    assert names & own_colours, (caption, word)
            groups = {g for g, fs in world["groups"].items() if any(f in stated for f in fs)}
            group_counts.append(len(groups))
    # some captions mention only part of the attributes, others most of them
    assert min(group_counts) <= 2 and max(group_counts) >= 4


def test_people_share_attributes_but_never_all(world_dir):
    _records, world = _load(world_dir)
    people = [tuple(sorted(p["attributes"].items())) for p in world["identities"]]
    assert len(set(people)) == len(people)
    shared = [len(set(a) & set(b)) for a, b in combinations(people, 2)]
    assert max(shared) >= len(people[0]) - 2  # near twins: one or two attributes apart
    twins = [p for p in world["identities"] if p["twin_of"] is not None]
    assert twins and all(
        world["identities"][p["twin_of"] - 1]["split"] == p["split"] for p in twins
    )
    world_big = generate_persons(seed=0)  # the default world: 200 / 50 / 50 people x 4
    assert {s: c["identities"] for s, c in _counts(world_big).items()} == {
        "train": 200,
        "val": 50,
        "test": 50,
    }
    keys = {tuple(world_big.named(i).values()) for i in range(1, 301)}
    assert len(keys) == 300
    # not trivial: an attribute oracle (the people whose attributes agree with everything a
    # caption states) finds its own person always, but a share of test captions fit several
    test_ids = [i for i in range(1, 301) if world_big.split_of[i - 1] == "test"]
    fits = []
    for raw_id, _serial, _pose, _captions, mentions in world_big.pictures:
        if world_big.split_of[raw_id - 1] != "test":
            continue
        for stated in mentions:
            ok = [j for j in test_ids if all(world_big.named(j)[f] == v for f, v in stated.items())]
            assert raw_id in ok
            fits.append(len(ok))
    assert len(fits) == 50 * 4 * 2
    assert 0.1 < np.mean(np.array(fits) > 1) < 0.5


def _counts(world) -> dict:
    from vlret.worlds.persons import split_counts

    return split_counts(world)


def test_pictures_of_one_person_differ_but_keep_its_colours(world_dir):
    records, world = _load(world_dir)
    person_id = 1
    pictures = [img for img in world["images"] if img["id"] == person_id]
    assert len(pictures) == PER_ID
    attrs = world["identities"][0]["attributes"]
    gen = generate_persons(seed=7, sizes=SIZES, images_per_id=PER_ID, height=H, width=W)
    person = gen.people[0]
    arrays, maps = [], []
    for img in pictures:
        pose_record = dict(img["pose"])
        pose_record["view"] = ("front", "back", "side").index(pose_record["view"])
        pose_record["tint"] = tuple(pose_record["tint"])
        pose = Pose(**pose_record)
        with Image.open(world_dir / "imgs" / img["file_path"]) as im:
            pixels = np.asarray(im.convert("RGB"), dtype=np.float64)
        _, parts = render_person(person, pose, height=H, width=W)
        arrays.append(pixels)
        maps.append(parts)
        for part, f in (
            ("upper", "upper_colour"),
            ("lower", "lower_colour"),
            ("shoes", "shoes_colour"),
        ):
            mask = parts == PARTS.index(part)
            assert mask.sum() >= 4, (img["file_path"], part)
            colour = RGB[[c[0] for c in COLOURS].index(attrs[f])]
            want = lit(colour, pose)
            got = np.median(pixels[mask], axis=0)
            # flat parts plus N(0, 3) noise, rounded: the median is within 3 of the lit colour
            assert np.abs(got - want).max() <= 3.0, (img["file_path"], part, got, want)
    for a, b in combinations(range(PER_ID), 2):
        assert np.abs(arrays[a] - arrays[b]).mean() > 5.0
        assert (maps[a] != maps[b]).any()


def test_bad_arguments_are_one_line(tmp_path):
    for kwargs, what in (
        ({"sizes": {"train": 0}}, "train identities (--train-ids) must be 1 or more, got 0"),
        ({"sizes": {"dev": 3}}, "unknown split 'dev'"),
        ({"images_per_id": 0}, "images_per_id must be 1 or more"),
        ({"image_format": "gif"}, "image_format must be one of"),
        ({"height": 10}, "height must be 24..4096, got 10"),
    ):
        with pytest.raises(ValueError, match=re.escape(what)):
            write_persons(tmp_path / "bad", **kwargs)
    assert not (tmp_path / "bad").exists()


def test_cli_writes_and_prints_its_summary_line(tmp_path, capsys):
    from vlret.cli import main

    out = tmp_path / "cli"
    argv = ["synth", "persons", "--out", str(out), "--seed", "5", "--train-ids", "4"]
    argv += ["--val-ids", "0", "--test-ids", "2", "--images-per-id", "2"]
    argv += ["--image-size", "48x16", "--image-format", "png"]
    assert main(argv) == 0
    captured = capsys.readouterr()
    assert captured.out == (
        f"{out}: synthetic persons world (CUHK-PEDES layout, seed 5, 48x16 png): "
        "train 4 identities, 8 images, 16 captions; test 2 identities, 4 images, 8 captions\n"
    )
    records = json.loads((out / "reid_raw.json").read_text(encoding="utf-8"))
    assert Counter(r["split"] for r in records) == {"train": 8, "test": 4}
    assert not (out / "synthetic.unfinished").exists()
    # a second run is refused, --overwrite replaces the world
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("vlret synth: ") and "--overwrite" in err and err.count("\n") == 1
    assert main([*argv[:7], "6", *argv[8:], "--overwrite"]) == 0
    capsys.readouterr()
    assert len(json.loads((out / "reid_raw.json").read_text(encoding="utf-8"))) == 2 * 6 + 4
    assert len(list((out / "imgs").rglob("*.png"))) == 2 * 6 + 4
    for bad, what in (
        (["persons", "--webdataset"], "--webdataset: not an option of the persons world"),
        (["persons", "--image-size", "96"], "--image-size 96: expected HEIGHTxWIDTH"),
        (["tiny", "--train-ids", "3"], "--train-ids: an option of `vlret synth persons` only"),
    ):
        fresh = tmp_path / "fresh"
        assert main(["synth", bad[0], "--out", str(fresh), *bad[1:]]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"vlret synth: {what}") and err.count("\n") == 1
        assert not fresh.exists()
