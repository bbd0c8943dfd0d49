"""Fault and bad-input cases of evaluation (issue 26): re-scoring settings that underflow,
output paths checked before the work, missing extras, non-finite test features, titles and
caption counts of eval and compare, and a stalled torchrun rank.

Each case was a traceback, a hang or a silent wrong number before; the tests pin the one-line
error or the held behaviour.
"""

from __future__ import annotations

import decimal
import json
import math
import os
import shutil
import signal
import socket
import sys
import time
from decimal import Decimal
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.multiprocessing as mp
import yaml

import vlret.analysis.compare.report as compare_report
import vlret.eval
import vlret.run.evaluate as evaluate_module
from fault_helpers import read_only_folder
from train_helpers import tiny_config, tiny_data, tiny_msrvtt_run_config, tiny_raw
from vlret.cli import main
from vlret.eval import get_protocol
from vlret.metrics import (
    Rescoring,
    coco_5fold_metrics,
    extended_metrics,
    metrics_from_ranks,
    qb_norm,
    rescored_metrics,
    retrieval_metrics,
    retrieval_metrics_from_similarity,
    similarity_stats,
    subset_recalls,
)
from vlret.metrics.rescore import RescoreParameterError, dual_softmax_rank_keys
from vlret.run import ConfigError
from vlret.run.devices import DIST_TIMEOUT
from vlret.train.parallel.distributed import (
    DistributedTimeout,
    explain_timeout,
    gather_with_grad,
    init_distributed,
)

# -- DSL and QB-Norm at extreme settings, against exact (decimal) truth -------------------------

#: decimal context wide enough for exp(-(s_max - s) / T) at T = 1e-30 (exponents ~ -1e30)
EXACT = decimal.Context(prec=40, Emin=decimal.MIN_EMIN, Emax=decimal.MAX_EMAX)


