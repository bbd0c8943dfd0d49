"""Argument checks of the losses (issue 12): empty batches, constructor parameters declared on
each loss class and checked through the registry without building the loss, AdaCL's queue
dimension, and the AdaCL margins plot on a training run's own metrics log."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from vlret._checks import ParamError, check_similarity
from vlret.analysis.adacl_plots import load_stats, plot_adacl_margins
from vlret.losses import AdaCLLoss, TripletLoss, available_losses, build_loss
from vlret.losses.registry import check_loss_params, loss_class, loss_parameters

NAN, INF = float("nan"), float("inf")

# ----------------------------------------------------------------------------- empty batches


def _losses_with_chunks() -> list[str]:
    return [n for n in available_losses() if "chunk_size" in loss_parameters(n) and n != "vsl"]


@pytest.mark.parametrize("name", available_losses())
def test_empty_batch_names_the_argument_and_zero_rows(name):
    loss = build_loss(name)
    with pytest.raises(ValueError, match=r"img_emb is empty: got 0 rows") as err:
        loss(torch.zeros(0, 8), torch.zeros(0, 8))
    assert "got 1" not in str(err.value)


@pytest.mark.parametrize("name", _losses_with_chunks())
def test_empty_batch_tiled_names_the_argument(name):
    loss = build_loss(name, chunk_size=4)
    with pytest.raises(ValueError, match=r"img_emb is empty: got 0 rows"):
        loss(torch.zeros(0, 8), torch.zeros(0, 8))


def test_empty_text_batch_is_named():
    with pytest.raises(ValueError, match=r"txt_emb is empty: got 0 rows"):
        build_loss("triplet")(torch.zeros(3, 8), torch.zeros(0, 8))


def test_similarity_batch_size_message_says_the_real_size():
    with pytest.raises(ValueError, match=r"sim needs a batch size of at least 2.*got 0"):
        check_similarity(torch.zeros(0, 0))
    with pytest.raises(ValueError, match=r"sim needs a batch size of at least 2.*got 1$"):
        check_similarity(torch.zeros(1, 1))


# ----------------------------------------------------------------------------- parameters

#: (loss, parameter, bad value, words the message must hold): wrong type, non-finite, range.
BAD = [
    ("triplet", "margin", "a", "margin must be a finite number >= 0, got 'a'"),
    ("triplet", "margin", -0.2, "margin must be >= 0, got -0.2"),
    ("triplet", "margin", NAN, "margin must be a finite number >= 0, got nan"),
    ("triplet", "margin", INF, "margin must be a finite number >= 0, got inf"),
    ("triplet", "margin", True, "margin must be a finite number"),
    ("triplet", "margin", None, "margin must be a finite number"),
    ("triplet", "hardest", "yes", "hardest must be a bool"),
    ("triplet", "reduction", "avg", "reduction must be one of"),
    ("triplet", "chunk_size", 0, "chunk_size must be >= 1"),
    ("triplet", "chunk_size", 2.0, "chunk_size must be an integer >= 1 or None"),
    ("infonce", "temperature", 0.0, "temperature must be > 0, got 0.0"),
    ("infonce", "temperature", -0.05, "temperature must be > 0"),
    ("infonce", "temperature", INF, "temperature must be a finite number > 0"),
    ("infonce", "temperature", "0.05", "temperature must be a finite number > 0"),
    ("infonce", "max_scale", 0.5, "max_scale must be >= 1"),
    ("infonce", "max_scale", NAN, "max_scale must be a finite number >= 1"),
    ("infonce", "learnable_temperature", 1, "learnable_temperature must be a bool"),
    ("unified", "margin", -0.1, "margin must be >= 0"),
    ("unified", "margin", NAN, "margin must be a finite number"),
    ("unified", "gamma", 0.0, "gamma must be > 0"),
    ("unified", "gamma", "60", "gamma must be a finite number > 0"),
    ("circle", "margin", NAN, "margin must be a finite number"),
    ("circle", "margin", "0.4", "margin must be a finite number"),
    ("circle", "gamma", -1.0, "gamma must be > 0"),
    ("multi_similarity", "alpha", 0.0, "alpha must be > 0"),
    ("multi_similarity", "beta", INF, "beta must be a finite number > 0"),
    ("multi_similarity", "lam", NAN, "lam must be a finite number"),
    ("multi_similarity", "epsilon", -0.1, "epsilon must be >= 0"),
    ("binomial_deviance", "beta", 0.0, "beta must be > 0"),
    ("binomial_deviance", "lam", "0.5", "lam must be a finite number"),
    ("nca_hard", "tau", 0.0, "tau must be > 0"),
    ("nca_hard", "tau", NAN, "tau must be a finite number > 0"),
    ("goal", "margin", -0.2, "margin must be >= 0"),
    ("goal", "tau", 0.0, "tau must be > 0"),
    ("goal", "alpha", "2", "alpha must be a finite number > 0"),
    ("goal", "beta", -1.0, "beta must be > 0"),
    ("goal", "lam", INF, "lam must be a finite number"),
    ("goal", "epsilon", -0.1, "epsilon must be >= 0"),
    ("goal", "circle_offset", NAN, "circle_offset must be a finite number"),
    ("goal", "triplet_weight", "circle", "triplet_weight must be one of"),
    ("goal", "pair_weight", "sig_ms", "pair_weight must be one of"),
    ("vsl", "alpha", -1.0, "alpha must be >= 0"),
    ("vsl", "beta", NAN, "beta must be a finite number >= 0"),
    ("vsl", "tau", 0.0, "tau must be > 0"),
    ("vsl", "descending", "no", "descending must be a bool"),
    ("adacl", "m1_init", 0.0, "m1_init must be > 0"),
    ("adacl", "m1_init", "20", "m1_init must be a finite number > 0"),
    ("adacl", "m2_init", NAN, "m2_init must be a finite number"),
    ("adacl", "p_u", 1.0, "p_u must be in (0, 1)"),
    ("adacl", "eps", 0.0, "eps must be in (0, 1)"),
    ("adacl", "anchor_selection", "mean", "anchor_selection must be one of"),
    ("adacl", "top_k", 1, "top_k must be >= 2"),
    ("adacl", "margin_momentum", 1.0, "margin_momentum must be in [0, 1)"),
    ("adacl", "negative_temperature", 0.0, "negative_temperature must be > 0"),
    ("adacl", "warmup_steps", -1, "warmup_steps must be >= 0"),
    ("adacl", "min_variance", INF, "min_variance must be a finite number >= 0"),
    ("adacl", "max_anchor", 1.5, "max_anchor must be <= 1"),
    ("adacl", "max_anchor", -INF, "max_anchor must be a finite number <= 1"),
    ("adacl", "max_m1", 0.0, "max_m1 must be > 0"),
    ("adacl", "seed", 1.5, "seed must be an integer"),
    ("adacl", "queue_size", -1, "queue_size must be >= 0"),
    ("adacl", "embed_dim", 0, "embed_dim must be >= 1"),
    ("adacl", "sync_margins", "true", "sync_margins must be a bool"),
]


@pytest.mark.parametrize(("name", "param", "value", "words"), BAD)
def test_registry_check_names_the_parameter(name, param, value, words):
    with pytest.raises(ParamError) as err:
        check_loss_params(name, {param: value})
    assert err.value.param == param
    assert str(err.value).startswith(f"{param} ")
    assert words in str(err.value)


@pytest.mark.parametrize(("name", "param", "value", "words"), BAD)
def test_constructor_raises_the_same_error(name, param, value, words):
    with pytest.raises(ParamError) as registry_err:
        check_loss_params(name, {param: value})
    with pytest.raises(ValueError) as built_err:
        build_loss(name, **{param: value})
    assert str(built_err.value) == str(registry_err.value)


def test_triplet_reproductions_from_the_issue():
    with pytest.raises(ValueError, match="margin must be a finite number >= 0, got 'a' \\(str\\)"):
        TripletLoss(margin="a")
    with pytest.raises(ValueError, match="margin must be >= 0, got -0.2"):
        TripletLoss(margin=-0.2)


@pytest.mark.parametrize(
    ("name", "params"),
    [
        ("multi_similarity", {"lam": -0.5}),  # a similarity threshold: any real
        ("binomial_deviance", {"lam": -0.5}),
        ("goal", {"lam": -0.5, "circle_offset": -0.5, "margin": 0.0}),
        ("circle", {"margin": -0.1}),  # Circle loss's relaxation m: not bounded here
        ("adacl", {"m2_init": -0.3, "seed": -1, "max_anchor": -0.5, "top_k": None}),
        ("adacl", {"max_m1": None, "embed_dim": None, "queue_size": 0}),
        ("infonce", {"max_scale": 1, "temperature": 1}),  # ints are numbers
        ("triplet", {"margin": 0, "chunk_size": None}),
        ("vsl", {"alpha": 0.0, "base": "unified", "base_params": {"margin": 0.1}}),
    ],
)
def test_legitimate_values_pass_and_build(name, params):
    check_loss_params(name, params)
    build_loss(name, **params)


@pytest.mark.parametrize("name", available_losses())
def test_defaults_pass(name):
    check_loss_params(name, {})
    check_loss_params(name, loss_parameters(name))


#: Constructor parameters that are objects rather than settings (checked when built).
UNDECLARED = {("vsl", "semantic"), ("vsl", "base"), ("vsl", "base_params")}


@pytest.mark.parametrize("name", available_losses())
def test_every_constructor_parameter_is_declared(name):
    specs = loss_class(name).param_specs()
    missing = {p for p in loss_parameters(name) if p not in specs and (name, p) not in UNDECLARED}
    assert not missing, f"loss {name!r}: declare {sorted(missing)} in its class's params"


def test_check_does_not_build_the_loss(monkeypatch):
    import vlret.memory

    def refuse(*args, **kwargs):
        raise AssertionError("check_loss_params built a queue")

    monkeypatch.setattr(vlret.memory.MemoryQueue, "__init__", refuse)
    check_loss_params("adacl", {"queue_size": 4096, "embed_dim": 1024})
    with pytest.raises(AssertionError, match="built a queue"):
        build_loss("adacl", queue_size=4096, embed_dim=1024)


@pytest.mark.parametrize(
    ("name", "params", "param", "words"),
    [
        ("adacl", {"p_u": 0.6, "eps": 0.5}, "p_u", "p_u + eps must be below 1"),
        ("adacl", {"queue_size": 8}, "embed_dim", "embed_dim is required when queue_size > 0"),
        (
            "adacl",
            {"scale_negatives": True, "negative_temperature": 0.05},
            "scale_negatives",
            "negative_temperature other than 1",
        ),
        ("vsl", {"base": "vsl"}, "base", "base must be another loss than 'vsl'"),
        ("vsl", {"base": "tripplet"}, "base", "unknown loss 'tripplet'"),
        ("vsl", {"base_params": [1]}, "base_params", "base_params must be a dict"),
        ("vsl", {"reduction": "none"}, "reduction", "reduction='none' must be used by both"),
    ],
)
def test_relations_between_parameters(name, params, param, words):
    with pytest.raises(ParamError) as err:
        check_loss_params(name, params)
    assert err.value.param == param
    assert words in str(err.value)
    with pytest.raises(ValueError, match=words.replace("+", r"\+")):
        build_loss(name, **params)


def test_nested_base_params_are_named_with_their_path():
    with pytest.raises(ParamError) as err:
        check_loss_params("vsl", {"base": "triplet", "base_params": {"margin": -0.2}})
    assert err.value.param == "base_params.margin"
    assert str(err.value) == "base_params.margin must be >= 0, got -0.2"
    with pytest.raises(ParamError) as err:
        check_loss_params("vsl", {"base_params": {"gama": 1.0}})
    assert err.value.param == "base_params.gama"
    check_loss_params("vsl", {"base_params": {"reduction": "none"}, "reduction": "none"})


def test_unknown_names_are_reported():
    with pytest.raises(ValueError, match="unknown loss 'tripplet'"):
        check_loss_params("tripplet", {})
    with pytest.raises(ParamError, match="unknown parameter.*gama.*valid: margin=0.2") as err:
        check_loss_params("unified", {"gama": 50.0})
    assert err.value.param == "gama"


def test_error_prefix_for_a_config_key():
    with pytest.raises(ParamError) as err:
        check_loss_params("triplet", {"margin": NAN})
    assert f"loss.{err.value}" == "loss.margin must be a finite number >= 0, got nan"


def test_numpy_floats_are_numbers_but_integers_must_be_ints():
    np = pytest.importorskip("numpy")
    check_loss_params("triplet", {"margin": np.float32(0.2), "chunk_size": 8})
    with pytest.raises(ParamError, match="chunk_size must be an integer >= 1 or None"):
        check_loss_params("triplet", {"chunk_size": np.int64(8)})


# ----------------------------------------------------------------------------- AdaCL queue


@pytest.mark.parametrize("chunk_size", [None, 4])
def test_adacl_queue_dimension_mismatch_names_embed_dim(chunk_size):
    loss = AdaCLLoss(queue_size=16, embed_dim=32, chunk_size=chunk_size)
    img, txt = torch.randn(8, 16), torch.randn(8, 16)
    with pytest.raises(ValueError, match=r"embed_dim=32.*16|16.*embed_dim=32") as err:
        loss(img, txt, torch.arange(8))
    assert "img_emb" in str(err.value)


def test_adacl_queue_with_matching_dimension_still_trains():
    loss = AdaCLLoss(queue_size=16, embed_dim=16)
    out = loss(torch.randn(8, 16), torch.randn(8, 16), torch.arange(8))
    assert math.isfinite(float(out)) and len(loss.txt_queue) == 8


# ----------------------------------------------------------------------------- AdaCL plot


def _metrics_log(path: Path, steps: int = 5) -> list[dict]:
    """A training run's metrics.jsonl as the trainer writes it: step records carrying
    ``last_stats`` under a ``loss_`` prefix, and epoch records without margins."""
    g = torch.Generator().manual_seed(0)
    loss = AdaCLLoss()
    lines = []
    for k in range(steps):
        img = F.normalize(torch.randn(10, 16, generator=g), dim=1)
        txt = F.normalize(img + 0.7 * torch.randn(10, 16, generator=g), dim=1)
        loss(img, txt)
        record = {"kind": "step", "epoch": 0, "step": 100 + k, "loss": 1.0, "lr": 1e-3}
        record.update({f"loss_{key}": v for key, v in loss.last_stats.items()})
        lines.append(record)
    lines.append({"kind": "epoch", "epoch": 0, "step": 100 + steps, "rsum": 12.5})
    path.write_text("".join(json.dumps(r) + "\n" for r in lines), encoding="utf-8")
    return lines[:-1]


def test_plot_reads_a_training_runs_metrics_log(tmp_path: Path):
    log = tmp_path / "metrics.jsonl"
    steps = _metrics_log(log)
    records = load_stats(log)
    assert [r["step"] for r in records] == [100, 101, 102, 103, 104]
    assert [r["m1"] for r in records] == [s["loss_m1"] for s in steps]
    assert [r["anchor"] for r in records] == [s["loss_anchor"] for s in steps]
    (png,) = plot_adacl_margins(log, tmp_path / "plots")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_plot_of_a_log_without_margins_names_the_file(tmp_path: Path):
    log = tmp_path / "metrics.jsonl"
    log.write_text('{"kind": "step", "step": 1, "loss": 2.0}\n{"kind": "epoch", "epoch": 0}\n')
    with pytest.raises(ValueError, match=r"metrics.jsonl: no stats records with AdaCL margins"):
        plot_adacl_margins(log, tmp_path)


def test_prefixed_record_missing_one_margin_is_named(tmp_path: Path):
    log = tmp_path / "metrics.jsonl"
    log.write_text('{"kind": "step", "step": 1, "loss_m1": 20.0}\n')
    with pytest.raises(ValueError, match=r"metrics.jsonl:1: missing required key 'loss_m2'"):
        load_stats(log)


@pytest.mark.parametrize("content", [None, '{"kind": "epoch", "epoch": 0}\n'])
def test_cli_plot_errors_are_one_line(tmp_path: Path, capsys, content):
    from vlret.cli import main

    log = tmp_path / "metrics.jsonl"
    if content is not None:
        log.write_text(content)
    code = main(["plot", "adacl-margins", "--stats", str(log), "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err
    assert code == 2
    assert err.startswith("vlret plot: ") and err.count("\n") == 1
    assert str(log) in err


def test_cli_plot_of_a_metrics_log(tmp_path: Path, capsys):
    from vlret.cli import main

    log = tmp_path / "metrics.jsonl"
    _metrics_log(log, steps=3)
    out = tmp_path / "figs"
    assert main(["plot", "adacl-margins", "--stats", str(log), "--out", str(out)]) == 0
    assert str(out / "adacl_margins.png") in capsys.readouterr().out
