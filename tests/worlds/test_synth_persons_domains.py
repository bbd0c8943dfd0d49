"""The persons world's precomputed features and domains (``vlret synth persons --features
--domain N``): region concepts against a sum written here, the shared extractor (two domains
differ by the camera offset alone), the domain's colour cast and caption style, the feature
files in each split's file order, and domain generalisation end to end: a checkpoint trained
on one domain's features, evaluated by ``vlret eval`` on another world's folder, against a
naive identity-level ranking of that world's own features."""

from __future__ import annotations

import json
from collections import Counter

import numpy as np
import pytest

pytest.importorskip("PIL")

from vlret.worlds.persons import (  # noqa: E402
    generate_persons,
    split_features,
    write_persons,
)
from vlret.worlds.persons_features import (  # noqa: E402
    FEATURE_DIM,
    REGIONS,
    camera_offset,
    domain_lighting,
    feature_space,
    picture_concepts,
)
from vlret.worlds.persons_language import OTHER_STYLE, processed_tokens  # noqa: E402
from vlret.worlds.persons_render import sample_pose  # noqa: E402

SIZES = {"train": 10, "val": 3, "test": 4}
H, W = 48, 16


def _nuisance(space, pose, camera) -> np.ndarray:
    """The view, lighting and camera concepts every region of the picture carries."""
    t, o = space.table, space.offsets
    return 0.4 * t[o["view"] + pose.view] + camera + 0.8 * (pose.gain - 1.0) * t[o["light"]]


def _expected_part_rows(space, person, pose, camera) -> list[np.ndarray]:
    """Each visible part's concept sum, written out field by field."""
    t, o = space.table, space.offsets
    parts = [
        [("hair_length", "hair_length"), ("hair_colour", "hair_colour")],
        [("hat_colour", "colour")],
        [("upper_type", "upper_type"), ("upper_colour", "colour")],
        [("lower_type", "lower_type"), ("lower_colour", "colour")],
        [("shoes_colour", "colour")],
        [("bag_type", "bag_type"), ("bag_colour", "colour")],
    ]
    rows = []
    for k, fields in enumerate(parts):
        if any(person[f] < 0 for f, _ in fields):  # no hat, no bag
            continue
        x = t[o["part"] + k] + _nuisance(space, pose, camera)
        for f, block in fields:
            x = x + t[o[block] + person[f]]
        rows.append(x)
    return rows


def test_region_concepts_are_the_parts_and_the_background():
    world = generate_persons(seed=3, sizes=SIZES, height=H, width=W)
    space = feature_space()
    backgrounds = space.table[space.offsets["background"] : space.offsets["light"]]
    zero = np.zeros(32)
    for raw_id, _serial, pose, _caps, _mentions in world.pictures[:12]:
        person = world.people[raw_id - 1]
        got = picture_concepts(space, person, pose, zero, np.random.default_rng(0))
        assert got.shape == (REGIONS, 32)
        unmatched = list(range(REGIONS))
        for row in _expected_part_rows(space, person, pose, zero):  # one region each
            hit = [i for i in unmatched if np.allclose(got[i], row, rtol=0, atol=1e-12)]
            assert len(hit) == 1
            unmatched.remove(hit[0])
        assert len(unmatched) >= 2  # at most 6 parts
        for i in unmatched:  # the rest: a background concept plus the nuisance
            rest = got[i] - _nuisance(space, pose, zero)
            assert np.abs(backgrounds - rest).max(axis=1).min() < 1e-12


def test_domains_share_the_extractor_and_differ_by_the_camera():
    world = generate_persons(seed=1, sizes=SIZES, height=H, width=W)
    raw_id, _serial, pose, _caps, _mentions = world.pictures[5]
    person = world.people[raw_id - 1]
    space = feature_space()
    assert np.array_equal(space.table, feature_space().table)  # not keyed by the world
    assert np.array_equal(camera_offset(0), np.zeros(32))
    one, two = camera_offset(1), camera_offset(2)
    assert np.linalg.norm(one) > 0.1 and not np.allclose(one, two)
    base = picture_concepts(space, person, pose, camera_offset(0), np.random.default_rng(9))
    moved = picture_concepts(space, person, pose, one, np.random.default_rng(9))
    np.testing.assert_allclose(moved - base, np.broadcast_to(one, base.shape), atol=1e-12)


def test_a_domains_colour_cast_is_the_same_for_every_picture():
    rng = np.random.default_rng(4)
    poses = [sample_pose(rng) for _ in range(5)]
    assert all(domain_lighting(p, 0) is p for p in poses)
    shifts = {
        tuple(round(a - b, 1) for a, b in zip(domain_lighting(p, 1).tint, p.tint, strict=True))
        for p in poses
    }
    assert len(shifts) == 1 and max(abs(s) for s in next(iter(shifts))) > 0
    factors = [domain_lighting(p, 1).gain / p.gain for p in poses]
    assert max(factors) - min(factors) < 1e-3 and 0.85 <= factors[0] <= 0.95
    assert domain_lighting(poses[0], 2).tint != domain_lighting(poses[0], 1).tint
    with pytest.raises(ValueError, match="domain must be an integer >= 0, got -1"):
        domain_lighting(poses[0], -1)


def test_another_domains_annotators_prefer_other_words():
    sizes = {"train": 150, "val": 0, "test": 1}
    words = {}
    for domain in (0, 1):
        world = generate_persons(seed=2, sizes=sizes, domain=domain)
        captions = [c for *_, caps, _m in world.pictures for c in caps]
        subjects = [s[0].upper() + s[1:] for s in OTHER_STYLE.subjects]
        opened = [any(c.startswith(s + " ") for s in subjects) for c in captions]
        assert all(opened) if domain else not any(opened)
        words[domain] = Counter(w for c in captions for w in processed_tokens(c))
    # weights (0, 0.25, 0.75) on a value's last three synonyms: blond reads blond / blonde /
    # fair, so the other annotators never write "blond" and mostly write "fair"
    assert words[1]["blond"] == 0 and words[1]["fair"] > 2 * words[1]["blonde"] > 0
    assert words[0]["blond"] > 0


