"""One parameter declaration per loss family (issue 25): the constructor, the registry, the
config, ``repr`` and both entry points read it; the pure functions' defaults and the deprecated
0.1.0 names (GoalConfig, AdaCLConfig, GOAL_PARAMS, VSL's chunk_size: vlret.losses.deprecated)
agree with it."""

from __future__ import annotations

import dataclasses
import inspect
import warnings

import pytest
import torch

from vlret._checks import CHUNK_SIZE, ParamError
from vlret.losses import (
    GoalParams,
    UnifiedLoss,
    VisualSemanticLoss,
    available_losses,
    build_loss,
    goal_pair_weights,
    goal_triplet_weight,
    loss_class,
    loss_parameters,
    smooth_rank,
    visual_semantic_loss,
)
from vlret.losses.adacl import AdaCLParams
from vlret.losses.params import COMMON, LossParams, TiledLossParams, info
from vlret.run.config import ConfigError, config_from_dict
from vlret.semantic import CaptionTfidf
from vlret.similarity import cosine_similarity


def _declared(name: str) -> type[LossParams]:
    return loss_class(name).Params


@pytest.mark.parametrize("name", available_losses())
def test_constructor_signature_is_the_declaration(name):
    cls = loss_class(name)
    signature = inspect.signature(cls).parameters
    assert {k: p.default for k, p in signature.items()} == _declared(name).defaults()
    assert all(p.kind is inspect.Parameter.KEYWORD_ONLY for p in signature.values())
    types = {f.name: f.type for f in dataclasses.fields(_declared(name))}
    assert {k: p.annotation for k, p in signature.items()} == types  # help() shows the types
    assert loss_parameters(name) == _declared(name).defaults()


@pytest.mark.parametrize("name", available_losses())
def test_every_field_has_a_description_and_a_constraint_or_a_relation_check(name):
    params = _declared(name)
    for f in dataclasses.fields(params):
        assert info(f).doc.strip(), f"{name}.{f.name} has no description"
    undeclared = {f.name for f in dataclasses.fields(params) if info(f).spec is None}
    assert undeclared <= {"semantic", "base", "base_params"}, (name, undeclared)


def _function_defaults(fn) -> dict:
    return {
        k: p.default
        for k, p in inspect.signature(fn).parameters.items()
        if p.default is not inspect.Parameter.empty
    }


@pytest.mark.parametrize("name", available_losses())
def test_pure_functions_defaults_equal_the_declaration(name):
    """The dense and tiled functions keep explicit signatures; their defaults are the family's
    declaration's, never a second opinion (GOAL's circle_offset=0.5 was in five places)."""
    cls = loss_class(name)
    defaults = cls.Params.defaults()
    for fn in (cls.dense, cls.tiled):
        if fn is None:
            continue
        given = _function_defaults(fn)
        for field in [*cls.Params.passed_names(), "reduction", "normalize"]:
            if field in given:
                assert given[field] == defaults[field], (name, fn.__name__, field)
        # a function takes every declared hyper-parameter the module hands it
        assert cls.Params.passed_names() <= set(inspect.signature(fn).parameters), fn.__name__


def test_goal_weight_functions_defaults_equal_the_declaration():
    defaults = GoalParams.defaults()
    for fn in (goal_triplet_weight, goal_pair_weights):
        for field, value in _function_defaults(fn).items():
            if field in defaults:
                assert value == defaults[field], (fn.__name__, field)


@pytest.mark.parametrize("name", available_losses())
def test_repr_shows_every_declared_hyper_parameter(name):
    loss = build_loss(name)
    text = repr(loss)
    for field in loss.config.names():
        if field not in COMMON and field != "semantic":
            assert f"{field}=" in text, (name, field, text)
    assert f"reduction={loss.reduction!r}" in text


def test_values_are_checked_once_by_the_declaration_and_kept_as_floats():
    loss = UnifiedLoss(margin=0, gamma=60)
    assert loss.config == UnifiedLoss.Params(margin=0.0, gamma=60.0)
    assert isinstance(loss.margin, float) and isinstance(loss.config.gamma, float)
    with pytest.raises(ParamError) as err:
        UnifiedLoss.Params(gamma=0.0)
    assert err.value.param == "gamma"
    with pytest.raises(dataclasses.FrozenInstanceError):
        loss.config.margin = 0.3  # type: ignore[misc]


