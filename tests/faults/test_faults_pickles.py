"""Fault cases of issue 26 for checkpoints and pickles: crafted reference checkpoints and expert
pickles that are tiny on disk and hang, exhaust memory or build a huge model when read naively;
output folders that cannot be written; damaged checkpoints; command-line messages that name the
command's own flags.

Every crafted file is written in the real format (``torch.save`` of the structure a reference
``train.py`` saves; ``pickle.dump`` of the released ``{video: array}`` dicts, with one object
whose ``__reduce__`` makes the allowed call a crafted file would make).
"""

from __future__ import annotations

import pickle
import re
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from test_import_checkpoint import (
    reference_checkpoint,
    run_import,
    scan_opt,
    sgraf_opt,
    write_reference,
    write_vocab,
)

from fault_helpers import read_only_folder
from vlret.cli import main
from vlret.data import DataFormatError
from vlret.data.formats.experts.features import convert_experts
from vlret.run.checkpoint import load_checkpoint, save_checkpoint
from vlret.run.import_checkpoint import CheckpointImportError, load_reference_checkpoint

try:
    from numpy._core import multiarray
except ImportError:  # numpy < 2
    from numpy.core import multiarray  # type: ignore[no-redef]


def _shared_nest(levels: int) -> list:
    """``a = [0]; a = [a, a]`` ``levels`` times: a few bytes a level pickled (the memo), 2**levels
    lists when walked or copied."""
    a: list = [0]
    for _ in range(levels):
        a = [a, a]
    return a


def _deep_nest(levels: int) -> list:
    a: list = []
    for _ in range(levels):
        a = [a]
    return a


def _save_reference(tmp_path: Path, ckpt: dict, name: str = "ckpt.pth.tar") -> Path:
    path = tmp_path / name
    torch.save(ckpt, path)
    return path


@pytest.fixture
def no_build(monkeypatch):
    """Fail the test if the model is built (every refusal here comes before any module)."""

    def refuse(*args, **kwargs):
        raise AssertionError("a module was built before the options were checked")

    monkeypatch.setattr("vlret.models.build_model", refuse)


# --------------------------------------------------------------------------------------------
# vlret import-checkpoint: options bounded before anything is expanded or built
# --------------------------------------------------------------------------------------------


def test_a_shared_nested_list_in_opt_is_refused_without_walking_it(tmp_path, no_build):
    """Before: 57 s and 3.2 GB walking 2**40 lists, then a MemoryError traceback."""
    ckpt = reference_checkpoint("scan", scan_opt())
    ckpt["opt"].extra = _shared_nest(40)
    path = _save_reference(tmp_path, ckpt)
    assert path.stat().st_size < 30_000
    with pytest.raises(CheckpointImportError) as err:
        run_import(tmp_path, path, "scan")
    message = str(err.value)
    assert message.startswith(f"{path}: refused: opt.extra holds more than 1000000 container")
    assert "\n" not in message and not (tmp_path / "o.pt").exists()


def test_an_option_holding_a_shared_nested_list_is_refused_naming_it(tmp_path, no_build):
    ckpt = reference_checkpoint("scan", scan_opt())
    ckpt["opt"].num_layers = _shared_nest(40)
    with pytest.raises(CheckpointImportError, match=r"ckpt.pth.tar: refused: opt.num_layers "):
        run_import(tmp_path, _save_reference(tmp_path, ckpt), "scan")


def test_a_deeply_nested_option_is_refused(tmp_path, no_build):
    """Before: a RecursionError traceback (the record's repr of opt)."""
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(20_000)
    try:
        ckpt = reference_checkpoint("scan", scan_opt(resume=_deep_nest(3000)))
        path = _save_reference(tmp_path, ckpt)
    finally:
        sys.setrecursionlimit(limit)
    with pytest.raises(CheckpointImportError, match=r"opt.resume nests containers more than 32"):
        run_import(tmp_path, path, "scan")


