"""Fault pass on output and input paths (issue 39 items 1, 2, 4, 5, 13, 14): the run lock never
follows a link, no writer renames over something that is not a regular file, ``--overwrite``
never deletes a run's own inputs, a refused run writes nothing, the lock's takeover note tells
a live unrelated process from the holder, and every command refuses an existing output
without ``--overwrite`` (docs/training.md, "Output and input paths")."""

from __future__ import annotations

import dataclasses
import json
import os
import socket
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from train_helpers import tiny_config, tiny_data, tiny_raw
from vlret._files import (
    OutputPathError,
    atomic_write,
    atomic_write_text,
    check_output_dir,
    check_output_file,
)
from vlret.cli import main
from vlret.data.config import DataConfig
from vlret.run.config import ConfigError, TrainConfig
from vlret.run.folder import (
    DATA_INPUT_KEYS,
    TRAIN_INPUT_KEYS,
    RunFolderError,
    run_input_paths,
)
from vlret.run.lock import (
    LOCK_FILE,
    LockFileRefused,
    _boot_id,
    _proc_start,
    acquire_run_lock,
    takeover_note,
)
from vlret.train import Trainer

QUICK = ["train.epochs=1", "train.validate=false"]


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    return tiny_data(tmp_path_factory.mktemp("data"))


@pytest.fixture(scope="module")
def trained(tmp_path_factory, data) -> Path:
    """A finished tiny run folder (config.yaml, vocab.json, metrics.jsonl, last.pt, best.pt)."""
    out = tmp_path_factory.mktemp("trained") / "run"
    Trainer(tiny_config(data, out, QUICK)).fit()
    return out


def _one_line(err: str) -> str:
    lines = [x for x in err.splitlines() if x.strip()]
    assert len(lines) == 1, err
    assert "Traceback" not in err
    return lines[0]


def _specials(folder: Path) -> dict[str, Path]:
    """A FIFO, a socket, a folder and two symbolic links (to a file inside the folder and to
    one outside it), each made as any user can."""
    folder.mkdir(parents=True, exist_ok=True)
    made = {"fifo": folder / "fifo", "dir": folder / "dir", "socket": folder / "sock"}
    os.mkfifo(made["fifo"])
    made["dir"].mkdir()
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(made["socket"]))
    sock.close()  # the socket file stays
    inside = folder / "inside.txt"
    inside.write_text("inside")
    outside = folder.parent / f"{folder.name}-outside.txt"
    outside.write_text("outside")
    made["link_inside"] = folder / "link_inside"
    made["link_inside"].symlink_to(inside)
    made["link_outside"] = folder / "link_outside"
    made["link_outside"].symlink_to(outside)
    made["link_dangling"] = folder / "link_dangling"
    made["link_dangling"].symlink_to(folder / "nowhere")
    return made


def _kind(path: Path) -> int:
    return stat.S_IFMT(os.lstat(path).st_mode)


# --------------------------------------------------------------------------------------------
# Item 2: no writer renames over what is not a regular file
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "which", ["fifo", "dir", "socket", "link_inside", "link_outside", "link_dangling"]
)
def test_atomic_write_refuses_what_is_not_a_regular_file_and_leaves_it(tmp_path, which):
    target = _specials(tmp_path / "out")[which]
    before = _kind(target)
    with pytest.raises(OutputPathError, match=f"^{target}: is a") as err:
        atomic_write_text(target, "new")
    assert len(str(err.value).splitlines()) == 1
    assert _kind(target) == before  # still the FIFO, folder, socket or link it was
    assert (tmp_path / "out-outside.txt").read_text() == "outside"
    assert (tmp_path / "out" / "inside.txt").read_text() == "inside"
    assert not (tmp_path / "nowhere").exists() and not (tmp_path / "out" / "nowhere").exists()
    assert not list((tmp_path / "out").glob(".*.tmp"))  # the temporary file is gone


def test_atomic_write_refuses_a_special_file_put_in_place_during_the_write(tmp_path):
    target = tmp_path / "m.json"

    def write(fh):  # the path becomes a FIFO while the content is written
        os.mkfifo(target)
        fh.write(b"{}")

    with pytest.raises(OutputPathError, match="FIFO"):
        atomic_write(target, write)
    assert stat.S_ISFIFO(os.lstat(target).st_mode)


def test_atomic_write_still_replaces_a_regular_file(tmp_path):
    target = tmp_path / "a.txt"
    target.write_text("old")
    atomic_write_text(target, "new")
    assert target.read_text() == "new"


