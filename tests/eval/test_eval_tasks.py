"""The task registry (:mod:`vlret.eval.tasks`): retrieval under every protocol the pipeline
ranks, zero-shot classification as a task of the same registry, what each task needs and
takes, and the zero-shot task's preparation and run against ``evaluate_zeroshot`` (a toy
model through a stand-in harness)."""

from __future__ import annotations

import dataclasses
import math
import types
from pathlib import Path

import pytest
import torch

from vlret.eval import (
    EvalRequest,
    EvalTask,
    get_protocol,
    get_task,
    protocol_names,
    register_protocol,
    register_task,
    task_names,
)
from vlret.eval.protocols import registry as protocol_registry
from vlret.eval.tasks import PixelModel, RetrievalTask, ranks_by_retrieval
from vlret.eval.tasks import registry as task_registry
from vlret.eval.tasks.zeroshot import ZeroShotTask
from vlret.eval.zeroshot import evaluate_zeroshot
from vlret.metrics import ZEROSHOT_METRICS
from zeroshot_helpers import CharTokenizer, Toy, ToySet

Image = pytest.importorskip("PIL.Image")


@pytest.fixture
def registries(monkeypatch):
    """Copies of both registries, so a test may register into them."""
    monkeypatch.setattr(protocol_registry, "_REGISTRY", dict(protocol_registry._REGISTRY))
    monkeypatch.setattr(task_registry, "_TASKS", dict(task_registry._TASKS))


def test_every_protocol_is_a_task_of_its_kind():
    assert task_names() == protocol_names()  # every built-in protocol runs
    for name in task_names():
        task = get_task(name)
        assert task.protocol is get_protocol(name) and task.metrics == task.protocol.metrics
        assert task.line() == task.protocol.line()
    assert isinstance(get_task("f30k"), RetrievalTask) and get_task("f30k").kind == "retrieval"
    assert get_task("f30k") is get_task("f30k")  # one task per record
    zeroshot = get_task("zeroshot-classification")
    assert isinstance(zeroshot, ZeroShotTask) and zeroshot.metrics == ZEROSHOT_METRICS
    assert not ranks_by_retrieval(zeroshot.protocol)
    assert ranks_by_retrieval(get_protocol("rstpreid"))
    with pytest.raises(ValueError, match="protocol must be one of f30k, .*, got 'coco'"):
        get_task("coco")


def test_a_protocol_registered_later_is_a_retrieval_task(registries):
    toy = dataclasses.replace(get_protocol("f30k"), name="toy", summary="a toy", default_for=())
    register_protocol(toy)
    assert task_names()[-1] == "toy" and get_task("toy").protocol is toy


def test_a_class_label_protocol_without_a_task_is_not_offered(registries):
    zs = get_protocol("zeroshot-classification")
    register_protocol(dataclasses.replace(zs, name="zs-bare"))
    assert "zs-bare" in protocol_names() and "zs-bare" not in task_names()
    with pytest.raises(ValueError, match="protocol must be one of .*, got 'zs-bare'"):
        get_task("zs-bare")
    # ... until its module registers a task for it
    register_task(ZeroShotTask(get_protocol("zs-bare")))
    assert task_names()[-1] == "zs-bare"


def test_register_task_refuses_twice_an_unregistered_record_and_a_wrong_kind(registries):
    zs = get_protocol("zeroshot-classification")
    with pytest.raises(ValueError, match="registered twice"):
        register_task(ZeroShotTask(zs))
    with pytest.raises(ValueError, match="its protocol is not the registered one"):
        register_task(ZeroShotTask(dataclasses.replace(zs, name="elsewhere")))
    with pytest.raises(ValueError, match="ranks class labels; its relevance is image-of-caption"):
        ZeroShotTask(get_protocol("f30k"))
    with pytest.raises(ValueError, match="expected an EvalTask"):
        register_task(zs)  # type: ignore[arg-type]


