"""Multi-expert features: the layout's writer and reader, the converter from the CE / MMT
released pickles (and its restricted unpickler), and MSR-VTT with experts."""

from __future__ import annotations

import json
import os
import pickle
from collections import OrderedDict
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from vlret.data import DataFormatError, ExpertBatch, MSRVTTDataset
from vlret.data.formats.experts.features import (
    ExpertFeatures,
    ExpertSpec,
    convert_experts,
    read_expert_specs,
    write_expert_features,
)
from vlret.data.writers import write_jsfusion_csv, write_msrvtt_json, write_msrvtt_train_csv

IDS = ["video0", "video1", "video2", "video3"]


def _entries(seed: int = 0) -> dict[str, list[np.ndarray | None]]:
    """``app`` pooled (dim 5, video1 lacks it), ``aud`` temporal (dim 3, 2/4/-/1 frames)."""
    rng = np.random.default_rng(seed)
    app = [rng.standard_normal(5) for _ in IDS]
    app[1] = None
    aud = [rng.standard_normal((t, 3)) if t else None for t in (2, 4, 0, 1)]
    return {"app": app, "aud": aud}


def _expected(entries, name: str, k: int, frames: int | None) -> np.ndarray:
    """Naive oracle: the stored row, zeros where absent or padding."""
    entry = entries[name][k]
    if frames is None:
        return np.zeros(5) if entry is None else np.asarray(entry, np.float32)
    out = np.zeros((frames, 3), np.float32)
    if entry is not None:
        t = min(len(entry), frames)
        out[:t] = entry[:t]
    return out


@pytest.fixture
def folder(tmp_path):
    return write_expert_features(tmp_path / "feats", IDS, _entries())


# ------------------------------------------------------------------------------ writer/reader


def test_round_trip_every_row(folder):
    entries = _entries()
    feats = ExpertFeatures(folder)
    assert feats.names == ("app", "aud") and feats.video_ids == IDS
    assert feats.specs == (ExpertSpec("app", "pooled", 5), ExpertSpec("aud", "temporal", 3, 4))
    spec = json.loads((folder / "experts.json").read_text())
    assert spec["format"] == "vlret-experts" and spec["version"] == 1
    for k in range(len(IDS)):
        s = feats.sample(k)
        assert s.names == ("app", "aud")
        assert s.features["app"].dtype == torch.float32
        np.testing.assert_array_equal(s.features["app"].numpy(), _expected(entries, "app", k, None))
        np.testing.assert_array_equal(s.features["aud"].numpy(), _expected(entries, "aud", k, 4))
        present = [entries["app"][k] is not None, entries["aud"][k] is not None]
        assert s.present.tolist() == present
        frames = [int(present[0]), 0 if entries["aud"][k] is None else len(entries["aud"][k])]
        assert s.frames.dtype == torch.long and s.frames.tolist() == frames
    assert np.load(folder / "aud.frames.npy").dtype == np.int64
    assert isinstance(feats._features["app"].array, np.memmap)


def test_selection_order_and_rows(folder):
    feats = ExpertFeatures(folder, experts=["aud"])
    assert feats.names == ("aud",) and list(feats.sample(0).features) == ["aud"]
    assert ExpertFeatures(folder, experts=["aud", "app"]).names == ("aud", "app")
    assert feats.rows_for(["video3", "video0"]) == [3, 0]
    with pytest.raises(DataFormatError, match=r"video_ids.txt: has no features for 1 videos"):
        feats.rows_for(["video9"])
    with pytest.raises(
        DataFormatError, match=r"experts.json: has no expert 'rgb'.*\['app', 'aud'\]"
    ):
        ExpertFeatures(folder, experts=["rgb"])
    with pytest.raises(ValueError, match="distinct"):
        ExpertFeatures(folder, experts=["app", "app"])
    with pytest.raises(ValueError, match="list of names"):
        ExpertFeatures(folder, experts="app")


def test_max_frames_truncates(tmp_path):
    entries = _entries()
    out = write_expert_features(tmp_path, IDS, entries, max_frames={"aud": 3})
    feats = ExpertFeatures(out)
    assert feats.specs[1].max_frames == 3
    assert feats.frames[:, 1].tolist() == [2, 3, 0, 1]
    want = entries["aud"][1][:3].astype(np.float32)  # storage is the float32 rounding
    np.testing.assert_array_equal(feats.sample(1).features["aud"].numpy(), want)