def test_chunk_size_is_one_spec_declared_by_the_tiled_families():
    tiled = {n for n in available_losses() if loss_class(n).tiled is not None}
    with_chunks = {n for n in available_losses() if "chunk_size" in loss_parameters(n)}
    assert with_chunks == tiled | {"adacl"}  # AdaCL tiles through its own batch class
    for name in with_chunks:
        field = {f.name: f for f in dataclasses.fields(_declared(name))}["chunk_size"]
        assert info(field).spec is CHUNK_SIZE
        assert issubclass(_declared(name), TiledLossParams)
    with pytest.raises(ParamError, match="has no tiled form"):
        build_loss("circle", chunk_size=8)


def test_an_input_the_tiled_form_does_not_take_is_refused():
    img, txt = torch.randn(6, 4, dtype=torch.float64), torch.randn(6, 4, dtype=torch.float64)
    weights = torch.ones(6, 6, dtype=torch.float64)
    with pytest.raises(ValueError, match="weights needs the dense form; use chunk_size=None"):
        UnifiedLoss(chunk_size=2)(img, txt, weights=weights)
    margins = torch.full((6,), 0.1, dtype=torch.float64)
    tiled = UnifiedLoss(chunk_size=2)(img, txt, margins=margins, weights=None)
    dense = UnifiedLoss()(img, txt, margins=margins)
    torch.testing.assert_close(tiled, dense, rtol=0, atol=1e-12)


# ----------------------------------------------------------------------------- old names


@pytest.mark.parametrize(
    ("module", "old", "new"),
    [
        ("vlret.losses", "GoalConfig", GoalParams),
        ("vlret.losses.goal", "GoalConfig", GoalParams),
        ("vlret.losses.adacl", "AdaCLConfig", AdaCLParams),
    ],
)
def test_old_record_names_are_deprecated_aliases(module, old, new):
    import importlib

    message = rf"{module}\.{old} is deprecated and will be removed in 0\.3\.0; use .*{new.__name__}"
    with pytest.warns(DeprecationWarning, match=message):
        alias = getattr(importlib.import_module(module), old)
    assert alias is new


@pytest.mark.parametrize(
    ("module", "old"),
    [
        # served by the package that exported them in 0.1.0 only, not by the defining module
        ("vlret.losses.goal.weights", "GoalConfig"),
        ("vlret.losses.goal.weights", "GOAL_PARAMS"),
        ("vlret.losses.adacl.config", "AdaCLConfig"),
        # never exported by a package in 0.1.0 (a constant of adacl/config.py): removed
        ("vlret.losses.adacl.config", "ADACL_PARAMS"),
        ("vlret.losses.adacl", "ADACL_PARAMS"),
        ("vlret.losses", "GOAL_PARAMS"),
    ],
)
def test_old_names_are_served_only_where_0_1_0_exported_them(module, old):
    import importlib

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(AttributeError, match=f"has no attribute '{old}'"):
            getattr(importlib.import_module(module), old)


def test_old_goal_spec_table_is_the_declarations_specs():
    from vlret.losses import goal

    with pytest.warns(DeprecationWarning, match="GOAL_PARAMS is deprecated.*GoalParams.specs()"):
        goal_specs = goal.GOAL_PARAMS
    old_goal = "alpha beta circle_offset epsilon lam margin pair_weight reduction tau"
    assert sorted(goal_specs) == [*old_goal.split(), "triplet_weight"]  # GOAL_PARAMS at b84b800
    assert goal_specs.items() <= GoalParams.specs().items()
    with pytest.raises(AttributeError):
        goal.NOT_A_NAME  # noqa: B018


def test_old_adacl_config_records_build_as_before():
    with pytest.warns(DeprecationWarning):
        from vlret.losses.adacl import AdaCLConfig
    record = AdaCLConfig(p_u=0.05, top_k=4)
    assert record.p_u == 0.05 and record.top_k == 4 and record.m1_init == 20.0
    with pytest.raises(ParamError, match="p_u \\+ eps must be below 1"):
        AdaCLConfig(p_u=0.6, eps=0.5)


def test_renamed_parameters_are_the_ones_the_deprecation_module_lists():
    from vlret.losses import deprecated

    assert deprecated.OLD_PARAMETERS == {"vsl": {"chunk_size": "rank_block"}}
    for name in available_losses():
        assert dict(loss_class(name).Params.renamed) == deprecated.OLD_PARAMETERS.get(name, {})


