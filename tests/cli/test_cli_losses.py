"""``vlret losses --params NAME``: one loss's parameters, defaults and one-line descriptions,
read from its declaration; the plain listing stays as it was."""

from __future__ import annotations

import dataclasses

import pytest

from vlret.cli import main
from vlret.losses import available_losses, loss_class
from vlret.losses.params import info


@pytest.mark.parametrize("name", available_losses())
def test_params_lists_every_declared_field_with_its_default_and_description(name, capsys):
    assert main(["losses", "--params", name]) == 0
    head, equation, *rows = capsys.readouterr().out.splitlines()
    cls = loss_class(name)
    assert head.split()[:2] == [name, cls.__name__]
    assert equation.strip() == cls.equation
    declared = {f.name: f for f in dataclasses.fields(cls.Params)}
    assert len(rows) == len(declared)
    seen = []
    for row in rows:
        key = row.split()[0]
        field = declared[key]
        default = repr(field.default)
        # the default stands after the name, the description after the default column
        rest = row.split(key, 1)[1].strip()
        assert rest.startswith(default), (key, row)
        assert rest[len(default) :].strip() == info(field).doc, (key, row)
        seen.append(key)
    assert seen == cls.Params.names()  # the family's own fields first, then the common ones


def test_params_of_an_unknown_loss_is_one_line_naming_the_option(capsys):
    assert main(["losses", "--params", "no_such_loss"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith("vlret losses: --params: unknown loss 'no_such_loss'")
    assert "triplet" in captured.err and captured.err.count("\n") == 1


def test_plain_listing_is_two_lines_per_loss_with_the_defaults(capsys):
    assert main(["losses"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2 * len(available_losses())
    pairs = zip(lines[::2], lines[1::2], strict=True)
    for name, (head, detail) in zip(available_losses(), pairs, strict=True):
        cls = loss_class(name)
        assert head.split()[:2] == [name, cls.__name__]
        defaults = ", ".join(f"{k}={v!r}" for k, v in cls.Params.defaults().items())
        assert detail.strip() == f"{cls.equation}; {defaults}"