def test_writer_refuses_and_overwrites(tmp_path, folder):
    with pytest.raises(FileExistsError, match="overwrite=True"):
        write_expert_features(folder, IDS, _entries())
    write_expert_features(folder, IDS[:1], {"rgb": [np.ones(2)]}, overwrite=True)
    assert sorted(p.name for p in folder.iterdir()) == [
        "experts.json",
        "rgb.npy",
        "rgb.present.npy",
        "video_ids.txt",
    ]
    assert ExpertFeatures(folder).names == ("rgb",)


@pytest.mark.parametrize(
    ("ids", "experts", "kwargs", "match"),
    [
        (["a", "a"], {"x": [np.ones(2)] * 2}, {}, "repeats"),
        ([" a"], {"x": [np.ones(2)]}, {}, "no surrounding whitespace"),
        (["a"], {"x y": [np.ones(2)]}, {}, r"\[A-Za-z0-9_-\]"),
        (["a", "b"], {"x": [np.ones(2)]}, {}, "1 entries for 2"),
        (["a", "b"], {"x": [None, None]}, {}, "None for every video"),
        (["a", "b"], {"x": [np.ones(2), np.ones((1, 2))]}, {}, "one rank"),
        (["a", "b"], {"x": [np.ones(2), np.ones(3)]}, {}, "one rank and one feature size"),
        (["a"], {"x": [np.ones((0, 2))]}, {}, "None for a video without"),
        (["a"], {"x": [np.array(["s"])]}, {}, "expected floats"),
        (["a"], {"x": [np.ones(2)]}, {"max_frames": {"x": 2}}, "pooled"),
        (["a"], {"x": [np.ones(2)]}, {"max_frames": {"y": 2}}, "unknown experts"),
        (["a"], {"x": [np.ones((2, 2))]}, {"max_frames": {"x": 0}}, "positive int"),
    ],
)
def test_writer_rejects(tmp_path, ids, experts, kwargs, match):
    with pytest.raises(ValueError, match=match):
        write_expert_features(tmp_path, ids, experts, **kwargs)
    assert not (tmp_path / "experts.json").exists()


def _edit_json(folder: Path, edit) -> None:
    data = json.loads((folder / "experts.json").read_text())
    edit(data)
    (folder / "experts.json").write_text(json.dumps(data, indent=1))


@pytest.mark.parametrize(
    ("edit", "match"),
    [
        (lambda d: d.update(format="other"), r"experts.json: format is not 'vlret-experts'"),
        (lambda d: d.update(version=2), r"experts.json, line \d+: version 2"),
        (lambda d: d.update(experts=[]), "non-empty list"),
        (lambda d: d["experts"][1].update(kind="frames"), r"line \d+: experts\[1\].*kind"),
        (lambda d: d["experts"][0].update(dim=0), r"experts\[0\].*dim must be a positive int"),
        (lambda d: d["experts"][0].update(max_frames=3), r"experts\[0\].*max_frames must be None"),
        (lambda d: d["experts"][1].pop("max_frames"), r"experts\[1\].*max_frames must be a pos"),
        (lambda d: d["experts"][1].update(max_frame=3), r"unknown keys \['max_frame'\]"),
        (lambda d: d["experts"][1].update(name="app"), r"experts\[1\]: the name 'app' repeats"),
        (lambda d: d["experts"][0].update(name="a/b"), r"experts\[0\].*\[A-Za-z0-9_-\]"),
        (lambda d: d["experts"][0].update(dim=6), r"app.npy: has shape \(4, 5\).*dim 6"),
        (lambda d: d["experts"][1].update(max_frames=5), r"aud.npy: has shape \(4, 4, 3\)"),
        (lambda d: d["experts"][0].update(kind="temporal", max_frames=5), r"app.npy: has shape"),
    ],
)
def test_reader_rejects_bad_json(folder, edit, match):
    _edit_json(folder, edit)
    with pytest.raises(DataFormatError, match=match):
        ExpertFeatures(folder)


def test_reader_json_syntax_error_has_line(folder):
    (folder / "experts.json").write_text('{\n "format": "vlret-experts",\n "version": 1,,\n}')
    with pytest.raises(DataFormatError, match=r"experts.json, line 3: invalid JSON"):
        ExpertFeatures(folder)