def test_a_character_device_is_refused_up_front_and_by_the_writer(tmp_path):
    device = tmp_path / "null"
    try:
        os.mknod(device, 0o666 | stat.S_IFCHR, os.makedev(1, 3))  # what /dev/null is
    except PermissionError:
        pytest.skip("mknod of a character device is not permitted here (not root)")
    with pytest.raises(OutputPathError, match="--out is a character device, not a regular"):
        check_output_file(device, "--out", "x.npz", overwrite=True)
    with pytest.raises(OutputPathError, match="is a character device"):
        atomic_write_text(device, "x")
    assert stat.S_ISCHR(os.lstat(device).st_mode)


@pytest.mark.parametrize("which", ["fifo", "socket", "link_inside", "link_outside", "dir"])
def test_check_output_file_refuses_before_the_work_even_with_overwrite(tmp_path, which):
    target = _specials(tmp_path / "out")[which]
    with pytest.raises(OutputPathError, match=f"^{target}: --json is a"):
        check_output_file(target, "--json", "m.json", overwrite=True)


def test_an_existing_output_needs_overwrite_and_a_folder_output_checks_its_files(tmp_path):
    existing = tmp_path / "m.json"
    existing.write_text("{}")
    with pytest.raises(OutputPathError, match=r"m\.json: --json exists; pass --overwrite"):
        check_output_file(existing, "--json", overwrite=False)
    assert check_output_file(existing, "--json", overwrite=True) == existing
    folder = tmp_path / "plots"
    folder.mkdir()
    (folder / "curves.md").write_text("old")
    with pytest.raises(OutputPathError, match="--out holds curves.md already; pass --overwrite"):
        check_output_dir(folder, "--out", files=["a.png", "curves.md"], overwrite=False)
    (folder / "curves.md").unlink()
    (folder / "curves.md").symlink_to(existing)
    with pytest.raises(OutputPathError, match="symbolic link"):
        check_output_dir(folder, "--out", files=["curves.md"], overwrite=True)
    link = tmp_path / "linked"  # a link to a folder is a folder to write in
    link.symlink_to(folder, target_is_directory=True)
    assert check_output_dir(link, "--out") == link


def test_cli_json_outputs_follow_the_one_rule(tmp_path, trained, data, capsys):
    specials = _specials(tmp_path / "x")
    ckpt = str(trained / "last.pt")
    base = ["eval", ckpt, "--data", str(data), "--split", "test", "--protocol", "f30k"]
    base += ["--no-progress", "--device", "cpu", "--json"]
    for which in ("fifo", "link_outside", "socket"):
        assert main([*base, str(specials[which]), "--overwrite"]) == 2
        line = _one_line(capsys.readouterr().err)
        assert line.startswith(f"vlret eval: {specials[which]}: --json is a")
    assert (tmp_path / "x-outside.txt").read_text() == "outside"
    existing = tmp_path / "m.json"
    existing.write_text("old")
    assert main([*base, str(existing)]) == 2
    assert "exists; pass --overwrite" in _one_line(capsys.readouterr().err)
    assert existing.read_text() == "old"
    assert main([*base, str(existing), "--overwrite"]) == 0
    assert isinstance(json.loads(existing.read_text()), dict)  # the record replaced "old"


def test_cli_mine_negatives_refuses_an_existing_out_and_a_fifo(tmp_path, trained, data, capsys):
    out = tmp_path / "neg.npz"
    args = ["mine-negatives", str(trained / "last.pt"), "--data", str(data), "--k", "2"]
    args += ["--device", "cpu", "--no-progress", "--out"]
    assert main([*args, str(out)]) == 0
    first = out.read_bytes()
    capsys.readouterr()
    assert main([*args, str(out)]) == 2  # before: replaced silently
    assert "exists; pass --overwrite to replace it" in _one_line(capsys.readouterr().err)
    assert main([*args, str(out), "--overwrite"]) == 0
    assert out.read_bytes() == first
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    capsys.readouterr()
    assert main([*args, str(fifo), "--overwrite"]) == 2
    assert "FIFO" in _one_line(capsys.readouterr().err)
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)


# --------------------------------------------------------------------------------------------
# Item 1: the run lock never follows a link
# --------------------------------------------------------------------------------------------