@pytest.mark.parametrize(
    ("arch", "option", "value", "message"),
    [
        # before: a hang (a GRU of 10**9 layers)
        ("scan", "num_layers", 10**9, "opt.num_layers = 1000000000 is outside 1..64"),
        # before: a 480 GB allocation traceback
        ("scan", "embed_size", 200_000, "opt.embed_size = 200000 is outside 1..8192"),
        # before: a MemoryError traceback (list(range(1, 10**15)): the learning-rate decay epochs)
        ("scan", "num_epochs", 10**15, "opt.num_epochs = 1000000000000000 is outside 1..10000"),
        # before: a clear error too, from the run config (model.sgr_steps in [0, 1024])
        ("sgraf", "sgr_step", 10**6, "opt.sgr_step = 1000000 is outside 1..64"),
        # before: accepted silently (a softmax of 1e300 * cosine in every attention)
        ("scan", "lambda_softmax", 1e300, r"opt.lambda_softmax = 1e\+300 is outside"),
    ],
)
def test_options_out_of_range_are_refused_naming_option_and_value(
    tmp_path, no_build, arch, option, value, message
):
    opt = scan_opt() if arch == "scan" else sgraf_opt()
    ckpt = reference_checkpoint(arch, opt)
    setattr(ckpt["opt"], option, value)
    if option == "num_epochs":
        ckpt["opt"].lr_update = 1
    path = _save_reference(tmp_path, ckpt)
    with pytest.raises(CheckpointImportError) as err:
        run_import(tmp_path, path, arch)
    assert str(err.value).startswith(f"{path}: ")
    assert re.search(message, str(err.value)), str(err.value)


def test_options_that_disagree_with_the_tensors_are_refused_before_building(tmp_path, no_build):
    """Before: the model of opt was built (here 4096-wide, 200 MB), then the shapes compared."""
    ckpt = reference_checkpoint("scan", scan_opt())
    ckpt["opt"].embed_size = 4096
    with pytest.raises(
        CheckpointImportError,
        match=r"opt.embed_size = 4096, opt.img_dim = 10 imply img_enc.fc.weight of shape "
        r"\(4096, 10\), but it has shape \(12, 10\)",
    ):
        run_import(tmp_path, _save_reference(tmp_path, ckpt), "scan")
    ckpt = reference_checkpoint("sgraf", sgraf_opt())
    ckpt["opt"].sgr_step = 9  # the file holds 3 steps
    with pytest.raises(CheckpointImportError, match=r"missing sim_enc.SGR_module.3.graph_query_w"):
        run_import(tmp_path, _save_reference(tmp_path, ckpt), "sgraf")


def test_weights_that_expand_a_few_stored_values_are_bounded(tmp_path, no_build):
    """Options in range and tensors of their shapes, but views of one stored value each (a
    few KB saved): the model of opt would take 300 GB. Refused from the state's size."""
    e, word, layers = 8192, 8192, 64
    opt = scan_opt(embed_size=e, word_dim=word, img_dim=16, num_layers=layers)
    one = torch.zeros(1)
    img = {"fc.weight": one.expand(e, 16), "fc.bias": one.expand(e)}
    txt = {"embed.weight": one.expand(20, word)}
    for layer in range(layers):
        for sfx in ("", "_reverse"):
            txt[f"rnn.weight_ih_l{layer}{sfx}"] = one.expand(3 * e, word if layer == 0 else 2 * e)
            txt[f"rnn.weight_hh_l{layer}{sfx}"] = one.expand(3 * e, e)
    ckpt = {"epoch": 1, "model": [img, txt], "best_rsum": 0.0, "opt": opt, "Eiters": 1}
    path = _save_reference(tmp_path, ckpt)
    assert path.stat().st_size < 200_000
    with pytest.raises(CheckpointImportError, match=r"the state dicts hold \d+ weight values"):
        run_import(tmp_path, path, "scan")