def test_reader_rejects_bad_ids(folder):
    ids = folder / "video_ids.txt"
    ids.write_text("video0\nvideo1\nvideo2\n")
    with pytest.raises(DataFormatError, match=r"app.npy: has 4 rows for the 3 ids of video_ids"):
        ExpertFeatures(folder)
    ids.write_text("video0\nvideo1\nvideo0\nvideo3\n")
    with pytest.raises(DataFormatError, match=r"video_ids.txt, line 3: .*repeats line 1"):
        ExpertFeatures(folder)
    ids.write_text("video0\n\nvideo2\nvideo3\n")
    with pytest.raises(DataFormatError, match=r"video_ids.txt, line 2: empty video id"):
        ExpertFeatures(folder)


@pytest.mark.parametrize(
    ("name", "array", "match"),
    [
        ("app.present.npy", np.ones(3, bool), r"app.present.npy: .*shape \(3,\); expected a bool"),
        ("app.present.npy", np.ones(4, np.int64), r"app.present.npy: has dtype int64"),
        ("aud.frames.npy", np.ones(4, np.float32), r"aud.frames.npy: has dtype float32"),
        ("aud.frames.npy", np.array([2, 5, 0, 1]), r"aud.frames.npy, row 1: 5 frames .*max_fr"),
        ("aud.frames.npy", np.array([2, 4, 1, 1]), r"aud.frames.npy, row 2: 1 frames .*False"),
        ("aud.frames.npy", np.array([0, 4, 0, 1]), r"aud.frames.npy, row 0: 0 frames .*True"),
        ("app.npy", np.ones((4, 5), np.int64), r"app.npy: has dtype int64"),
        ("aud.npy", np.ones((4, 4, 2), np.float32), r"aud.npy: has shape \(4, 4, 2\)"),
    ],
)
def test_reader_rejects_bad_arrays(folder, name, array, match):
    np.save(folder / name, array)
    with pytest.raises(DataFormatError, match=match):
        ExpertFeatures(folder)


def test_reader_missing_file(folder):
    (folder / "aud.frames.npy").unlink()
    with pytest.raises(FileNotFoundError, match="aud.frames.npy"):
        ExpertFeatures(folder)


def _poke(path: Path, index, value) -> None:
    arr = np.load(path, mmap_mode="r+")
    arr[index] = value
    arr.flush()
    del arr


def test_non_finite_scan_reads_only_present_real_frames(folder):
    _poke(folder / "aud.npy", (0, 3, 1), np.nan)  # padding frame of video0 (2 real frames)
    _poke(folder / "aud.npy", (2, 0, 0), np.inf)  # video2 lacks aud
    _poke(folder / "app.npy", (1, 2), np.nan)  # video1 lacks app
    feats = ExpertFeatures(folder)
    assert feats.find_non_finite(range(4)) is None
    feats.check(range(4), in_dim={"app": 5, "aud": 3})
    _poke(folder / "aud.npy", (3, 0, 2), -np.inf)  # the one real frame of video3
    _poke(folder / "aud.npy", (1, 3, 0), np.nan)  # last real frame of video1
    feats = ExpertFeatures(folder)
    bad = feats.find_non_finite([3, 1, 0], chunk_bytes=1)
    assert bad.expert == "aud" and bad.path == folder / "aud.npy"
    assert (bad.found.row, bad.found.index, bad.found.count, bad.found.row_size) == (
        1,
        (3, 0),
        1,
        12,
    )
    assert feats.find_non_finite([3]).found.value == -np.inf
    with pytest.raises(DataFormatError, match=r"aud.npy, row 3: video3 \(row 3\), expert aud, fr"):
        feats.check([3])
    assert feats.find_non_finite([0, 2]) is None


def test_check_dims(folder):
    feats = ExpertFeatures(folder, experts=["aud"])
    feats.check_dims({"aud": 3})
    with pytest.raises(
        DataFormatError, match=r"aud.npy: expert aud .*size 3.*model.experts.aud = 4"
    ):
        feats.check_dims({"aud": 4})
    with pytest.raises(DataFormatError, match=r"expert 'app' is not among the experts read"):
        feats.check_dims({"app": 5})
    with pytest.raises(ValueError, match="positive ints"):
        feats.check_dims({"aud": 0})
    with pytest.raises(ValueError, match="positive ints"):
        feats.check_dims(3)


