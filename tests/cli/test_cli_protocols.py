"""``vlret protocols`` and ``vlret eval --protocol`` read the protocol registry."""

from __future__ import annotations

import argparse
import dataclasses

import pytest

from vlret.cli import build_parser, main
from vlret.eval import get_protocol, protocol_names
from vlret.eval.protocols import register_protocol, registry


def _eval_protocol_choices() -> list[str]:
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    action = next(a for a in sub.choices["eval"]._actions if a.dest == "protocol")
    return list(action.choices)


def test_protocols_lists_one_line_per_registered_protocol(capsys):
    assert main(["protocols"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in lines] == list(protocol_names())
    assert lines[0] == (
        "f30k         Flickr30K test: 1000 images x 5000 captions "
        "[precomp test/dev; karpathy test/dev]"
    )
    assert lines[4].startswith("msrvtt-1ka") and lines[4].endswith("[msrvtt test]")
    assert lines[-1] == (
        "zeroshot-classification zero-shot classification of a class set (--dataset): acc1, acc5, "
        "mean per-class recall [classification test]"
    )


def test_a_registered_protocol_reaches_both_commands(monkeypatch, capsys):
    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))
    assert "toy" not in _eval_protocol_choices()
    toy = dataclasses.replace(
        get_protocol("f30k"), name="toy", summary="a toy protocol", default_for=()
    )
    register_protocol(toy)
    assert _eval_protocol_choices() == list(protocol_names())
    assert main(["protocols"]) == 0
    assert capsys.readouterr().out.splitlines()[-1].startswith("toy          a toy protocol")


def test_eval_refuses_an_unregistered_protocol(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["eval", "x.pt", "--data", ".", "--split", "test", "--protocol", "coco"])
    assert exit_info.value.code == 2
    assert "invalid choice: 'coco'" in capsys.readouterr().err
