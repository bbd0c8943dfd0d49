"""One casing of metric keys across protocols (vlret.metrics.keys), and the one reader of the
older spelling of the person-search keys (t2i_R1 ... i2t_mINP, IRRA's labels)."""

from __future__ import annotations

import json

import pytest
import torch

from vlret.analysis.curves import epoch_series, read_metrics_log, selection_key
from vlret.eval import get_protocol, protocol_names
from vlret.metrics import (
    IDENTITY_METRIC_KEYS,
    IdentityMetrics,
    RetrievalMetrics,
    normalise_metric_key,
    normalise_metric_record,
)
from vlret.run.evaluate import dev_metrics

#: the ten person-search keys as earlier releases wrote them, written out by hand
OLD = [f"{d}_{k}" for d in ("t2i", "i2t") for k in ("R1", "R5", "R10", "mAP", "mINP")]


@pytest.mark.parametrize(
    ("key", "today"),
    [
        ("t2i_R1", "identity_t2i_r1"),
        ("i2t_mINP", "identity_i2t_minp"),
        ("t2i_mAP", "identity_t2i_map"),
        ("t2i_R10", "identity_t2i_r10"),
        ("dev_t2i_R5", "dev_identity_t2i_r5"),
        ("best_i2t_R1", "best_identity_i2t_r1"),
        # today's keys and keys vlret never wrote stay as they are
        ("t2i_r1", "t2i_r1"),
        ("identity_t2i_r1", "identity_t2i_r1"),
        ("dev_t2i_r1", "dev_t2i_r1"),
        ("t2i_map_at_r", "t2i_map_at_r"),
        ("T2I_R1", "T2I_R1"),
        ("R1", "R1"),
        ("t2i_R100", "t2i_R100"),
        ("xt2i_R1", "xt2i_R1"),
        ("rsum", "rsum"),
    ],
)
def test_normalise_metric_key(key, today):
    assert normalise_metric_key(key) == today


def test_every_protocol_and_the_dev_metrics_use_one_casing_and_distinct_keys():
    for name in protocol_names():
        keys = get_protocol(name).metrics
        assert all(k == k.lower() for k in keys), name
    torch.manual_seed(0)
    img, txt = torch.randn(6, 8), torch.randn(12, 8)
    txt_to_img = torch.arange(12) // 2
    plain = dev_metrics(img, txt, txt_to_img)
    person = dev_metrics(img, txt, txt_to_img, image_identity=torch.tensor([4, 4, 9, 9, 9, 2]))
    assert all(k == k.lower() for k in person)
    # the identity level is its own ten keys beside the caption level, not a case variant
    assert len(person) == len(plain) + 10 and set(person) - set(plain) == set(IDENTITY_METRIC_KEYS)
    assert [normalise_metric_key(k) for k in OLD] == list(IDENTITY_METRIC_KEYS)


def test_an_old_evaluation_record_reads_as_todays():
    t2i = {"r1": 10.0, "r5": 20.0, "r10": 30.0, "map": 15.0, "minp": 5.0}
    i2t = {"r1": 11.0, "r5": 21.0, "r10": 31.0, "map": 16.0, "minp": 6.0}
    today = {"protocol": "cuhk-pedes", "split": "test", "title": "CUHK-PEDES R1 mAP",
             "metrics": IdentityMetrics(t2i, i2t).as_dict(), "n_identities": 3}  # fmt: skip
    old_metrics = dict(zip(OLD, [*t2i.values(), *i2t.values()], strict=True))
    old = json.loads(json.dumps({**today, "metrics": old_metrics}))  # as the file held it
    assert normalise_metric_record(old) == today
    # a retrieval record (and its folds) is today's spelling already: unchanged
    m = dict.fromkeys(RetrievalMetrics.__dataclass_fields__, 1.0)
    del m["folds"]
    coco = {"protocol": "coco1k", "metrics": m, "folds": [m, m]}
    assert normalise_metric_record(coco) == coco


def test_an_old_person_search_log_reads_as_todays(tmp_path):
    """metrics.jsonl of a person-search run as an earlier release wrote it: caption-level
    dev_t2i_r1 beside identity-level dev_t2i_R1, selected on t2i_R1."""
    rows = [{"kind": "step", "step": 1, "loss": 2.0}] + [
        {"kind": "epoch", "epoch": e, "dev_t2i_r1": 1.0 + e, "dev_t2i_R1": 10.0 + e,
         "dev_i2t_mINP": 3.0, "select_on": "t2i_R1", "best_metric": 10.0 + e,
         "best_t2i_R1": 10.0 + e}
        for e in (0, 1)
    ]  # fmt: skip
    log = tmp_path / "metrics.jsonl"
    log.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    records = read_metrics_log(tmp_path)
    epoch = records[-1]
    assert epoch["select_on"] == "identity_t2i_r1" and epoch["best_identity_t2i_r1"] == 11.0
    assert epoch["dev_identity_i2t_minp"] == 3.0 and "dev_t2i_R1" not in epoch
    assert selection_key(records) == "dev_identity_t2i_r1"
    assert epoch_series(records, "dev_identity_t2i_r1") == epoch_series(records, "best_metric")
    # the caption-level key keeps its own values
    assert list(epoch_series(records, "dev_t2i_r1").values()) == [1.0, 2.0]