def test_pickled_reader_reopens_the_map(folder):
    feats = ExpertFeatures(folder)
    feats.sample(0)
    blob = pickle.dumps(feats)
    assert len(blob) < 4096 and b"memmap" not in blob
    again = pickle.loads(blob)
    for k in range(4):
        a, b = feats.sample(k), again.sample(k)
        assert all(torch.equal(a.features[n], b.features[n]) for n in a.names)
        assert torch.equal(a.present, b.present) and torch.equal(a.frames, b.frames)


# ------------------------------------------------------------------------------ converter


def _dump(path: Path, obj, protocol: int = pickle.HIGHEST_PROTOCOL) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("wb") as f:
        pickle.dump(obj, f, protocol=protocol)
    return path


def _released(seed: int = 0):
    """Per-expert dicts in the released forms, and the expected entries (None = missing)."""
    rng = np.random.default_rng(seed)
    app = {v: rng.standard_normal(5).astype(np.float32) for v in IDS}
    app["video1"] = float("nan")  # CE's missing marker
    aud = {
        "video0": rng.standard_normal((2, 3)),  # float64 in the file: stored as float32
        "video1": rng.standard_normal((4, 3)),
        "video2": np.zeros((0, 3)),  # empty: missing
        "video3": np.full((3, 3), np.nan),  # all NaN: missing
    }
    expected = {
        "app": [None if k == 1 else app[v] for k, v in enumerate(IDS)],
        "aud": [aud["video0"], aud["video1"], None, None],
    }
    return app, aud, expected


def _assert_converted(out: Path, expected, names=("app", "aud"), ids=IDS) -> None:
    feats = ExpertFeatures(out)
    assert feats.names == tuple(names) and feats.video_ids == list(ids)
    for k in range(len(ids)):
        s = feats.sample(k)
        for e, name in enumerate(names):
            entry = expected[name][k]
            assert bool(s.present[e]) == (entry is not None)
            if entry is None:
                assert not s.features[name].any() and s.frames[e] == 0
                continue
            got = s.features[name].numpy()
            if got.ndim == 2:
                assert s.frames[e] == len(entry)
                got = got[: len(entry)]
            np.testing.assert_array_equal(got, np.asarray(entry, np.float32))


@pytest.mark.parametrize("protocol", range(pickle.HIGHEST_PROTOCOL + 1))
def test_convert_folder_of_per_expert_pickles(tmp_path, protocol):
    app, aud, expected = _released()
    _dump(tmp_path / "src" / "app.pickle", app, protocol)
    _dump(tmp_path / "src" / "aud.pkl", OrderedDict(aud), protocol)
    out = convert_experts(tmp_path / "src", tmp_path / "out")
    _assert_converted(out, expected)
    assert read_expert_specs(out / "experts.json")[1] == ExpertSpec("aud", "temporal", 3, 4)


def test_convert_with_a_name_mapping_and_mmt_aggregates(tmp_path):
    app, aud, expected = _released()
    src = tmp_path / "src"
    _dump(src / "aggregated_imagenet_25fps" / "senet154-avg.pickle", app)
    # MMT's avg / max files hold (1, D) per video: pooled after conversion.
    _dump(src / "vggish" / "avg.pkl", {v: a[None, :] for v, a in app.items() if v != "video1"})
    _dump(src / "vggish" / "fixed_seg.pkl", {v: a for v, a in aud.items() if v != "video2"})
    _dump(src / "w2v_MSRVTT.pickle", {v: [np.ones((3, 300))] for v in IDS})  # text: not selected
    out = convert_experts(
        src,
        tmp_path / "out",
        experts={
            "appearance": "aggregated_imagenet_25fps/senet154-avg.pickle",
            "audio": "vggish/fixed_seg.pkl",
            "audio_avg": "vggish/avg.pkl",
        },
        max_frames={"audio": 3},
    )
    feats = ExpertFeatures(out)
    assert [s.kind for s in feats.specs] == ["pooled", "temporal", "pooled"]
    assert feats.video_ids == IDS
    assert feats.present[:, 2].tolist() == [True, False, True, True]
    assert feats.frames[:, 1].tolist() == [2, 3, 0, 0]
    np.testing.assert_array_equal(feats.sample(3).features["audio_avg"].numpy(), app["video3"])
    with pytest.raises(DataFormatError, match=r"w2v_MSRVTT.pickle: video 'video0', expert w2v_MS"):
        convert_experts(src, tmp_path / "out2")  # every file: the text pickle is no expert