def test_a_cyclic_option_is_refused(tmp_path, no_build):
    loop: list = [1]
    loop.append(loop)
    ckpt = reference_checkpoint("scan", scan_opt(resume=loop))
    with pytest.raises(
        CheckpointImportError, match=r"opt.resume holds a list that contains itself"
    ):
        run_import(tmp_path, _save_reference(tmp_path, ckpt), "scan")


def test_a_released_checkpoint_still_imports(tmp_path):
    out = run_import(tmp_path, write_reference(tmp_path, "sgraf", sgraf_opt()), "sgraf")
    assert load_checkpoint(out)["imported_from"]["opt"]["sgr_step"] == 3


# --------------------------------------------------------------------------------------------
# Expert pickles: calls that build large arrays, and nesting, refused while loading
# --------------------------------------------------------------------------------------------


class _Call:
    """Pickles as ``func(*args)``: the REDUCE a crafted file holds."""

    def __init__(self, func, *args) -> None:
        self.func, self.args = func, args

    def __reduce__(self):
        return (self.func, self.args)


def _dump(path: Path, obj, protocol: int = 2) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("wb") as f:
        pickle.dump(obj, f, protocol=protocol)
    return path


#: a view of 10**12 float64 over 8 bytes (strides 0): 8 TB when read
_VIEW = _Call(np.ndarray, (10**12,), np.dtype("f8"), b"\0" * 8, 0, (0,))