def test_feature_files_follow_each_splits_file_order(tmp_path):
    root = tmp_path / "w"
    world = write_persons(
        root, seed=5, sizes=SIZES, images_per_id=2, height=H, width=W, domain=1, features=True
    )
    records = json.loads((root / "reid_raw.json").read_text(encoding="utf-8"))
    record = json.loads((root / "world.json").read_text(encoding="utf-8"))
    assert (record["domain"], record["features"]) == (1, True)
    for split in ("train", "val", "test"):
        array = np.load(root / "features" / f"{split}_ims.npy")
        n = sum(r["split"] == split for r in records)
        assert array.shape == (n, REGIONS, FEATURE_DIM) and array.dtype == np.float32
        np.testing.assert_array_equal(array, split_features(world, split))
    # pictures of one person are nearer each other than other people's (max-pooled features)
    test = np.load(root / "features" / "train_ims.npy").max(axis=1)
    ids = np.array([r["id"] for r in records if r["split"] == "train"])
    test = test / np.linalg.norm(test, axis=1, keepdims=True)
    sim = test @ test.T
    np.fill_diagonal(sim, -np.inf)
    assert (ids[sim.argmax(axis=1)] == ids).mean() > 0.5  # chance: 1 / 19
    # without --features no folder; a rewrite without it removes the old one
    write_persons(root, seed=5, sizes=SIZES, images_per_id=2, height=H, width=W, overwrite=True)
    assert not (root / "features").exists()


def test_cli_domain_and_features(tmp_path, capsys):
    from vlret.cli import main

    out = tmp_path / "cli"
    argv = ["synth", "persons", "--out", str(out), "--train-ids", "3", "--val-ids", "0"]
    argv += ["--test-ids", "2", "--image-size", "48x16", "--domain", "2", "--features"]
    assert main(argv) == 0
    assert "seed 0, domain 2, 48x16 jpg" in capsys.readouterr().out
    assert sorted(p.name for p in (out / "features").iterdir()) == ["test_ims.npy", "train_ims.npy"]
    for bad, what in (
        (["persons", "--domain", "-1"], "domain must be an integer >= 0, got -1"),
        (["tiny", "--features"], "--features: an option of `vlret synth persons` only"),
    ):
        fresh = tmp_path / "fresh"
        assert main(["synth", bad[0], "--out", str(fresh), *bad[1:]]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"vlret synth: {what}") and err.count("\n") == 1
        assert not fresh.exists()


def test_a_checkpoint_of_one_domain_evaluates_on_another_worlds_features(tmp_path, capsys):
    import torch

    from vlret.cli import main
    from vlret.run.builders import load_trained_model

    source, target = tmp_path / "source", tmp_path / "target"
    write_persons(source, seed=1, sizes=SIZES, height=H, width=W, domain=1, features=True)
    write_persons(target, seed=2, sizes=SIZES, height=H, width=W, features=True)
    out = tmp_path / "run"
    config = tmp_path / "dg.toml"
    config.write_text(
        f'output_dir = "{out}"\n[data]\nroot = "{source}"\nformat = "cuhk-pedes"\n'
        f'features_dir = "{source / "features"}"\nmin_count = 1\n'
        '[model]\nembed_dim = 16\nimage = { kind = "precomp", in_dim = 64, pooling = "max" }\n'
        'text = { kind = "gru", word_dim = 8 }\n[loss]\nname = "cmpm"\n'
        "[train]\nepochs = 1\nbatch_size = 16\nprogress = false\n"
    )
    assert main(["train", str(config)]) == 0
    ckpt, record = out / "best.pt", tmp_path / "dg.json"
    cmd = ["eval", str(ckpt), "--data", str(target), "--split", "test", "--protocol", "cuhk-pedes"]
    assert main([*cmd, "--json", str(record), "--no-progress"]) == 0
    got = json.loads(record.read_text())["metrics"]
    # the oracle: the target world's own test features and captions through the model
    model, _, vocab = load_trained_model(ckpt)
    model.eval()
    entries = [
        e for e in json.loads((target / "reid_raw.json").read_text()) if e["split"] == "test"
    ]
    feats = torch.from_numpy(np.load(target / "features" / "test_ims.npy"))
    caps = [vocab.encode(c) for e in entries for c in e["captions"]]
    q_ids = [e["id"] for e in entries for _ in e["captions"]]
    ids = torch.zeros(len(caps), max(map(len, caps)), dtype=torch.long)
    for i, c in enumerate(caps):
        ids[i, : len(c)] = torch.tensor(c)
    with torch.no_grad():
        img = torch.nn.functional.normalize(model.image_encoder(feats).double(), dim=1)
        lengths = torch.tensor([len(c) for c in caps])
        txt = torch.nn.functional.normalize(model.text_encoder(ids, lengths).double(), dim=1)
    sim = (txt @ img.T).numpy()
    g_ids = np.array([e["id"] for e in entries])
    r1 = [float(g_ids[row.argmax()] == q) for row, q in zip(sim, q_ids, strict=True)]
    assert got["identity_t2i_r1"] == pytest.approx(100 * np.mean(r1), abs=1e-6)
    # the target's own feature folder is read: without it the evaluation names it
    (target / "features" / "test_ims.npy").unlink()
    capsys.readouterr()
    assert main([*cmd, "--no-progress"]) != 0
    assert str(target / "features" / "test_ims.npy") in capsys.readouterr().err