def test_a_symlinked_lock_file_is_refused_and_what_it_leads_to_is_untouched(tmp_path, data):
    out = tmp_path / "run"
    out.mkdir()
    victim = tmp_path / "precious.txt"
    victim.write_text("precious")
    (out / LOCK_FILE).symlink_to(victim)
    with pytest.raises(LockFileRefused, match="the run lock is a symbolic link"):
        acquire_run_lock(out)
    with pytest.raises(LockFileRefused):
        Trainer(tiny_config(data, out, QUICK))
    assert victim.read_text() == "precious"
    assert (out / LOCK_FILE).is_symlink()  # not removed at exit either


def test_a_hard_linked_lock_file_is_refused_and_its_other_name_untouched(tmp_path):
    """Before: a hard link at output_dir/.vlret.lock was opened as the lock, so the file behind
    its other name was truncated, filled with the lock record, and the name removed at exit."""
    out = tmp_path / "run"
    out.mkdir()
    victim = tmp_path / "precious.txt"
    victim.write_text("precious")
    os.link(victim, out / LOCK_FILE)
    with pytest.raises(LockFileRefused, match=r"the run lock is a hard link \(2 names"):
        acquire_run_lock(out)
    assert victim.read_text() == "precious" and (out / LOCK_FILE).exists()