# ----------------------------------------------------------------------------- VSL rank_block


def _semantic(n: int) -> CaptionTfidf:
    return CaptionTfidf().fit({i: [f"caption number {i} word{i % 3}"] for i in range(n)})


def test_vsl_rank_block_and_its_deprecated_old_name_give_the_same_loss():
    gen = torch.Generator().manual_seed(0)
    img, txt = torch.randn(6, 8, generator=gen), torch.randn(6, 8, generator=gen)
    ids = list(range(6))
    semantic = _semantic(6)
    new = VisualSemanticLoss(semantic=semantic, rank_block=2)
    with pytest.warns(
        DeprecationWarning,
        match=r"'chunk_size' is deprecated; it is now 'rank_block' \(.* removed in 0\.3\.0",
    ):
        old = VisualSemanticLoss(semantic=semantic, chunk_size=2)
    assert old.config == new.config and old.rank_block == 2 and old.chunk_size is None
    torch.testing.assert_close(old(img, txt, ids), new(img, txt, ids), rtol=0, atol=0)
    with pytest.raises(ParamError, match="give rank_block only"):
        VisualSemanticLoss(semantic=semantic, chunk_size=2, rank_block=2)
    with pytest.raises(ParamError, match="rank_block must be >= 1"):
        VisualSemanticLoss(semantic=semantic, rank_block=0)


def test_smooth_rank_and_vsl_function_take_chunk_size_as_deprecated_rank_block():
    gen = torch.Generator().manual_seed(1)
    m = torch.randn(5, 7, generator=gen, dtype=torch.float64)
    with pytest.warns(DeprecationWarning, match="now rank_block.*removed in 0.3.0"):
        old = smooth_rank(m, chunk_size=2)
    torch.testing.assert_close(old, smooth_rank(m, rank_block=2), rtol=0, atol=0)
    sim = cosine_similarity(m[:, :5].t().contiguous(), m[:, 2:].t().contiguous())
    semantic_sim = torch.eye(5, dtype=torch.float64)
    with pytest.warns(DeprecationWarning):
        old = visual_semantic_loss(sim, semantic_sim, chunk_size=3)
    want = visual_semantic_loss(sim, semantic_sim, rank_block=3)
    torch.testing.assert_close(old, want, rtol=0, atol=0)


def _raw(loss: dict) -> dict:
    return {
        "output_dir": "runs/x",
        "data": {"root": "data/f30k", "format": "precomp"},
        "model": {
            "embed_dim": 8,
            "image": {"kind": "precomp", "in_dim": 4, "pooling": "max"},
            "text": {"kind": "gru", "word_dim": 4},
        },
        "loss": loss,
        "optim": {"name": "adam", "lr": 1e-3},
        "train": {"epochs": 1, "batch_size": 4},
    }


def test_config_maps_vsl_chunk_size_to_rank_block_with_a_warning():
    with pytest.warns(DeprecationWarning, match="rank_block"):
        config = config_from_dict(_raw({"name": "vsl", "chunk_size": 16}))
    assert config.loss.params == {"rank_block": 16}
    assert config.to_dict()["loss"] == {"name": "vsl", "rank_block": 16}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        config_from_dict(config.to_dict())  # the resolved config uses the new name
    with pytest.raises(ConfigError, match="loss.chunk_size"):
        config_from_dict(_raw({"name": "vsl", "chunk_size": 16, "rank_block": 8}))
    with pytest.raises(ConfigError, match="loss.rank_block: rank_block must be >= 1"):
        config_from_dict(_raw({"name": "vsl", "rank_block": 0}))


def test_config_types_come_from_the_declared_constraints():
    with pytest.raises(ConfigError, match="loss.queue_size: expected an integer, got 1.5"):
        config_from_dict(_raw({"name": "adacl", "queue_size": 1.5}))
    with pytest.raises(ConfigError, match="loss.hardest: expected true or false"):
        config_from_dict(_raw({"name": "triplet", "hardest": 1}))
    with pytest.raises(ConfigError, match="loss.triplet_weight: expected a string"):
        config_from_dict(_raw({"name": "goal", "triplet_weight": 3}))
    with pytest.raises(ConfigError, match="loss.semantic: not a parameter of loss 'vsl'"):
        config_from_dict(_raw({"name": "vsl", "semantic": "x"}))
