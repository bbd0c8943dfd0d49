"""``data.experts``: the multi-expert MSR-VTT features a CE / MMT run reads (issue 16)."""

from __future__ import annotations

import pytest

from train_helpers import tiny_raw
from vlret.run.config import ConfigError, config_from_dict


def raw_msrvtt(tmp_path, **data):
    raw = tiny_raw(tmp_path / "data", tmp_path / "run")
    raw["data"].update({"format": "msrvtt", **data})
    return raw


def test_experts_default_to_the_models_own_experts_in_its_order(tmp_path):
    raw = raw_msrvtt(tmp_path)
    raw["model"] = {"kind": "ce", "experts": {"motion": 16, "appearance": 32, "audio": 8}}
    assert config_from_dict(raw).data.experts == ["motion", "appearance", "audio"]
    raw["data"]["experts"] = "all"  # an explicit choice is kept
    assert config_from_dict(raw).data.experts == "all"


def test_frame_features_stay_the_default_for_other_models(tmp_path):
    assert config_from_dict(raw_msrvtt(tmp_path)).data.experts is None
    assert config_from_dict(raw_msrvtt(tmp_path, experts=["rgb", "audio"])).data.experts == [
        "rgb",
        "audio",
    ]


@pytest.mark.parametrize(
    ("data", "words"),
    [
        ({"experts": "rgb"}, 'expected "all" or a non-empty list'),
        ({"experts": []}, 'expected "all" or a non-empty list'),
        ({"experts": ["rgb", ""]}, 'expected "all" or a non-empty list'),
        ({"experts": "all", "format": "precomp"}, "only format 'msrvtt' has expert features"),
    ],
)
def test_bad_experts_name_the_key(tmp_path, data, words):
    with pytest.raises(ConfigError, match=words) as err:
        config_from_dict(raw_msrvtt(tmp_path, **data))
    assert err.value.key == "data.experts"


def test_experts_of_the_wrong_type_name_the_key(tmp_path):
    with pytest.raises(ConfigError) as err:
        config_from_dict(raw_msrvtt(tmp_path, experts=3))
    assert err.value.key == "data.experts"
