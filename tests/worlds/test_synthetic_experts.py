"""The multi-expert synthetic video world (``vlret synth video-experts``, issue 16): each expert
carries its own part of a scene (exactly, and measurably by a linear probe), audio is missing
for about half the videos, a seed fixes the world, and the written layout reads back through
the MSR-VTT loader.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from vlret.worlds import generate_world, get_preset, load_synthetic, write_synthetic
from vlret.worlds.config import rng_stream
from vlret.worlds.hint import train_hint_lines, train_overrides
from vlret.worlds.scenes import sample_scene
from vlret.worlds.video_experts import (
    EXPERTS,
    PARTIAL_EXPERT,
    expert_dims,
    expert_features,
    expert_frames,
    make_expert_spaces,
)

SMALL = {"train": 24, "dev": 6, "test": 10}
FIELDS = ("category", "count", "colour", "size", "material", "cell")
N_VALUES = {"category": 20, "count": 3, "colour": 10, "size": 3, "material": 5, "cell": 9}
#: Which primary-object fields each expert depends on, and whether it sees the secondaries.
DEPENDS = {
    "appearance": ({"category", "colour"}, False),
    "motion": ({"count", "size", "cell"}, False),
    "audio": ({"category", "material"}, False),
    "scene": (set(), True),
}


def _scenes(n: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    out = np.full((n, 4, 6), -1, dtype=np.int64)
    for i in range(n):
        for k, obj in enumerate(sample_scene(rng)):
            out[i, k] = obj
    return out


def _experts(scenes: np.ndarray, *, seed: int = 0, **overrides):
    config = get_preset("video-experts", **overrides)
    spaces = make_expert_spaces(config, seed=seed)
    return expert_features(spaces, scenes, config, rng_stream(seed, 0, 3), rng_stream(seed, 0, 5))


def test_preset_sizes_and_settings():
    config = get_preset("video-experts")
    assert config.splits == {"train": 3000, "dev": 300, "test": 1000}
    assert config.captions_per_image == 20 and config.n_1ka == 1000
    assert config.multi_expert and config.audio_rate == 0.5 and config.dataset == "msrvtt"
    steps = config.splits["train"] * config.captions_per_image // 128  # caption-video pairs
    assert 200 <= steps <= 800  # a few hundred steps per epoch at batch 128
    with pytest.raises(ValueError, match="audio_rate"):
        get_preset("video-experts", audio_rate=1.5)


def test_same_seed_same_world_and_splits_independent():
    a = generate_world("video-experts", seed=3, splits=SMALL)
    b = generate_world("video-experts", seed=3, splits=SMALL)
    c = generate_world("video-experts", seed=4, splits=SMALL)
    d = generate_world("video-experts", seed=3, splits={**SMALL, "train": 40})
    for split in SMALL:
        assert a[split].features is None and a[split].tokens == b[split].tokens
        for name in EXPERTS:
            fa, fb = a[split].experts.features[name], b[split].experts.features[name]
            assert fa.dtype == np.float32 and np.array_equal(fa, fb)
            assert np.array_equal(a[split].experts.present[name], b[split].experts.present[name])
            assert not np.array_equal(fa, c[split].experts.features[name])
    for name in EXPERTS:  # the test split does not depend on the train split's size
        assert np.array_equal(a["test"].experts.features[name], d["test"].experts.features[name])


def test_shapes_padding_and_missing_audio():
    n = 4000
    config = get_preset("video-experts")
    ex = _experts(_scenes(n, 0))
    spans = expert_frames(config)
    assert ex.names == tuple(EXPERTS)
    for name, (kind, dim) in EXPERTS.items():
        feats, present, frames = ex.features[name], ex.present[name], ex.frames[name]
        assert feats.shape == ((n, spans[name][1], dim) if kind == "temporal" else (n, dim))
        assert not feats[~present].any()  # absent rows are all zero
        assert (frames[~present] == 0).all()
        if kind == "pooled":
            assert (frames[present] == 1).all()
            continue
        lo, hi = spans[name]
        assert frames[present].min() == lo and frames[present].max() == hi
        real = np.arange(hi)[None, :] < frames[:, None]
        assert not feats[~real].any()  # zero padding after the real frames
        assert (np.abs(feats[real]).sum(-1) > 0).all()  # every real frame carries signal
    for name in EXPERTS:
        assert ex.present[name].all() == (name != PARTIAL_EXPERT)
    # the partial expert: Binomial(n, 0.5) present, within 5 standard deviations
    rate = ex.present[PARTIAL_EXPERT].mean()
    assert abs(rate - 0.5) < 5 * np.sqrt(0.25 / n)
    rate_02 = _experts(_scenes(n, 0), audio_rate=0.2).present[PARTIAL_EXPERT].mean()
    assert abs(rate_02 - 0.2) < 5 * np.sqrt(0.2 * 0.8 / n)
    entries = ex.entries("audio")
    assert [e is not None for e in entries] == ex.present["audio"].tolist()
    i = int(np.flatnonzero(ex.present["audio"])[0])
    assert entries[i].shape == (ex.frames["audio"][i], 24)


@pytest.mark.parametrize("field", FIELDS)
def test_each_expert_depends_on_its_part_only(field):
    # Exact: the random draws do not depend on the content, so changing one field of the
    # primary object changes exactly the experts that carry it, and nothing else.
    scenes = _scenes(300, 1)
    base = _experts(scenes)
    col = FIELDS.index(field)
    edited = scenes.copy()
    shift = 1 if field != "count" else 0
    edited[:, 0, col] = (scenes[:, 0, col] - shift + 1) % N_VALUES[field] + shift
    if field in ("category", "cell"):  # keep categories / cells distinct within a scene
        clash = (edited[:, 1:, col] == edited[:, :1, col]).any(1)
        edited[clash] = scenes[clash]
        assert (~clash).sum() > 100
    other = _experts(edited)
    for name, (fields, _) in DEPENDS.items():
        same = np.array_equal(base.features[name], other.features[name])
        assert same == (field not in fields), (name, field)


def test_only_scene_sees_the_secondary_objects():
    scenes = _scenes(300, 2)
    edited = scenes.copy()
    has = edited[:, 1, 0] >= 0
    edited[has, 1, 2] = (edited[has, 1, 2] + 1) % 10  # colour of the first secondary
    edited[has, 1, 4] = (edited[has, 1, 4] + 1) % 5  # and its material
    base, other = _experts(scenes), _experts(edited)
    for name, (_, sees_secondary) in DEPENDS.items():
        assert np.array_equal(base.features[name], other.features[name]) != sees_secondary
    changed = np.abs(base.features["scene"] - other.features["scene"]).sum(1) > 0
    assert np.array_equal(changed, has)  # exactly the videos whose secondary changed


def _pooled(ex, name):
    x = ex.features[name]
    if x.ndim == 3:
        x = x.sum(1) / np.maximum(ex.frames[name], 1)[:, None]
    return x.astype(np.float64)


def _probe(x_tr, y_tr, x_te):
    """Ridge regression (float64) from features to targets; predictions on ``x_te``."""
    a = np.c_[x_tr, np.ones(len(x_tr))]
    w = np.linalg.solve(a.T @ a + 1e-2 * np.eye(a.shape[1]), a.T @ y_tr)
    return np.c_[x_te, np.ones(len(x_te))] @ w


def _onehot(values, n):
    return np.eye(n)[values]


def test_linear_probe_finds_each_part_where_it_should_be():
    tr_scenes, te_scenes = _scenes(3000, 10), _scenes(1000, 11)
    tr = _experts(tr_scenes, seed=0)
    te = expert_features(  # the same spaces; other scenes and noise draws
        make_expert_spaces(get_preset("video-experts"), seed=0),
        te_scenes,
        get_preset("video-experts"),
        rng_stream(0, 1, 3),
        rng_stream(0, 1, 5),
    )
    acc = {}
    for name in EXPERTS:
        m_tr, m_te = tr.present[name], te.present[name]
        x_tr, x_te = _pooled(tr, name)[m_tr], _pooled(te, name)[m_te]
        for field in FIELDS:
            col, n = FIELDS.index(field), N_VALUES[field]
            off = 1 if field == "count" else 0
            pred = _probe(x_tr, _onehot(tr_scenes[m_tr, 0, col] - off, n), x_te).argmax(1)
            acc[name, field] = (pred == te_scenes[m_te, 0, col] - off).mean()
        # secondary categories: is the probe's top category one of the video's secondaries?
        sec_tr = np.zeros((len(tr_scenes), 20))
        sec_te = np.zeros((len(te_scenes), 20))
        for k in (1, 2, 3):
            for sec, sc in ((sec_tr, tr_scenes), (sec_te, te_scenes)):
                rows = np.flatnonzero(sc[:, k, 0] >= 0)
                sec[rows, sc[rows, k, 0]] = 1
        top = _probe(x_tr, sec_tr[m_tr], x_te).argmax(1)
        has = sec_te[m_te].sum(1) > 0
        acc[name, "secondary"] = sec_te[m_te][np.arange(len(top)), top][has].mean()
    # chance levels: category 0.05, colour 0.1, material 0.2, cell 0.11; a secondary's
    # category among ~1.7 of 20: ~0.09
    for name in EXPERTS:
        fields, sees_secondary = DEPENDS[name]
        for field in ("category", "colour", "material", "cell"):
            if field in fields:
                assert acc[name, field] > 0.85, (name, field, acc[name, field])
            else:
                assert acc[name, field] < 0.3 + (field == "material") * 0.05, (name, field)
        if sees_secondary:
            assert acc[name, "secondary"] > 0.45, acc[name, "secondary"]
        else:
            assert acc[name, "secondary"] < 0.15, (name, acc[name, "secondary"])
    assert acc["scene", "category"] < 0.1  # the primary is invisible to scene
    assert acc["motion", "count"] > 0.9 and acc["motion", "size"] > 0.9


def test_write_defaults_to_msrvtt_and_refuses_other_formats(tmp_path):
    with pytest.raises(ValueError, match="msrvtt format only"):
        write_synthetic("video-experts", tmp_path / "p", format="precomp", splits=SMALL)
    root = write_synthetic("video-experts", tmp_path / "d", splits=SMALL, n_1ka=5)
    meta = json.loads((root / "synthetic.json").read_text())
    assert meta["format"] == "msrvtt" and meta["config"]["multi_expert"]
    assert meta["splits"]["test"]["experts"]["audio"]["present"] <= SMALL["test"]
    for name in ("MSRVTT_data.json", "MSRVTT_train.9k.csv", "MSRVTT_JSFUSION_test.csv"):
        assert (root / name).is_file()
    assert (root / "experts.json").is_file() and not (root / "video_feats.npy").exists()
    # the side files as for the other worlds: facts relevance of the test split
    ann = load_synthetic(root, "test")
    assert ann.relevance().shape == (20 * SMALL["test"], SMALL["test"])


def test_written_layout_reads_back(tmp_path):
    from vlret.data.formats.experts.features import ExpertFeatures

    root = write_synthetic("video-experts", tmp_path / "d", splits=SMALL, n_1ka=5, seed=2)
    world = generate_world("video-experts", splits=SMALL, n_1ka=5, seed=2)
    feats = ExpertFeatures(root)
    assert feats.names == tuple(EXPERTS)
    assert {s.name: s.dim for s in feats.specs} == expert_dims()
    feats.check_dims(expert_dims())
    row = 0
    for name, n in SMALL.items():
        ex = world[name].experts
        assert feats.rows_for([f"video{row}", f"video{row + n - 1}"]) == [row, row + n - 1]
        for i in range(n):
            sample = feats.sample(row + i)
            assert sample.names == tuple(EXPERTS)
            assert sample.present.tolist() == [bool(ex.present[e][i]) for e in EXPERTS]
            assert sample.frames.tolist() == [int(ex.frames[e][i]) for e in EXPERTS]
            for e in EXPERTS:  # the file may pad to fewer frames than the world's most
                got, want = sample.features[e], torch.from_numpy(ex.features[e][i])
                assert torch.equal(got, want[: len(got)]) and not want[len(got) :].any()
        row += n
    # the train hint: msrvtt data, every expert, and the CE / MMT experts table
    hint = json.loads((root / "synthetic.json").read_text())["train_config_hint"]
    assert hint["data"]["format"] == "msrvtt" and hint["data"]["experts"] == "all"
    assert hint["experts"] == expert_dims()
    from vlret.run.config_files import parse_value

    sets = dict(item.split("=", 1) for item in train_overrides({"train_config_hint": hint}))
    assert parse_value(sets["model.experts"]) == expert_dims()
    assert list(parse_value(sets["model.experts"])) == list(EXPERTS)  # the model's order
    assert parse_value(sets["data.experts"]) == "all"
    assert "model.image.in_dim" not in sets
    lines = train_hint_lines(root)
    assert "--set data.experts=all" in lines[0] and "model.experts=" in lines[0]
    # rewriting with --overwrite as the frame-feature video world leaves no experts.json
    write_synthetic("video", root, format="msrvtt", splits=SMALL, n_1ka=5, overwrite=True)
    assert not (root / "experts.json").exists() and (root / "video_feats.npy").is_file()


def test_msrvtt_dataset_reads_the_expert_world(tmp_path):
    from vlret.data.expert_batch import ExpertSample
    from vlret.data.formats.msrvtt import MSRVTTDataset

    root = write_synthetic("video-experts", tmp_path / "d", splits=SMALL, n_1ka=5, seed=2)
    world = generate_world("video-experts", splits=SMALL, n_1ka=5, seed=2)
    for name, n in SMALL.items():
        ds = MSRVTTDataset(root, name, protocol="full", experts="all")
        assert ds.num_images == n and ds.num_captions == 20 * n
        assert ds.captions == world[name].captions("msrvtt")
        ds.check_features(in_dim=expert_dims())
        ex = world[name].experts
        for i in (0, n - 1):
            sample = ds.image(i)
            assert isinstance(sample, ExpertSample) and sample.names == tuple(EXPERTS)
            assert sample.present.tolist() == [bool(ex.present[e][i]) for e in EXPERTS]
            got, want = sample.features["motion"], torch.from_numpy(ex.features["motion"][i])
            assert torch.equal(got, want)
    test_1ka = MSRVTTDataset(root, "test", protocol="1k-A", experts="all")
    assert test_1ka.num_images == test_1ka.num_captions == 5
    train_1ka = MSRVTTDataset(root, "train", protocol="1k-A", experts=["scene", "audio"])
    assert train_1ka.num_images == SMALL["train"] + SMALL["dev"] + SMALL["test"] - 5
    assert train_1ka.image(0).names == ("scene", "audio")