def test_needs_say_what_each_task_runs_on():
    f30k = get_task("f30k").needs
    assert f30k.data.startswith("precomp or karpathy data") and not f30k.classes
    assert (
        f30k.split == "precomp test/dev; karpathy test/dev (default: the paper's test split, test)"
    )
    person = get_task("icfg-pedes").needs
    assert person.split.startswith("icfg-pedes test (")
    zs = get_task("zeroshot-classification").needs
    assert "--dataset NAME" in zs.data and "--templates" in zs.classes
    assert zs.split.startswith("test ")
    assert [line.split(":")[0] for line in zs.lines()] == ["model", "data", "split", "classes"]


FLAGS = {"templates": "--templates", "shortlist": "--shortlist"}


def test_a_task_refuses_the_options_of_another_naming_the_flag():
    request = EvalRequest(options={"templates": "openai"})
    get_task("zeroshot-classification").check_options(request, flags=FLAGS)
    with pytest.raises(ValueError, match=r"^--templates: protocol f30k \(retrieval\) does not"):
        get_task("f30k").check_options(request, flags=FLAGS)
    shortlist = EvalRequest(options={"shortlist": 3})
    with pytest.raises(ValueError, match="^--shortlist: protocol zeroshot-classification"):
        get_task("zeroshot-classification").check_options(shortlist, flags=FLAGS)


def test_clip_benchmark_records_are_refused_where_they_cannot_hold_the_task():
    request = EvalRequest()
    get_task("zeroshot-classification").check_json_format("clip_benchmark", request)
    get_task("f30k").check_json_format("clip_benchmark", request)
    with pytest.raises(ValueError, match="--json-format clip_benchmark: protocol cuhk-pedes"):
        get_task("cuhk-pedes").check_json_format("clip_benchmark", request)
    with pytest.raises(ValueError, match="--json-format: expected one of vlret, clip_benchmark"):
        get_task("f30k").check_json_format("csv", request)


# ------------------------------------------------------------------------------------------
# The zero-shot task through a stand-in harness
# ------------------------------------------------------------------------------------------


def toy_set(root: Path, n: int = 9) -> ToySet:
    images = [Image.new("RGB", (4, 4), (30 * i % 256, 90, 200 - 20 * i)) for i in range(n)]
    labels = [i % 3 for i in range(n)]
    return ToySet("imagefolder", "test", ["cat", "dog", "red car"], labels, images, root)


class StandIn:
    """A harness giving the toy model; it records what it was asked."""

    def __init__(self, train=None):
        self.asked = {}
        self.train = train or {}

    def prepare_retrieval(self, protocol, request):
        raise AssertionError("a zero-shot task prepares no retrieval")

    def load_pixel_model(self, **asked):
        self.asked = asked
        path = asked["checkpoint"] or asked["model_dir"]
        return PixelModel(Toy(), CharTokenizer(), "vlret-checkpoint", Path(path), "cpu",
                          why="the run's best.pt", train=self.train)  # fmt: skip


@pytest.fixture
def sets(monkeypatch, tmp_path):
    """vlret.data.classification's readers, answering with the toy set."""
    import vlret.data.classification as classification

    asked = {}
    data = toy_set(tmp_path)

    def load_classification(name, root, *, split="test", classnames=None):
        asked.update(name=name, root=Path(root), split=split, classnames=classnames)
        return data

    monkeypatch.setattr(classification, "load_classification", load_classification)
    monkeypatch.setattr(classification, "default_templates", lambda name: ["a {c}", "{c}!"])
    monkeypatch.setattr(classification, "load_templates", lambda spec: [f"{spec} {{c}}"])
    return types.SimpleNamespace(asked=asked, data=data)


