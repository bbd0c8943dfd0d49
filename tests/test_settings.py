"""The one declaration of every setting (vlret._settings): reading a declared record from a
config table, in a config file's words, against hand-written expectations."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import pytest

from vlret._checks import FLAG, Number
from vlret._settings import (
    Checked,
    Items,
    OneOf,
    Range,
    Setting,
    SettingError,
    build,
    check_values,
    declared,
    defaults,
    info,
    setting,
    spec_text,
)


def _device(name: str) -> None:
    if name not in ("cpu", "cuda"):
        raise ValueError(f"expected cpu or cuda, got {name!r}")


@dataclass
class Toy:
    """A section with one field of each kind of declaration."""

    epochs: int = setting(doc="epochs", at_least=1, sane=(1, 100))
    batch: int = setting(8, "batch", at_least=2, reason="a batch needs negatives")
    lr: float = setting(0.1, "rate", spec=Range(gt=0, typed=False))
    ratio: float = setting(0.0, "ratio", spec=Range(ge=0, le=1, words="a fraction in [0, 1]"))
    name: str = setting("adam", "optimiser", choices=("adam", "sgd"))
    betas: list[float] = setting(
        doc="betas",
        factory=lambda: [0.9, 0.999],
        spec=Items(Range(ge=0, lt=1), length=2, words="two numbers in [0, 1)"),
    )
    decays: list[int] = setting(doc="decays", factory=list, sane=(0, 50))
    hidden: tuple[int, ...] = setting(
        (4,), "sizes", spec=Items(Range(integer=True, gt=0), words="positive sizes", typed=True)
    )
    steps: int | None = setting(None, "steps", spec=Range(integer=True, ge=2))
    flag: bool = setting(True, "a switch", spec=FLAG)
    device: str = setting("cpu", "device", spec=Checked(_device))


def _error(raw: dict, **kwargs) -> SettingError:
    with pytest.raises(SettingError) as err:
        build(Toy, raw, where="toy", **kwargs)
    return err.value


def test_defaults_fill_in_and_values_come_back_as_declared():
    toy = build(Toy, {"epochs": 3, "lr": 1, "hidden": [2, 3], "ratio": 1}, where="toy")
    assert (toy.epochs, toy.batch, toy.name, toy.betas, toy.steps) == (
        3,
        8,
        "adam",
        [0.9, 0.999],
        None,
    )
    assert isinstance(toy.lr, float) and toy.lr == 1.0  # a float field reads an integer as a float
    assert isinstance(toy.ratio, float) and toy.hidden == (2, 3)  # a tuple field reads a list
    assert defaults(Toy)["epochs"] is ... and defaults(Toy)["betas"] == [0.9, 0.999]
    assert [f.name for f, _ in declared(Toy)] == [f.name for f in dataclasses.fields(Toy)]


@pytest.mark.parametrize(
    ("raw", "key", "why"),
    [
        ({}, "toy.epochs", "required key is missing"),
        (
            {"epochs": 1, "epoch": 2},
            "toy.epoch",
            "unknown key; known: epochs, batch, lr, ratio, name, betas, decays, hidden, steps, "
            "flag, device",
        ),
        ({"epochs": "three"}, "toy.epochs", "expected an integer, got 'three'"),
        ({"epochs": 0}, "toy.epochs", "expected >= 1, got 0"),
        ({"epochs": 101}, "toy.epochs", "expected an integer in [1, 100], got 101"),
        ({"epochs": 1, "batch": 1}, "toy.batch", "expected >= 2 (a batch needs negatives), got 1"),
        ({"epochs": 1, "lr": "fast"}, "toy.lr", "expected a number, got 'fast'"),
        ({"epochs": 1, "lr": 0}, "toy.lr", "expected a positive number, got 0.0"),
        ({"epochs": 1, "ratio": 1.5}, "toy.ratio", "expected a fraction in [0, 1], got 1.5"),
        ({"epochs": 1, "name": "rmsprop"}, "toy.name", "expected one of adam, sgd, got 'rmsprop'"),
        ({"epochs": 1, "betas": [0.9]}, "toy.betas", "expected two numbers in [0, 1), got [0.9]"),
        (
            {"epochs": 1, "betas": [0.9, 1]},
            "toy.betas",
            "expected two numbers in [0, 1), got [0.9, 1.0]",
        ),
        (
            {"epochs": 1, "decays": [3, 60]},
            "toy.decays[1]",
            "expected an integer in [0, 50], got 60",
        ),
        ({"epochs": 1, "hidden": 4}, "toy.hidden", "expected positive sizes, got 4"),
        ({"epochs": 1, "hidden": [4, 0]}, "toy.hidden", "expected positive sizes, got [4, 0]"),
        ({"epochs": 1, "steps": 1.5}, "toy.steps", "expected an integer >= 2, got 1.5"),
        ({"epochs": 1, "steps": 1}, "toy.steps", "expected an integer >= 2, got 1"),
        ({"epochs": 1, "flag": 1}, "toy.flag", "expected true or false, got 1"),
        ({"epochs": 1, "device": "tpu"}, "toy.device", "expected cpu or cuda, got 'tpu'"),
    ],
)
def test_each_refusal_names_the_key_in_a_config_files_words(raw, key, why):
    err = _error(raw)
    assert (err.key, err.why) == (key, why)
    assert str(err) == f"{key}: {why}" and isinstance(err, ValueError)


def test_a_table_that_is_no_mapping_and_the_unknown_words():
    assert str(_error([1])) == "toy: expected a table/mapping, got [1]"
    err = _error({"nope": 1}, unknown="not an option of the toy procedure; known")
    assert err.why.startswith("not an option of the toy procedure; known: epochs, batch")


def test_none_passes_where_the_annotation_allows_it_only():
    assert build(Toy, {"epochs": 1, "steps": None}, where="toy").steps is None
    assert _error({"epochs": None}).why == "expected an integer, got None"


def test_a_record_changed_in_code_is_checked_as_a_read_one():
    toy = build(Toy, {"epochs": 2}, where="toy")
    check_values(toy, where="toy")
    with pytest.raises(SettingError, match=r"^toy\.batch: expected >= 2 \(a batch"):
        check_values(dataclasses.replace(toy, batch=1), where="toy")


def test_the_declaration_says_its_constraint_in_words():
    by_name = {f.name: s for f, s in declared(Toy)}
    assert by_name["epochs"].constraint_text() == ">= 1"
    assert by_name["batch"].constraint_text() == ">= 2 (a batch needs negatives)"
    assert by_name["name"].constraint_text() == "one of `adam`, `sgd`"
    assert by_name["name"].choices == ("adam", "sgd") and by_name["batch"].at_least == 2
    assert by_name["steps"].at_least == 2 and by_name["flag"].at_least is None
    assert spec_text(Number(gt=0, lt=1)) == "a finite number in (0, 1)"  # a loss's own words
    assert spec_text(OneOf((True, "bf16"), words="true or bf16")) == "true or bf16"
    assert isinstance(info(dataclasses.fields(Toy)[0]), Setting)