def test_convert_single_pickle_of_per_video_dicts(tmp_path):
    app, aud, expected = _released()
    per_video = {}
    for v in IDS:
        per_video[v] = {"app": app[v], "aud": aud[v]}
    per_video["video1"]["app"] = None
    del per_video["video3"]["aud"]  # absent key: missing
    expected["aud"][3] = None
    src = _dump(tmp_path / "features.pkl", per_video)
    _assert_converted(convert_experts(src, tmp_path / "a"), expected)
    out = convert_experts(src, tmp_path / "b", experts=["aud"])
    _assert_converted(out, expected, names=("aud",))
    out = convert_experts(src, tmp_path / "c", experts={"rgb": "app"})
    _assert_converted(out, {"rgb": expected["app"]}, names=("rgb",))
    with pytest.raises(DataFormatError, match=r"features.pkl: no video has expert 'flow'.*'app'"):
        convert_experts(src, tmp_path / "d", experts=["flow"])


def test_convert_numpy_nan_scalar_marker_and_video_order(tmp_path):
    _dump(tmp_path / "src" / "a.pkl", {"v2": np.ones(2), "v1": np.float64("nan")})
    _dump(tmp_path / "src" / "b.pkl", {"v3": np.ones(2), "v1": np.ones(2) * 2})
    feats = ExpertFeatures(convert_experts(tmp_path / "src", tmp_path / "out"))
    assert feats.video_ids == ["v2", "v1", "v3"]
    assert feats.present.tolist() == [[True, False], [False, True], [False, True]]


@pytest.mark.parametrize(
    ("obj", "match"),
    [
        ({"v0": np.array([1.0, np.nan])}, r"a.pkl: video 'v0', expert a: 1 of its 2 values"),
        ({"v0": [np.ones(2)]}, r"video 'v0', expert a: a list; expected a numpy array"),
        ({"v0": {"x": np.ones(2)}}, r"a dict \(a per-video dict: pass this file itself as SRC\)"),
        ({"v0": 3.0}, r"a float; expected a numpy array"),
        ({"v0": np.array(["s"])}, r"dtype <U1; expected float features"),
        ({"v0": np.ones((2, 2, 2))}, r"shape \(2, 2, 2\); expected \(D,\) or \(T, D\)"),
        ({1: np.ones(2)}, r"a.pkl: key 1; expected video ids"),
        ({"v0": np.ones(2), "v1": np.ones(3)}, r"video 'v1' has shape \(3,\) but video 'v0'"),
        ({"v0": None, "v1": float("nan")}, r"a.pkl: expert a: no video has features"),
        ([np.ones(2)], r"a.pkl: holds a list; expected a dict keyed by video id"),
    ],
)
def test_convert_rejects_bad_content(tmp_path, obj, match):
    _dump(tmp_path / "src" / "a.pkl", obj)
    with pytest.raises(DataFormatError, match=match):
        convert_experts(tmp_path / "src", tmp_path / "out")
    assert not (tmp_path / "out" / "experts.json").exists()