def test_zeroshot_task_runs_evaluate_zeroshot_and_writes_both_records(sets, tmp_path):
    task = get_task("zeroshot-classification")
    request = EvalRequest(checkpoints=(tmp_path / "run",), data=tmp_path, batch_size=4,
                          options={"dataset": "imagefolder"})  # fmt: skip
    harness = StandIn()
    prepared = task.prepare(request, harness=harness)
    assert harness.asked["checkpoint"] == tmp_path / "run" and harness.asked["model_dir"] is None
    assert sets.asked == {"name": "imagefolder", "root": tmp_path, "split": "test",
                          "classnames": None}  # fmt: skip
    assert prepared.notes == (f"checkpoint: {tmp_path / 'run'} (the run's best.pt)",)
    summary = prepared.summary()
    assert summary[3:] == [
        "protocol: zeroshot-classification",
        f"title: Zero-shot classification: imagefolder/{tmp_path.name} test (9 images, 3 "
        "classes, 2 templates)",
        "size: 9 images x 3 classes, 2 templates",
    ]
    result = prepared.run()
    want = evaluate_zeroshot(Toy(), sets.data, ["a {c}", "{c}!"], tokenizer=CharTokenizer(),
                             batch_size=4)  # fmt: skip
    got = result.result.metrics
    assert math.isnan(got["acc5"]) and math.isnan(want.metrics["acc5"])  # below five classes
    for key in ("acc1", "mean_per_class_recall"):
        assert got[key] == want.metrics[key]  # the same computation, bit for bit
    assert torch.equal(result.result.logits, want.logits)
    record = result.record()
    assert (record["protocol"], record["split"], record["n_images"]) == (
        "zeroshot-classification", "test", 9,
    )  # fmt: skip
    assert record["checkpoint"] == str(tmp_path / "run") and record["metrics"]["acc5"] is None
    assert math.isclose(record["metrics"]["acc1"], want.metrics["acc1"])
    clip = result.record(json_format="clip_benchmark")
    assert clip["task"] == "zeroshot_classification" and clip["pretrained"] == str(tmp_path / "run")
    assert set(clip["metrics"]) == set(ZEROSHOT_METRICS)


def test_zeroshot_task_takes_the_runs_zeroshot_keys_as_defaults(sets, tmp_path):
    train = {"zeroshot_dataset": "imagefolder", "zeroshot_root": str(tmp_path),
             "zeroshot_templates": "openai"}  # fmt: skip
    prepared = get_task("zeroshot-classification").prepare(
        EvalRequest(checkpoints=(tmp_path,)), harness=StandIn(train)
    )
    assert sets.asked["root"] == tmp_path and prepared.templates == ("openai {c}",)
    assert prepared.summary()[1] == (
        f"data: imagefolder/{tmp_path.name} (the run's train.zeroshot_dataset) in {tmp_path} "
        "(the run's train.zeroshot_root)"
    )
    assert prepared.notes[1:] == (
        "dataset: imagefolder (the run's train.zeroshot_dataset)",
        f"data: {tmp_path} (the run's train.zeroshot_root)",
        "templates: openai (the run's train.zeroshot_templates)",
    )
    # another set named: the run's folder and templates are not its
    other = EvalRequest(checkpoints=(tmp_path,), options={"dataset": "cifar10"})
    with pytest.raises(ValueError, match="^--data: required, the folder of the cifar10 set"):
        get_task("zeroshot-classification").prepare(other, harness=StandIn(train))


@pytest.mark.parametrize(
    ("request_", "match"),
    [
        (EvalRequest(checkpoints=("a", "b")), "^RUN_OR_CKPT: zero-shot classification scores one"),
        (EvalRequest(checkpoints=("a",), split="dev"), "^--split: protocol zeroshot-classif"),
        (EvalRequest(checkpoints=("a",)), "^--dataset: required"),
        (EvalRequest(checkpoints=("a",), options={"num_workers": -1}), "^--num-workers must"),
        (EvalRequest(checkpoints=("a",), options={"dataset": "cifar10"}), "^--data: required"),
    ],
)
def test_zeroshot_task_refusals_name_the_option(sets, request_, match):
    with pytest.raises(ValueError, match=match):
        get_task("zeroshot-classification").prepare(request_, harness=StandIn())


def test_a_task_is_an_eval_task_with_its_own_options():
    assert issubclass(ZeroShotTask, EvalTask) and issubclass(RetrievalTask, EvalTask)
    assert set(ZeroShotTask.options).isdisjoint(RetrievalTask.options)