def test_an_unreadable_lock_file_is_not_called_a_run_no_longer_running(tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    (out / LOCK_FILE).write_bytes(b"\xff\xfe garbage")
    notes: list[str] = []
    acquire_run_lock(out, notify=notes.append).release()
    assert len(notes) == 1 and "no longer running" not in notes[0]
    assert "records no holder vlret can read" in notes[0]


def test_a_dangling_lock_link_creates_nothing_through_the_cli(tmp_path, data, capsys):
    out = tmp_path / "run"
    out.mkdir()
    (out / LOCK_FILE).symlink_to(tmp_path / "created-through-the-link")
    cfg = tmp_path / "c.yaml"
    raw = tiny_raw(data, out)
    raw["train"].update(epochs=1, validate=False)
    cfg.write_text(yaml.safe_dump(raw))
    assert main(["train", str(cfg)]) == 2
    line = _one_line(capsys.readouterr().err)
    assert line.startswith(f"vlret train: {out / LOCK_FILE}: the run lock is a symbolic link")
    assert not (tmp_path / "created-through-the-link").exists()
    assert (out / LOCK_FILE).is_symlink()


@pytest.mark.parametrize("kind", ["fifo", "dir"])
def test_a_lock_path_that_is_a_fifo_or_folder_is_refused(tmp_path, kind):
    out = tmp_path / "run"
    out.mkdir()
    lock = out / LOCK_FILE
    os.mkfifo(lock) if kind == "fifo" else lock.mkdir()
    with pytest.raises(LockFileRefused, match="the run lock is a"):
        acquire_run_lock(out)
    assert (stat.S_ISFIFO if kind == "fifo" else stat.S_ISDIR)(os.lstat(lock).st_mode)


def test_release_never_removes_a_link_put_in_place_of_the_lock(tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    lock = acquire_run_lock(out)
    moved = tmp_path / "moved.lock"
    os.replace(out / LOCK_FILE, moved)  # the locked file now lives elsewhere ...
    (out / LOCK_FILE).symlink_to(moved)  # ... and a link to it takes its place
    lock.release()
    assert (out / LOCK_FILE).is_symlink() and moved.is_file()


# --------------------------------------------------------------------------------------------
# Item 13: the takeover note tells a live unrelated process from the holder
# --------------------------------------------------------------------------------------------


@pytest.fixture
def sleeper():
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        yield proc
    finally:
        proc.kill()
        proc.wait()


def _proc_ready(pid: int) -> None:
    for _ in range(200):  # the child's cmdline is set once it has exec'd
        if b"time.sleep" in Path(f"/proc/{pid}/cmdline").read_bytes():
            return
        time.sleep(0.01)


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs Linux /proc")
def test_the_lock_of_a_pid_now_running_another_process_is_not_called_gone(tmp_path, sleeper):
    _proc_ready(sleeper.pid)
    out = tmp_path / "run"
    out.mkdir()
    host = socket.gethostname()
    stale = {"pid": sleeper.pid, "host": host, "since": "2020-01-01", "command": "vlret train c"}
    stale["proc_start"] = _proc_start(sleeper.pid) - 1  # the holder started earlier
    (out / LOCK_FILE).write_text(json.dumps(stale))
    notes: list[str] = []
    acquire_run_lock(out, notify=notes.append).release()
    assert len(notes) == 1
    assert notes[0].startswith(f"{out}: took over the lock left by a run that is no longer running")
    assert f"pid {sleeper.pid} is now another process (command: " in notes[0]
    assert "time.sleep(60)" in notes[0]
    # the same pid with the holder's own start: it runs, but let the lock go
    note = takeover_note(
        out, {**stale, "proc_start": _proc_start(sleeper.pid), "boot_id": _boot_id()}
    )
    assert f"released by pid {sleeper.pid}, which still runs but no longer holds it" in note
    # a lock file without a recorded start (an older vlret): said so, not called gone
    del stale["proc_start"]
    note = takeover_note(out, stale)
    assert "records no start" in note and "no longer running" not in note


def test_the_lock_records_the_holders_start_and_boot(tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    lock = acquire_run_lock(out)
    try:
        holder = json.loads((out / LOCK_FILE).read_text())
    finally:
        lock.release()
    if Path("/proc/self/stat").exists():
        assert holder["proc_start"] == _proc_start(os.getpid())
        assert holder["boot_id"] == _boot_id()
    assert holder["pid"] == os.getpid()


# --------------------------------------------------------------------------------------------
# Item 4: --overwrite never deletes an input of the run
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("key", "name"),
    [("train.init_from", "last.pt"), ("data.noise_index", "noise_index.npy")],
)
def test_overwrite_refuses_to_clear_the_folder_an_input_is_read_from(
    tmp_path, data, trained, key, name
):
    import shutil

    out = tmp_path / "run"
    shutil.copytree(trained, out)
    if name == "noise_index.npy":
        import numpy as np

        np.save(out / name, np.arange(40) // 5)  # NCR's layout: one image per caption
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    with pytest.raises(RunFolderError, match=rf"{key} = {out / name} is read from"):
        Trainer(tiny_config(data, out, [*QUICK, f"{key}={out / name}"]), overwrite=True)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before  # nothing deleted


def test_every_path_key_of_the_config_is_an_input_the_overwrite_checks():
    """A path key added to DataConfig or TrainConfig later must join the input keys."""
    not_paths = {
        "data": {
            "format", "train_split", "dev_split", "protocol", "train_transform",
            "crop_interpolation", "csv_img_key", "csv_caption_key", "csv_separator",
            "noise_format", "experts", "person_transform", "text_augment",
        },
        "train": {
            "device", "zeroshot_dataset", "zeroshot_split", "zeroshot_templates", "freeze_bn",
            "select_on", "procedure", "exchange", "amp", "compile", "freeze", "lock",
        },
    }  # fmt: skip
    sections = (("data", DataConfig, DATA_INPUT_KEYS), ("train", TrainConfig, TRAIN_INPUT_KEYS))
    for section, cls, keys in sections:
        types = {f.name: str(f.type) for f in dataclasses.fields(cls)}
        strings = {name for name, t in types.items() if "str" in t and "dict" not in t}
        assert strings - not_paths[section] - set(keys) == set(), section


def test_run_input_paths_names_each_key(tmp_path, data):
    config = tiny_config(
        data,
        tmp_path / "run",
        [
            "data.train_captions=c.txt",
            "train.init_from=i.pt",
        ],
    )
    config.model["text"]["path"] = "bert-dir"
    config.data.shards = ["s/{00000..00003}.tar", "pipe:curl x", "https://h/a.tar"]
    paths = run_input_paths(config, resume="r/last.pt")
    assert paths["data.shards"] == ["s/"]
    assert paths["data.train_captions"] == ["c.txt"]
    assert paths["train.init_from"] == ["i.pt"]
    assert paths["model.text.path"] == ["bert-dir"]
    assert paths["--resume"] == ["r/last.pt"]
    assert paths["data.root"] == [str(data)]


# --------------------------------------------------------------------------------------------
# Item 5: a refused run writes nothing; the hint names only files that are there
# --------------------------------------------------------------------------------------------


COSINE_TOO_LONG = [
    *QUICK,
    "optim.schedule=cosine",
    "optim.decay_epochs=[]",
    "optim.warmup_steps=1000",
]


def test_a_run_refused_by_a_late_check_leaves_no_folder_and_the_retry_starts(tmp_path, data):
    out = tmp_path / "run"
    with pytest.raises(ConfigError, match="optim.warmup_steps.*1000 must be below the run's"):
        Trainer(tiny_config(data, out, COSINE_TOO_LONG))
    assert not out.exists()  # before: config.yaml, vocab.json and metrics.jsonl
    Trainer(tiny_config(data, out, QUICK)).fit()  # no --overwrite, no --resume needed
    assert (out / "last.pt").is_file()
    nested = tmp_path / "runs" / "exp" / "seed0"  # the parents it made go too
    with pytest.raises(ConfigError, match="optim.warmup_steps"):
        Trainer(tiny_config(data, nested, COSINE_TOO_LONG))
    assert not (tmp_path / "runs").exists()


def test_overwrite_deletes_nothing_when_the_new_run_is_refused(tmp_path, data, trained):
    import shutil

    out = tmp_path / "run"
    shutil.copytree(trained, out)
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    with pytest.raises(ConfigError, match="optim.warmup_steps"):
        Trainer(tiny_config(data, out, COSINE_TOO_LONG), overwrite=True)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before


def test_the_held_run_hint_names_no_checkpoint_that_is_not_there(tmp_path, data, trained):
    out = tmp_path / "run"
    out.mkdir()
    (out / "config.yaml").write_text((trained / "config.yaml").read_text())
    with pytest.raises(RunFolderError) as err:
        Trainer(tiny_config(data, out, QUICK))
    assert "last.pt" not in str(err.value)
    assert "it holds no checkpoint to continue from; replace it with --overwrite" in str(err.value)
    (out / "last.pt").write_bytes((trained / "last.pt").read_bytes())
    with pytest.raises(RunFolderError, match=rf"continue it with --resume {out / 'last.pt'}"):
        Trainer(tiny_config(data, out, QUICK))


# --------------------------------------------------------------------------------------------
# Item 14: vlret caption
# --------------------------------------------------------------------------------------------


def test_caption_has_no_progress_and_keeps_the_whole_load_error(tmp_path, monkeypatch):
    transformers = pytest.importorskip("transformers")
    from vlret.captioning.generate import Captioner, CaptioningError
    from vlret.cli import build_parser

    args = build_parser().parse_args(
        ["caption", "m", "--data", "d", "--split", "train", "--out", "o", "--no-progress"]
    )
    assert args.no_progress is True
    long = "x" * 300 + " does not appear to have a file named preprocessor_config.json"

    def refuse(*a, **k):
        raise OSError(long)

    monkeypatch.setattr(transformers.BlipProcessor, "from_pretrained", refuse)
    (tmp_path / "vocab.txt").write_text("[PAD]\n")  # past the tokenizer-files check
    with pytest.raises(CaptioningError) as err:
        Captioner(tmp_path, "blip", device=__import__("torch").device("cpu"), dtype=None)
    assert "preprocessor_config.json" in str(err.value)
    assert len(str(err.value).splitlines()) == 1


def test_a_partial_folder_without_chunks_does_not_refuse_another_model(tmp_path):
    from vlret.captioning.generate import _prepare_partial

    partial = tmp_path / "caps.txt.partial"
    _prepare_partial(partial, {"model_dir": "a"}, overwrite=False)  # a load that then failed
    _prepare_partial(partial, {"model_dir": "b"}, overwrite=False)  # before: refused
    assert json.loads((partial / "settings.json").read_text()) == {"model_dir": "b"}
    (partial / "chunk_000000.json").write_text("{}")  # a chunk written: kept and refused
    with pytest.raises(ValueError, match="holds the chunks of a run with other settings"):
        _prepare_partial(partial, {"model_dir": "c"}, overwrite=False)


def test_cli_report_and_plot_refuse_files_already_in_their_out_folder(
    tmp_path, trained, data, capsys
):
    out = tmp_path / "report"
    out.mkdir()
    (out / "report.json").write_text("old")
    args = ["report", str(trained / "last.pt"), "--data", str(data), "--split", "test"]
    args += ["--protocol", "f30k", "--device", "cpu", "--no-progress", "--out", str(out)]
    assert main(args) == 2  # before: replaced after the evaluation
    assert _one_line(capsys.readouterr().err) == (
        f"vlret report: {out}: --out holds report.json already; pass --overwrite to replace it"
    )
    assert (out / "report.json").read_text() == "old"
    assert main([*args, "--overwrite"]) == 0
    assert json.loads((out / "report.json").read_text())
    pytest.importorskip("matplotlib")
    plots = tmp_path / "plots"
    assert main(["plot", "curves", str(trained), "--out", str(plots)]) == 0
    capsys.readouterr()
    assert main(["plot", "curves", str(trained), "--out", str(plots)]) == 2
    assert "--out holds training_curves.png already" in _one_line(capsys.readouterr().err)
    assert main(["plot", "curves", str(trained), "--out", str(plots), "--overwrite"]) == 0


def test_a_partial_folder_that_is_a_link_is_refused_not_followed(tmp_path):
    from vlret.captioning.generate import CaptioningError, _prepare_partial

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "keep.txt").write_text("keep")
    partial = tmp_path / "caps.txt.partial"
    partial.symlink_to(elsewhere, target_is_directory=True)
    for overwrite in (False, True):  # before: rmtree raised OSError (a traceback)
        with pytest.raises(CaptioningError, match="symbolic link or a file"):
            _prepare_partial(partial, {"model_dir": "a"}, overwrite=overwrite)
    assert (elsewhere / "keep.txt").read_text() == "keep" and partial.is_symlink()


def test_cli_overwrite_with_init_from_inside_the_folder_is_one_line(tmp_path, data, trained):
    import shutil

    out = tmp_path / "run"
    shutil.copytree(trained, out)
    cfg = tmp_path / "c.yaml"
    raw = tiny_raw(data, out)
    raw["train"].update(epochs=1, validate=False)
    cfg.write_text(yaml.safe_dump(raw))
    argv = ["train", str(cfg), "--set", f"train.init_from={out / 'last.pt'}", "--overwrite"]
    proc = subprocess.run(
        [sys.executable, "-m", "vlret", *argv], capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 2
    assert _one_line(proc.stderr) == (
        f"vlret train: {out}: --overwrite would clear the folder that train.init_from = "
        f"{out / 'last.pt'} is read from; move {out / 'last.pt'} out of output_dir first, or "
        "choose another output_dir"
    )
    assert (out / "last.pt").read_bytes() == (trained / "last.pt").read_bytes()


def test_figures_tables_and_thumbnails_are_written_under_the_rule_at_the_write(tmp_path):
    """Before: savefig, t-SNE's CSV and the report's thumbnails wrote through a link planted
    after the command's up-front check (the report's comes minutes before its writes)."""
    pytest.importorskip("matplotlib")
    pil = pytest.importorskip("PIL.Image")
    from vlret.analysis._plotting import new_figure, save_figure
    from vlret.analysis.report.thumbs import write_thumb

    victim = tmp_path / "victim.txt"
    victim.write_text("keep me")
    figure = tmp_path / "out" / "curves.png"
    figure.parent.mkdir()
    figure.symlink_to(victim)
    with pytest.raises(OutputPathError, match="curves.png: is a symbolic link"):
        save_figure(new_figure((2, 2)), figure)
    figure.unlink()
    assert save_figure(new_figure((2, 2)), figure).read_bytes()[:4] == b"\x89PNG"

    picture = tmp_path / "0.png"
    pil.new("RGB", (8, 6), (1, 2, 3)).save(picture)
    dataset = type("D", (), {"image_path": lambda self, i: picture})()
    thumb = tmp_path / "report" / "thumbs" / "0.jpg"
    thumb.parent.mkdir(parents=True)
    thumb.symlink_to(victim)
    with pytest.raises(OutputPathError, match="0.jpg: is a symbolic link"):
        write_thumb(dataset, 0, tmp_path / "report")
    assert victim.read_text() == "keep me"


def test_synth_overwrite_refuses_a_link_inside_the_world_it_rewrites(tmp_path, capsys):
    """Before: `vlret synth --overwrite` wrote train_caps.txt (and images) through a link
    planted in the world folder, into the file it led to."""
    victim = tmp_path / "outside.txt"
    victim.write_text("keep me")
    world = tmp_path / "world"
    world.mkdir()
    (world / "train_caps.txt").symlink_to(victim)
    capsys.readouterr()
    assert main(["synth", "tiny", "--out", str(world), "--overwrite"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "train_caps.txt: is a symbolic link, inside" in err
    assert victim.read_text() == "keep me"


def test_plot_checks_the_files_each_figure_writes():
    """`vlret plot` refuses an existing figure without --overwrite by the names it lists; they
    must be the names the figures are written under."""
    from vlret.analysis.adacl_plots import FIGURE_NAME
    from vlret.analysis.curves import CURVES_TABLE
    from vlret.analysis.epoch_curves import RUN_FIGURE
    from vlret.analysis.goal_plots import GOAL_WEIGHT_FIGURES
    from vlret.cli.plot import FILES

    assert FILES == {
        "goal-weights": GOAL_WEIGHT_FIGURES,
        "adacl-margins": (FIGURE_NAME,),
        "curves": (RUN_FIGURE, CURVES_TABLE),
    }