def test_convert_rejects_bad_sources(tmp_path):
    src = tmp_path / "src"
    with pytest.raises(FileNotFoundError, match="src: missing"):
        convert_experts(src, tmp_path / "out")
    src.mkdir()
    with pytest.raises(DataFormatError, match="holds no .pkl or .pickle file"):
        convert_experts(src, tmp_path / "out")
    _dump(src / "x" / "avg.pkl", {"v": np.ones(2)})
    _dump(src / "y" / "avg.pkl", {"v": np.ones(2)})
    with pytest.raises(DataFormatError, match=r"y/avg.pkl: has the name of .*x/avg.pkl"):
        convert_experts(src, tmp_path / "out")
    with pytest.raises(DataFormatError, match=r"no pickle for expert 'rgb'; it has \['avg'\]"):
        convert_experts(src / "x", tmp_path / "out", experts=["rgb"])
    _dump(src / "z" / "bad name.pkl", {"v": np.ones(2)})
    with pytest.raises(DataFormatError, match=r"bad name.pkl: the file stem 'bad name' is not"):
        convert_experts(src / "z", tmp_path / "out")
    with pytest.raises(FileNotFoundError, match="the pickle of expert rgb"):
        convert_experts(src, tmp_path / "out", experts={"rgb": "nope.pkl"})
    (src / "x" / "avg.pkl").write_bytes(b"not a pickle at all")
    with pytest.raises(DataFormatError, match=r"x/avg.pkl: not a readable pickle"):
        convert_experts(src / "x", tmp_path / "out")
    per_video = _dump(tmp_path / "pv.pkl", {"v": np.ones(2)})
    with pytest.raises(DataFormatError, match=r"pv.pkl: video 'v': a ndarray; expected \{expert"):
        convert_experts(per_video, tmp_path / "out")
    write_expert_features(tmp_path / "out", ["v"], {"x": [np.ones(2)]})
    with pytest.raises(FileExistsError, match="overwrite=True"):
        convert_experts(per_video, tmp_path / "out")