def scores(n_img: int, per_image: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Cosine-like float64 scores (matching pairs higher), some negative and one exactly 0."""
    g = torch.Generator().manual_seed(seed)
    t2i = torch.arange(n_img).repeat_interleave(per_image)
    sim = torch.rand(n_img, n_img * per_image, generator=g, dtype=torch.float64) * 1.6 - 0.8
    sim[t2i, torch.arange(t2i.numel())] += 0.3
    sim[0, -1] = 0.0
    return sim, t2i


def _exact_key(s: Decimal, log_prior: Decimal) -> tuple[int, Decimal]:
    """An exact product ``s * exp(log_prior)`` as a comparable key: its sign, then its log
    (positive) or minus its log (negative)."""
    if s == 0:
        return (1, Decimal(0))
    log_mag = abs(s).ln() + log_prior
    return (2, log_mag) if s > 0 else (0, -log_mag)


def _log_softmax(z: list[Decimal]) -> list[Decimal]:
    top = max(z)
    log_sum = sum((v - top).exp() for v in z).ln()  # terms below 1e-1e18 round to 0
    return [v - top - log_sum for v in z]


def exact_dsl(sim: torch.Tensor, t: float) -> tuple[list, list]:
    """CAMoE's products in 40-digit decimals, as comparable keys (nothing underflows)."""
    T = Decimal(t)
    with decimal.localcontext(EXACT):
        s = [[Decimal(v) for v in row] for row in sim.tolist()]
        z = [[v / T for v in row] for row in s]
        cols = [_log_softmax(list(col)) for col in zip(*z, strict=True)]
        rows = [_log_softmax(row) for row in z]
        i2t = [[_exact_key(v, cols[j][i]) for j, v in enumerate(r)] for i, r in enumerate(s)]
        t2i = [[_exact_key(v, rows[i][j]) for j, v in enumerate(r)] for i, r in enumerate(s)]
    return i2t, t2i


def exact_values(keys: list) -> torch.Tensor:
    def value(key: tuple[int, Decimal]) -> float:
        tier, log = key
        return (
            0.0
            if tier == 1
            else (1 if tier == 2 else -1) * math.exp(float(log if tier == 2 else -log))
        )

    return torch.tensor([[value(k) for k in row] for row in keys], dtype=torch.float64)


def exact_ranks(by_img: list, by_txt: list, t2i: torch.Tensor):
    """The VSE ranks (ties against the query) of exact values."""
    own = t2i.tolist()
    n_img, n_txt = len(by_img), len(by_img[0])
    i2t = []
    for i in range(n_img):
        best = max(by_img[i][j] for j in range(n_txt) if own[j] == i)
        i2t.append(sum(by_img[i][j] >= best for j in range(n_txt) if own[j] != i))
    t2i_ranks = [
        sum(by_txt[a][j] >= by_txt[own[j]][j] for a in range(n_img) if a != own[j])
        for j in range(n_txt)
    ]
    return torch.tensor(i2t), torch.tensor(t2i_ranks)


@pytest.mark.parametrize("t", [0.05, 0.01, 1e-3, 1e-6, 1e-30])
def test_dsl_ranks_equal_exact_products_at_any_temperature(t):
    """Before: T = 1e-6 underflowed every prior to 0: all recalls 0.0, medr = N (silent)."""
    sim, t2i = scores(8, 2, seed=3)
    metrics, _ = rescored_metrics(sim, t2i, Rescoring("dsl", temperature=t))
    want = metrics_from_ranks(*exact_ranks(*exact_dsl(sim, t), t2i))
    assert metrics == want
    assert metrics.i2t_r10 > 0 and metrics.t2i_r10 > 0


def test_dsl_keys_are_the_exact_values_where_nothing_underflows():
    sim, _ = scores(6, 3, seed=4)
    i2t, t2i = dual_softmax_rank_keys(sim, temperature=0.05)
    want_i2t, want_t2i = exact_dsl(sim, 0.05)
    torch.testing.assert_close(i2t, exact_values(want_i2t), rtol=1e-12, atol=0)
    torch.testing.assert_close(t2i, exact_values(want_t2i), rtol=1e-12, atol=0)


def test_dsl_keys_order_each_line_as_the_exact_products_with_ties():
    """A collapsed model (every score equal) and a row of zeros tie exactly, also at 1e-6."""
    sim = torch.full((4, 8), 0.3, dtype=torch.float64)
    sim[1] = 0.0
    sim[2, :4] = -0.2
    i2t, t2i = dual_softmax_rank_keys(sim, temperature=1e-6)
    want_i2t, want_t2i = exact_dsl(sim, 1e-6)
    for got, want, dim in ((i2t, want_i2t, 1), (t2i, want_t2i, 0)):
        lines = got if dim == 1 else got.t()
        exact = want if dim == 1 else [list(c) for c in zip(*want, strict=True)]
        for line, truth in zip(lines.tolist(), exact, strict=True):
            for a in range(len(line)):
                for b in range(len(line)):
                    assert (line[a] >= line[b]) == (truth[a] >= truth[b])


def test_dsl_temperature_too_small_for_float64_is_refused_in_one_line():
    sim, t2i = scores(4, 2, seed=5)
    with pytest.raises(RescoreParameterError, match=r"^temperature 1e-320 is too small") as err:
        rescored_metrics(sim, t2i, Rescoring("dsl", temperature=1e-320))
    assert err.value.param == "temperature" and "\n" not in str(err.value)


def exact_qb_norm(sim: torch.Tensor, bank: torch.Tensor, beta: float) -> list:
    """Static inverted softmax, log eta = beta s - log sum_b exp(beta s_b), in decimals."""
    s = [[Decimal(v) for v in row] for row in sim.tolist()]
    b = [[Decimal(v) for v in row] for row in bank.tolist()]
    B = Decimal(beta)
    with decimal.localcontext(EXACT):
        lse = [sum((B * row[g]).exp() for row in b).ln() for g in range(len(s[0]))]
        return [[B * row[g] - lse[g] for g in range(len(row))] for row in s]


@pytest.mark.parametrize("beta", [20.0, 1e4, 1e8])
def test_qb_norm_holds_at_large_beta(beta):
    """QB-Norm re-scores in log space: a large beta neither underflows nor ties (held)."""
    sim, _ = scores(5, 1, seed=6)
    bank, _ = scores(5, 1, seed=7)
    got = qb_norm(sim, bank[:, :5], beta=beta, dynamic=False)
    want = exact_qb_norm(sim, bank[:, :5], beta)
    for row, truth in zip(got.tolist(), want, strict=True):
        for g, value in enumerate(row):
            assert math.isclose(value, float(truth[g]), rel_tol=1e-12, abs_tol=1e-12 * beta)
        order = sorted(range(len(row)), key=lambda g: (row[g], g))
        assert order == sorted(range(len(row)), key=lambda g: (truth[g], g))


def test_qb_norm_beta_that_overflows_is_refused_in_one_line():
    sim, _ = scores(3, 1, seed=8)
    with pytest.raises(RescoreParameterError, match=r"^beta 1e\+305 is too large"):
        qb_norm(sim, sim, beta=1e305)


# -- output paths before the work, Ctrl-C, missing extras --------------------------------------


def run_cli(*args) -> int:
    return main([str(a) for a in args])


def one_line(err: str, start: str) -> str:
    """The command's stderr: exactly one line, starting with ``start``, no traceback."""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(start), err
    assert "Traceback" not in err
    return lines[0]


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A tiny precomp run (1 epoch) trained by ``vlret train``: ``(data, run folder)``."""
    root = tmp_path_factory.mktemp("faults_eval")
    data = tiny_data(root / "data")
    raw = tiny_raw(data, root / "run")
    raw["train"]["epochs"] = 1
    (root / "run.yaml").write_text(yaml.safe_dump(raw))
    assert run_cli("train", root / "run.yaml") == 0
    return data, root / "run"


def eval_args(trained, *extra) -> list:
    data, run = trained
    return [
        "eval",
        run / "best.pt",
        "--data",
        data,
        "--split",
        "test",
        "--protocol",
        "f30k",
        *extra,
    ]


@pytest.fixture
def no_evaluation(monkeypatch):
    """Fails the test if the evaluation starts (the refusal must come first)."""

    def started(*args, **kwargs):
        raise AssertionError("the evaluation ran before the refusal")

    monkeypatch.setattr(evaluate_module, "prepare_evaluation", started)  # vlret eval's first step
    monkeypatch.setattr(evaluate_module, "run_evaluation", started)


def test_eval_json_into_a_read_only_folder_is_refused_before_the_evaluation(
    trained, tmp_path, capsys, no_evaluation
):
    """Before (issue 26): a PermissionError traceback after the whole evaluation."""
    with read_only_folder(tmp_path / "ro") as folder:
        assert run_cli(*eval_args(trained, "--json", folder / "m.json")) == 2
    line = one_line(capsys.readouterr().err, "vlret eval: ")
    assert "--json" in line and "not writable" in line and str(folder) in line


def test_ctrl_c_during_eval_is_one_line_and_status_130(trained, capsys, monkeypatch):
    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    # while encoding and scoring: after the checkpoint and the split were read (vlret eval
    # calls the evaluation core on what prepare_evaluation built)
    monkeypatch.setattr(vlret.eval, "evaluate", interrupted)
    assert run_cli(*eval_args(trained)) == 130
    assert one_line(capsys.readouterr().err, "vlret eval: ") == "vlret eval: interrupted"


def test_eval_dsl_temperature_below_float64_names_the_flag(trained, capsys):
    assert run_cli(*eval_args(trained, "--rescore", "dsl", "--dsl-temperature", "1e-320")) == 2
    line = one_line(capsys.readouterr().err, "vlret eval: --dsl-temperature 1e-320 is too small")
    assert "float64" in line


def test_eval_dsl_tiny_temperature_reports_real_ranks(trained, tmp_path):
    """Before: on testall (5 images, 25 captions) T = 1e-6 tied every candidate at 0: R@1 0.0
    both ways, i2t medr 21 = every other caption ahead (silent, also in the JSON)."""
    data, run = trained
    base = ["eval", run / "best.pt", "--data", data, "--split", "testall", "--protocol", "coco5k"]
    found = {}
    for t in ("1e-6", "1e-5"):
        out = tmp_path / f"{t}.json"
        args = [*base, "--rescore", "dsl", "--dsl-temperature", t, "--json", out]
        assert run_cli(*args, "--no-progress") == 0
        found[t] = json.loads(out.read_text())["metrics"]
    # both temperatures are in the limit (every prior but the best is e^-1000 or less): the
    # ranks are the same, and not the all-tied ones
    assert found["1e-6"] == found["1e-5"]
    assert found["1e-6"]["i2t_medr"] < 21 and found["1e-6"]["i2t_r1"] > 0


def write_compare_config(tmp_path: Path, data: Path) -> Path:
    raw = tiny_raw(data, tmp_path / "runs")
    raw["train"]["epochs"] = 1
    cfg = tmp_path / "cmp.yaml"
    cfg.write_text(yaml.safe_dump(raw))
    return cfg


@pytest.mark.parametrize("where", ["--out", "output_dir"])
def test_compare_output_folder_that_is_a_file_is_refused_before_training(
    trained, tmp_path, capsys, monkeypatch, where
):
    """Before: a FileExistsError / NotADirectoryError traceback after planning the runs."""

    def trains(*args, **kwargs):
        raise AssertionError("a run trained before the refusal")

    monkeypatch.setattr(compare_report, "run_all", trains)
    data, _ = trained
    cfg = write_compare_config(tmp_path, data)
    blocker = tmp_path / "a_file"
    blocker.write_text("x")
    if where == "--out":
        args = ["compare", cfg, "--losses", "triplet", "--out", blocker]
    else:
        args = ["compare", cfg, "--losses", "triplet", "--set", f"output_dir={blocker}"]
        blocker = blocker / "compare"
    assert run_cli(*args) == 2
    line = one_line(capsys.readouterr().err, "vlret compare: ")
    assert str(blocker) in line and where in line


@pytest.mark.parametrize("command", ["compare", "sweep"])
def test_a_report_folder_in_use_is_refused_naming_the_holder(
    trained, tmp_path, capsys, monkeypatch, command
):
    """Before: two comparisons into one --out raced on spec.json, result.json and the tables
    (each run folder was locked by its trainer, the report folder by nothing)."""
    from vlret.run.lock import acquire_run_lock

    def trains(*args, **kwargs):
        raise AssertionError("a run trained in a folder another comparison holds")

    monkeypatch.setattr(compare_report, "run_all", trains)
    monkeypatch.setattr("vlret.analysis.compare.sweeps.run_all", trains)
    data, _ = trained
    cfg = write_compare_config(tmp_path, data)
    out = tmp_path / "report"
    out.mkdir()
    extra = ["--losses", "triplet"] if command == "compare" else ["--param", "margin=0.1,0.2"]
    holder = acquire_run_lock(out)
    try:
        assert run_cli(command, cfg, *extra, "--out", out) == 2
    finally:
        holder.release()
    line = one_line(capsys.readouterr().err, f"vlret {command}: ")
    assert str(out) in line and "in use by another run" in line and f"pid {os.getpid()}" in line


def test_plot_out_that_is_a_file_is_refused(tmp_path, capsys):
    """Before: a FileExistsError traceback from mkdir, status 1."""
    blocker = tmp_path / "plots"
    blocker.write_text("x")
    assert run_cli("plot", "goal-weights", "--out", blocker) == 2
    line = one_line(capsys.readouterr().err, "vlret plot: ")
    assert str(blocker) in line and "--out" in line


def test_plot_adacl_margins_without_stats_exits_2(tmp_path, capsys):
    assert run_cli("plot", "adacl-margins", "--out", tmp_path) == 2
    assert "--stats" in one_line(capsys.readouterr().err, "vlret plot: ")


@pytest.mark.parametrize("what", ["goal-weights", "adacl-margins"])
def test_plot_without_matplotlib_is_one_line_status_2(tmp_path, capsys, monkeypatch, what):
    """Before: an ImportError traceback, status 1 (the README promises one line, status 2)."""
    stats = tmp_path / "stats.jsonl"
    stats.write_text('{"step": 0, "m1": 1.0, "m2": 0.0, "anchor": 0.5}\n')
    for name in [m for m in sys.modules if m == "matplotlib" or m.startswith("matplotlib.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib fails
    assert run_cli("plot", what, "--out", tmp_path / "out", "--stats", stats) == 2
    line = one_line(capsys.readouterr().err, "vlret plot needs matplotlib")
    assert line == "vlret plot needs matplotlib: pip install 'vlret[plot]'"
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    ("call", "name"),
    [
        (lambda e: retrieval_metrics(e, e, torch.zeros(0, dtype=torch.long)), "img_emb"),
        (lambda e: retrieval_metrics(torch.ones(2, 4), e, []), "txt_emb"),
        (lambda e: coco_5fold_metrics(e, e, torch.zeros(0, dtype=torch.long)), "img_emb"),
        (lambda e: retrieval_metrics_from_similarity(torch.zeros(0, 3), []), "sim"),
        (lambda e: subset_recalls(e, e, txt_to_img=[]), "img_emb"),
        (lambda e: extended_metrics(e, e, torch.zeros(0, 0)), "img_emb"),
        (lambda e: similarity_stats(torch.zeros(0, 0), txt_to_img=[]), "sim"),
    ],
)
def test_metrics_on_empty_input_name_the_argument(call, name):
    """Before: "max() arg is an empty sequence" (retrieval_metrics, subset_recalls) or an
    IndexError from amax (similarity_stats)."""
    with pytest.raises(ValueError, match=rf"^{name} is empty \(shape \(0, \d+\)\)"):
        call(torch.zeros(0, 4))


# -- non-finite test features: the file and row, before encoding --------------------------------


@pytest.fixture(scope="module")
def msrvtt_run(tmp_path_factory):
    """A tiny MSR-VTT run (3 test videos x 4 captions) trained by ``vlret train``:
    ``(data root, run folder)``."""
    root = tmp_path_factory.mktemp("faults_msrvtt")
    data, cfg = tiny_msrvtt_run_config(root)
    assert run_cli("train", cfg) == 0
    return data, root / "run"


def test_eval_nan_in_precomp_test_features_names_file_and_row(trained, tmp_path, capsys):
    """Before: "img_emb contains NaN or inf values" after encoding (no file, no row)."""
    data, run = trained
    copy = tmp_path / "data"
    shutil.copytree(data, copy)
    feats = np.load(copy / "test_ims.npy")
    feats[1, 2, 3] = np.nan
    np.save(copy / "test_ims.npy", feats)
    args = ["eval", run / "best.pt", "--data", copy, "--split", "test", "--protocol", "f30k"]
    assert run_cli(*args) == 2
    line = one_line(capsys.readouterr().err, "vlret eval: ")
    assert f"{copy / 'test_ims.npy'}, row 1: image 1, region 2, dimension 3: NaN" in line


def test_eval_inf_in_msrvtt_test_features_names_file_and_video(msrvtt_run, tmp_path, capsys):
    data, run = msrvtt_run
    copy = tmp_path / "msrvtt"
    shutil.copytree(data, copy)
    ids = (copy / "video_ids.txt").read_text().split()
    row = ids.index("video8")  # a test video (MSRVTT_JSFUSION_test.csv)
    feats = np.load(copy / "video_feats.npy")
    feats[row, 0, 1] = np.inf
    np.save(copy / "video_feats.npy", feats)
    args = ["eval", run / "last.pt", "--data", copy, "--split", "test", "--protocol", "msrvtt-full"]
    assert run_cli(*args) == 2
    line = one_line(capsys.readouterr().err, "vlret eval: ")
    assert f"{copy / 'video_feats.npy'}, row {row}" in line and "inf" in line


# -- titles and caption counts -------------------------------------------------------------------


def test_compare_titles_a_small_split_as_eval_does(trained, tmp_path, capsys):
    """Before: table.md said "cmp: f30k test" for a 2-image split that eval titles as not the
    paper's test set."""
    data, _ = trained
    cfg = write_compare_config(tmp_path, data)
    out = tmp_path / "cmp"
    assert run_cli("compare", cfg, "--losses", "triplet", "--out", out, "--no-progress") == 0
    capsys.readouterr()
    title = (out / "table.md").read_text(encoding="utf-8").splitlines()[0]
    want = get_protocol("f30k").title_for("test", 2, 10)
    assert want.startswith("Flickr30K 1K protocol on test split of 2 images x 10 texts (not")
    assert want in title and "f30k test" not in title
    assert run_cli(*eval_args(trained)) == 0
    assert want in capsys.readouterr().out  # the same words as vlret eval's table


def test_msrvtt_titles_count_videos(msrvtt_run, tmp_path, capsys):
    """Before: "MSR-VTT full protocol on test split of 3 images x 12 texts"."""
    data, run = msrvtt_run
    args = ["eval", run / "last.pt", "--data", data, "--split", "test", "--protocol", "msrvtt-full"]
    assert run_cli(*args) == 0
    printed = capsys.readouterr().out
    assert "MSR-VTT full protocol on test split of 3 videos x 12 texts" in printed
    assert "images" not in printed.splitlines()[0]


def one_caption_copy(data: Path, dest: Path) -> Path:
    """``data`` with only the first caption of each image in every split."""
    shutil.copytree(data, dest)
    for caps in dest.glob("*_caps.txt"):
        ids = caps.with_name(caps.name.replace("_caps.txt", "_ids.txt"))
        lines, id_lines = caps.read_text().splitlines(), ids.read_text().splitlines()
        caps.write_text("\n".join(lines[::5]) + "\n")
        if len(id_lines) == len(lines):  # one id per caption
            ids.write_text("\n".join(id_lines[::5]) + "\n")
    return dest


def test_eval_captions_per_image_overrides_the_stored_count(trained, tmp_path, capsys):
    """Before: a model trained with 5 captions per image could not be tested on 1-caption data
    (nor 1 on 5): eval read the count from the checkpoint and had no option."""
    data, run = trained
    copy = one_caption_copy(data, tmp_path / "one")
    base = ["eval", run / "best.pt", "--data", copy, "--split", "test", "--protocol", "f30k"]
    assert run_cli(*base) == 2
    assert "5 per image" in one_line(capsys.readouterr().err, "vlret eval: ")
    out = tmp_path / "m.json"
    assert run_cli(*base, "--captions-per-image", "1", "--json", out) == 0
    record = json.loads(out.read_text())
    assert (record["n_images"], record["n_texts"]) == (2, 2)


def test_eval_captions_per_video_overrides_the_stored_count(msrvtt_run, tmp_path, capsys):
    data, run = msrvtt_run
    out = tmp_path / "m.json"
    args = ["eval", run / "last.pt", "--data", data, "--split", "test", "--protocol", "msrvtt-full"]
    assert run_cli(*args, "--captions-per-video", "2", "--json", out) == 0
    record = json.loads(out.read_text())
    assert (record["n_images"], record["n_texts"]) == (3, 6)
    assert "3 videos x 6 texts" in record["title"]


def test_eval_caption_count_of_another_format_is_refused(trained, capsys):
    assert run_cli(*eval_args(trained, "--captions-per-video", "2")) == 2
    line = one_line(capsys.readouterr().err, "vlret eval: captions_per_video: only used with")
    assert "precomp data" in line


# -- a stalled torchrun rank ---------------------------------------------------------------------

#: train.dist_timeout of the stall test (seconds): short, but above a loaded CI machine's jitter
STALL_TIMEOUT = 3.0


def stall_worker(rank: int, port: int, out: str) -> None:
    """Rank 1 joins the group and stops itself (SIGSTOP); rank 0 all-gathers and records what
    happened. Rank 0 leaves with ``os._exit``: a clean shutdown would wait for the stopped rank."""
    os.environ.update(
        RANK=str(rank),
        WORLD_SIZE="2",
        LOCAL_RANK=str(rank),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
    )
    torch.set_num_threads(1)
    init_distributed(backend="gloo", timeout=STALL_TIMEOUT)
    if rank == 1:
        os.kill(os.getpid(), signal.SIGSTOP)
        return
    start = time.monotonic()
    try:
        gather_with_grad(torch.ones(2, 3))
        outcome = "returned"
    except DistributedTimeout as err:
        outcome = str(err)
    except BaseException as err:  # noqa: BLE001 - recorded for the assertion
        outcome = f"{type(err).__name__}: {err}"
    waited = time.monotonic() - start
    Path(out, "rank0.txt").write_text(f"{waited}\n{outcome}", encoding="utf-8")
    os._exit(0)


def test_a_stopped_rank_ends_the_others_with_one_line_after_dist_timeout(tmp_path):
    """Before: rank 0 waited in the all-gather forever (torch's gloo default: 30 minutes, and
    train.dist_timeout did not exist)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    context = mp.start_processes(
        stall_worker, args=(port, str(tmp_path)), nprocs=2, join=False, start_method="spawn"
    )
    rank0, rank1 = context.processes
    try:
        rank0.join(timeout=120)  # the guard of a regression (a wait without end), not a timing
        assert rank0.exitcode == 0, "rank 0 did not end: the stalled rank still blocks it"
    finally:
        for p in (rank0, rank1):
            if p.is_alive():
                os.kill(p.pid, signal.SIGKILL)
            p.join()
    waited, message = (tmp_path / "rank0.txt").read_text(encoding="utf-8").split("\n", 1)
    assert float(waited) >= 0.9 * STALL_TIMEOUT  # it waited for the rank, then gave up
    assert "\n" not in message
    assert message.startswith("rank 0: all_gather waited 3 s for rank 1, which stopped or is")
    assert "train.dist_timeout = 3 s" in message


def test_dist_timeout_is_a_checked_config_key(tmp_path):
    data = tiny_data(tmp_path / "data")
    assert tiny_config(data, tmp_path / "run").train.dist_timeout == DIST_TIMEOUT == 600.0
    assert tiny_config(data, tmp_path / "run", ["train.dist_timeout=5"]).train.dist_timeout == 5.0
    for bad in ("0", "-1", "inf"):
        with pytest.raises(ConfigError, match=r"train\.dist_timeout: expected"):
            tiny_config(data, tmp_path / "run", [f"train.dist_timeout={bad}"])


def test_the_trainer_passes_dist_timeout_to_the_process_group(tmp_path, monkeypatch):
    """The config key reaches ``init_distributed`` (a key that is validated but never used
    would leave every torchrun job at the default)."""
    import vlret.train.trainer as trainer_module

    seen: list[float] = []
    real = trainer_module.init_distributed

    def recording(*, timeout=None, **kwargs):
        seen.append(timeout)
        return real(timeout=timeout, **kwargs)

    monkeypatch.setattr(trainer_module, "init_distributed", recording)
    data = tiny_data(tmp_path / "data")
    trainer_module.Trainer(tiny_config(data, tmp_path / "run", ["train.dist_timeout=7"])).close()
    assert seen == [7.0]


def test_explain_timeout_words_a_backend_timeout_and_leaves_other_errors():
    gloo = RuntimeError("[gloo/transport/tcp/pair.cc:598] Timed out waiting 3000ms for recv")
    explained = explain_timeout(gloo, "DDP's gradient all-reduce")
    assert isinstance(explained, DistributedTimeout)
    assert "train.dist_timeout" in str(explained) and "DDP's gradient all-reduce" in str(explained)
    other = RuntimeError("CUDA out of memory")
    assert explain_timeout(other) is other


def test_vlret_train_prints_a_collective_timeout_in_one_line(tmp_path, capsys, monkeypatch):
    """What rank 0 of ``torchrun ... vlret train`` prints when its collective times out."""
    import vlret.train as train_package

    def stalled(*args, **kwargs):
        raise explain_timeout(RuntimeError("Timed out waiting 3000ms for recv"), "all_gather")

    monkeypatch.setattr(train_package, "train", stalled)
    data = tiny_data(tmp_path / "data")
    cfg = tmp_path / "run.yaml"
    cfg.write_text(yaml.safe_dump(tiny_raw(data, tmp_path / "run")))
    assert run_cli("train", cfg) == 2
    line = one_line(capsys.readouterr().err, "vlret train: rank 0: all_gather waited 600 s for")
    assert "train.dist_timeout = 600 s" in line and "the other ranks, which stopped" in line