@pytest.mark.parametrize(
    ("value", "message"),
    [
        # before: a MemoryError traceback (np.isnan over 10**12 values), or a hang where the
        # memory is there
        (_VIEW, "refuses a direct call of numpy.ndarray"),
        # before: list() of the view: MemoryError, "not a readable pickle (MemoryError: )"
        (_Call(list, _VIEW), "refuses a direct call of numpy.ndarray"),
        # before: a 1 TB allocation, "not a readable pickle (MemoryError: ...)"
        (
            _Call(multiarray._reconstruct, np.ndarray, (10**12,), b"b"),
            r"refuses _reconstruct of shape \(1000000000000,\)",
        ),
        (_Call(set, "abc"), r"refuses set\(str\)"),
    ],
)
def test_crafted_array_calls_are_refused_while_loading(tmp_path, value, message):
    src = tmp_path / "src"
    _dump(src / "rgb.pkl", {"v0": value, "v1": np.ones(3, dtype=np.float32)})
    with pytest.raises(DataFormatError, match=f"rgb.pkl: {message}"):
        convert_experts(src, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_a_deeply_nested_video_id_is_refused(tmp_path):
    """Before: a RecursionError traceback (the error message's repr of the key)."""
    array = pickle.dumps(np.zeros(3, dtype=np.float32), 2)[2:-1]
    key = b")" + b"\x85" * 100_000  # (((...),),) 100000 deep, one byte a level
    path = tmp_path / "all.pkl"
    path.write_bytes(b"\x80\x02}" + key + array + b"s.")
    with pytest.raises(DataFormatError, match=r"all.pkl: refused: the pickle nests containers"):
        convert_experts(path, tmp_path / "out")


def test_a_shared_nested_list_in_an_expert_pickle_is_refused(tmp_path):
    path = _dump(tmp_path / "all.pkl", {"v0": {"rgb": _shared_nest(60)}}, 4)
    with pytest.raises(DataFormatError, match=r"holds more than 50000000 container elements"):
        convert_experts(path, tmp_path / "out")


def test_released_pickles_of_every_protocol_still_load(tmp_path):
    rgb = {f"v{k}": np.arange(4, dtype=np.float32) + k for k in range(3)}
    for protocol in range(6):
        src = tmp_path / f"p{protocol}"
        _dump(src / "rgb.pkl", rgb, protocol)
        _dump(src / "aud.pkl", {"v1": np.ones((2, 3)), "v0": float("nan")}, protocol)
        assert convert_experts(src, tmp_path / f"out{protocol}") == tmp_path / f"out{protocol}"


# --------------------------------------------------------------------------------------------
# Output folders checked before any reading (item 8)
# --------------------------------------------------------------------------------------------


def test_import_checkpoint_into_a_read_only_folder_is_refused_first(tmp_path, capsys, monkeypatch):
    """Before: the checkpoint was read, the model built and converted, then the write failed."""
    src = write_reference(tmp_path, "scan", scan_opt())
    vocab = write_vocab(tmp_path)

    def unread(*args, **kwargs):
        raise AssertionError("the checkpoint was read before --out was checked")

    monkeypatch.setattr("vlret.run.import_checkpoint.load_reference_checkpoint", unread)
    with read_only_folder(tmp_path / "ro") as ro:
        out = ro / "model.pt"
        argv = ["import-checkpoint", str(src), "--arch", "scan", "--vocab", str(vocab)]
        assert main([*argv, "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert (
        err == f"vlret import-checkpoint: {out}: --out cannot be written ({ro} is not writable)\n"
    )


@pytest.mark.parametrize("kind", ["read-only", "file", "under-file"])
def test_convert_experts_out_that_cannot_be_written_is_refused_first(
    tmp_path, capsys, monkeypatch, kind
):
    """Before: the pickles were read, then one line at the write (read-only), "[Errno 17] File
    exists" (a file) or a NotADirectoryError traceback (under a file)."""
    src = _dump(tmp_path / "src" / "rgb.pkl", {"v0": np.ones(3)}).parent

    def unread(*args, **kwargs):
        raise AssertionError("the pickles were read before --out was checked")

    monkeypatch.setattr("vlret.data.formats.experts.features.read_released_experts", unread)
    taken = tmp_path / "taken"
    taken.write_text("x")
    if kind == "file":
        out = taken
        assert main(["convert-experts", str(src), "--out", str(out)]) == 2
        expected = f"{out}: --out is a file; expected a folder"
    elif kind == "under-file":
        out = taken / "experts"
        assert main(["convert-experts", str(src), "--out", str(out)]) == 2
        expected = f"{out}: --out cannot be written ({taken} is a file)"
    else:
        with read_only_folder(tmp_path / "ro") as ro:
            out = ro / "experts"
            assert main(["convert-experts", str(src), "--out", str(out)]) == 2
        expected = f"{out}: --out cannot be written ({ro} is not writable)"
    assert capsys.readouterr().err == f"vlret convert-experts: {expected}\n"
    with pytest.raises(ValueError, match=r": out is a file|: out cannot be written"):
        if kind != "read-only":
            convert_experts(src, out)
        else:
            with read_only_folder(tmp_path / "ro") as ro:
                convert_experts(src, ro / "experts")


# --------------------------------------------------------------------------------------------
# Damaged checkpoints: one line naming what the file is, no warning (item 10)
# --------------------------------------------------------------------------------------------


def _damaged(tmp_path: Path, kind: str) -> Path:
    path = tmp_path / f"{kind}.pt"
    if kind == "truncated":
        good = tmp_path / "good.pt"
        save_checkpoint({"model": {"w": torch.ones(1000)}}, good)
        path.write_bytes(good.read_bytes()[: good.stat().st_size // 2])
    elif kind == "garbage":
        path.write_bytes(b"\x80garbage")
    else:  # a pickle header of protocol 2, then its end: before, "pop from empty list"
        path.write_bytes(b"\x80\x02.")
    return path


@pytest.mark.parametrize(
    ("kind", "reason"),
    [
        # before: "neither a zip archive nor a pickle" (import) and "another kind of file, or a
        # truncated copy" (load_checkpoint)
        ("truncated", r"a truncated copy or damaged zip archive \(the PyTorch checkpoint format, "),
        # before: torch's UserWarning about protocol 103, then "IndexError: pop from empty list"
        ("garbage", r"neither a zip archive nor a pickle: it starts as a pickle of protocol 103"),
        ("legacy", r"a damaged legacy PyTorch checkpoint or another pickle \(3 bytes; reading"),
    ],
)
@pytest.mark.parametrize("loader", ["reference", "vlret"])
def test_damaged_checkpoints_give_one_line_without_warnings(tmp_path, kind, reason, loader):
    path = _damaged(tmp_path, kind)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a leaked torch warning fails the test
        with pytest.raises(ValueError) as err:
            if loader == "reference":
                load_reference_checkpoint(path)
            else:
                load_checkpoint(path)
    message = str(err.value)
    assert message.startswith(f"{path}: ") and "\n" not in message
    assert re.search(reason, message), message
    if kind == "truncated":
        assert f"{path.stat().st_size} bytes" in message


def test_a_shared_nested_list_in_a_vlret_checkpoint_is_refused(tmp_path):
    """Before: loaded; ``vlret eval`` then walked the config's 2**40 lists."""
    path = tmp_path / "bomb.pt"
    save_checkpoint({"model": {}, "config": {"train": {"notes": _shared_nest(40)}}}, path)
    with pytest.raises(ValueError, match=r"bomb.pt: refused: the checkpoint holds more than"):
        load_checkpoint(path)


# --------------------------------------------------------------------------------------------
# convert-experts: the command names its flags, the Python API its arguments (item 10)
# --------------------------------------------------------------------------------------------


def _two_experts(src: Path) -> Path:
    _dump(src / "rgb.pkl", {"v0": np.ones(3), "v1": np.zeros(3)})
    _dump(src / "aud.pkl", {"v0": np.ones(2)})
    return src


def test_convert_experts_messages_name_the_command_flags(tmp_path, capsys):
    src = _two_experts(tmp_path / "src")
    out = tmp_path / "out"
    assert main(["convert-experts", str(src), "--out", str(out)]) == 0
    capsys.readouterr()
    assert main(["convert-experts", str(src), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "pass --overwrite to replace it" in err and "overwrite=True" not in err
    with pytest.raises(FileExistsError, match="pass overwrite=True"):
        convert_experts(src, out)

    _dump(src / "sub" / "rgb.pkl", {"v0": np.ones(3)})  # two files named rgb
    assert main(["convert-experts", str(src), "--out", str(tmp_path / "o2")]) == 2
    err = capsys.readouterr().err
    assert "name the experts with --experts NAME=PATH" in err and "experts={" not in err
    with pytest.raises(DataFormatError, match=r"experts=\{name: relative path\}"):
        convert_experts(src, tmp_path / "o2")
    # what the message says to pass works
    argv = ["convert-experts", str(src), "--out", str(tmp_path / "o2")]
    assert main([*argv, "--experts", "rgb=rgb.pkl,rgb2=sub/rgb.pkl"]) == 0

    bad = _two_experts(tmp_path / "bad")
    _dump(bad / "a b.pkl", {"v0": np.ones(3)})
    assert main(["convert-experts", str(bad), "--out", str(tmp_path / "o3")]) == 2
    err = capsys.readouterr().err
    assert "is not an expert name" in err and "pass --experts NAME=PATH" in err
    assert (
        main(
            ["convert-experts", str(bad), "--out", str(tmp_path / "o3"), "--experts", "ab=a b.pkl"]
        )
        == 0
    )
    with pytest.raises(DataFormatError, match=r"pass experts=\{name: \.\.\.\}"):
        convert_experts(bad, tmp_path / "o4")


def test_convert_experts_experts_option_needs_a_name_and_path_in_every_pair(tmp_path, capsys):
    src = _two_experts(tmp_path / "src")
    with pytest.raises(SystemExit) as bad:
        main(["convert-experts", str(src), "--out", str(tmp_path / "o"), "--experts", "rgb=,aud"])
    assert bad.value.code == 2 and "NAME=PATH" in capsys.readouterr().err