class _Boom:
    """Touches a sentinel file when unpickled (a stand-in for a hostile payload)."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self):
        return (_touch, (self.path,))


def _touch(path: str) -> str:
    Path(path).write_text("ran")
    return path


class _System:
    def __init__(self, command: str) -> None:
        self.command = command

    def __reduce__(self):
        return (os.system, (self.command,))


@pytest.mark.parametrize("protocol", [0, 2, pickle.HIGHEST_PROTOCOL])
def test_restricted_unpickler_refuses_code_without_running_it(tmp_path, protocol):
    sentinel = tmp_path / "sentinel"
    src = tmp_path / "src"
    # The sentinel mechanism works: an ordinary unpickler runs the payload.
    payload = pickle.dumps({"v0": np.ones(2), "v1": _Boom(str(sentinel))}, protocol=protocol)
    pickle.loads(payload)
    assert sentinel.read_text() == "ran"
    sentinel.unlink()
    (src / "a.pkl").parent.mkdir()
    (src / "a.pkl").write_bytes(payload)
    with pytest.raises(DataFormatError, match=r"a.pkl: refuses to load .*_touch: only numpy"):
        convert_experts(src, tmp_path / "out")
    assert not sentinel.exists()
    _dump(src / "a.pkl", {"v0": _System(f"touch {sentinel}")}, protocol)
    system = f"{os.system.__module__}.system"  # posix.system
    with pytest.raises(DataFormatError, match=rf"a.pkl: refuses to load {system}: only numpy"):
        convert_experts(src, tmp_path / "out")
    assert not sentinel.exists()
    _dump(src / "a.pkl", {"v0": np.array([_Boom(str(sentinel))], dtype=object)}, protocol)
    with pytest.raises(DataFormatError, match=r"refuses to load .*_touch"):
        convert_experts(src, tmp_path / "out")
    assert not sentinel.exists() and not (tmp_path / "out" / "experts.json").exists()


def test_restricted_unpickler_refuses_other_codecs(tmp_path):
    import codecs

    class _Codec:
        def __reduce__(self):
            return (codecs.encode, ("x", "zlib"))

    _dump(tmp_path / "src" / "a.pkl", {"v0": _Codec()}, 2)
    with pytest.raises(
        DataFormatError, match=r"a.pkl: refuses _codecs.encode with encoding 'zlib'"
    ):
        convert_experts(tmp_path / "src", tmp_path / "out")


# ------------------------------------------------------------------------------ MSR-VTT


def _msrvtt_root(tmp_path: Path) -> tuple[Path, dict]:
    """A tiny MSR-VTT root whose expert features come from released-form pickles."""
    root = tmp_path / "msrvtt"
    splits = ["train", "train", "validate", "test"]
    videos = list(zip(IDS, splits, strict=True))
    captions = {v: [f"a {v} caption {j}" for j in range(3)] for v in IDS}
    write_msrvtt_json(root / "MSRVTT_data.json", videos, captions)
    write_msrvtt_train_csv(root / "MSRVTT_train.9k.csv", IDS[:3])
    write_jsfusion_csv(root / "MSRVTT_JSFUSION_test.csv", [("video3", captions["video3"][0])])
    app, aud, expected = _released()
    _dump(tmp_path / "released" / "app.pickle", app)
    _dump(tmp_path / "released" / "aud.pickle", aud)
    convert_experts(tmp_path / "released", root)
    return root, expected


def test_msrvtt_with_experts_loader_gives_expert_batches(tmp_path):
    root, expected = _msrvtt_root(tmp_path)
    ds = MSRVTTDataset(root, "train", captions_per_video=3, experts="all")
    assert ds.video_ids == ["video0", "video1"] and len(ds) == 6
    loader = DataLoader(ds, batch_size=4, shuffle=False, collate_fn=ds.collate, num_workers=1)
    batches = list(loader)
    batch = batches[0]
    assert isinstance(batch.features, ExpertBatch)
    feats = batch.features
    assert feats.names == ("app", "aud") and len(feats) == 4
    assert feats.features["app"].shape == (4, 5) and feats.features["aud"].shape == (4, 4, 3)
    # captions 0-2 are video0's, 3 is video1's: video1 lacks app, has 4 aud frames.
    assert feats.present.tolist() == [[True, True]] * 3 + [[False, True]]
    assert feats.frames.tolist() == [[1, 2]] * 3 + [[0, 4]]
    assert feats.frame_mask("aud").sum(1).tolist() == [2, 2, 2, 4]
    np.testing.assert_array_equal(feats.features["app"][0].numpy(), expected["app"][0])
    np.testing.assert_allclose(
        feats.features["aud"][3].numpy(), np.asarray(expected["aud"][1], np.float32)
    )
    assert batch.to("cpu").features.present.dtype == torch.bool
    images, index = ds.images().collate([ds.images()[i] for i in range(2)])
    assert isinstance(images, ExpertBatch) and index.tolist() == [0, 1]
    test = MSRVTTDataset(root, "test", protocol="1k-A", experts=["aud"])
    sample = test.image(0)
    assert sample.names == ("aud",) and sample.present.tolist() == [False]
    assert test.txt_to_img.tolist() == [0]


def test_msrvtt_experts_in_a_features_dir_and_frame_layout_unchanged(tmp_path):
    root, _ = _msrvtt_root(tmp_path)
    feats_dir = tmp_path / "feats"
    write_expert_features(feats_dir, IDS[::-1], {"x": [np.full(2, k) for k in range(4)]})
    ds = MSRVTTDataset(root, "dev", captions_per_video=3, features_dir=feats_dir, experts="all")
    assert ds.video_ids == ["video2"] and ds.image(0).features["x"].tolist() == [1.0, 1.0]
    with pytest.raises(FileNotFoundError, match="video_feats.npy"):
        MSRVTTDataset(root, "dev", captions_per_video=3)  # experts=None: the frame layout
    with pytest.raises(ValueError, match="does not fit VideoFeatures"):
        frames = tmp_path / "frames"
        from vlret.data.writers import write_video_features

        write_video_features(frames, IDS, np.ones((4, 2, 3), np.float32))
        plain = MSRVTTDataset(root, "dev", captions_per_video=3, features_dir=frames)
        assert plain.image(0).shape == (2, 3)
        plain.check_features(in_dim=3)
        plain.check_features(in_dim={"x": 3})


def test_msrvtt_check_features_with_experts(tmp_path):
    root, _ = _msrvtt_root(tmp_path)
    ds = MSRVTTDataset(root, "train", captions_per_video=3, experts="all")
    ds.check_features(in_dim={"app": 5, "aud": 3})
    ds.check_features()
    with pytest.raises(DataFormatError, match=r"aud.npy: expert aud has features of size 3"):
        ds.check_features(in_dim={"app": 5, "aud": 4})
    with pytest.raises(ValueError, match="does not fit ExpertFeatures"):
        ds.check_features(in_dim=5)
    _poke(root / "aud.npy", (1, 2, 1), np.nan)  # video1, frame 2 of its 4 real frames
    ds = MSRVTTDataset(root, "train", captions_per_video=3, experts="all")
    message = (
        r"aud.npy, row 1: video1 \(video 1 of the full train split\), expert aud, frame 2, "
        r"dimension 1: NaN"
    )
    with pytest.raises(DataFormatError, match=message):
        ds.check_features(in_dim={"app": 5, "aud": 3})
    MSRVTTDataset(root, "test", experts="all", captions_per_video=3).check_features()
