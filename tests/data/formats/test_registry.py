"""The data-format registry: every built-in record is consistent, the config's choices are the
registry's, the harness asks records instead of names (no format name is compared outside the
registry and its readers), and the record's declarations match what its reader does."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

import vlret
from vlret.data.config import DATA_FORMATS, DataConfig
from vlret.data.formats import (
    DataFormat,
    MissingDataKey,
    format_names,
    formats_where,
    get_format,
)
from vlret.data.formats.checks import image_data_problem
from vlret.data.formats.registry import CAPTION_COUNT_KEYS, INPUTS

BUILT_IN = (
    "precomp",
    "msrvtt",
    "karpathy",
    "webdataset",
    "csv",
    "cuhk-pedes",
    "icfg-pedes",
    "rstpreid",
)


def test_the_built_in_formats_in_order_and_the_config_choices_are_the_registry():
    assert format_names()[: len(BUILT_IN)] == BUILT_IN
    assert DATA_FORMATS == BUILT_IN


@pytest.mark.parametrize("name", BUILT_IN)
def test_each_record_is_consistent(name):
    record = get_format(name)
    assert isinstance(record, DataFormat) and record.name == name
    importlib.import_module(record.reader)  # the reader it names exists
    assert record.splits and len(set(record.splits)) == len(record.splits)
    assert record.inputs in INPUTS
    assert record.caption_count_key in (None, *CAPTION_COUNT_KEYS)
    if record.evaluated_as is not None:  # evaluated in a registered format, not a chain
        assert get_format(record.evaluated_as).evaluated_as is None
    # what a format owns or needs is a [data] key
    fields = {f.name for f in DataConfig.__dataclass_fields__.values()}
    assert set(record.owns) <= fields and set(record.needs) <= fields
    # only one image per caption can be re-paired or draw offline negatives
    if record.noise_index or record.offline_negatives:
        assert record.caption_count_key == "captions_per_image" and not record.streams
    # a streaming training split has no dev split of data.dev_split's
    if record.streams:
        assert record.evaluated_as is not None and record.vocabulary is None


def test_the_capability_tables_name_the_formats_that_declare_them():
    assert formats_where(lambda f: f.noise_index) == ("precomp", "karpathy")
    assert formats_where(lambda f: f.captions_files) == ("precomp", "karpathy")
    assert formats_where(lambda f: f.offline_negatives) == ("precomp", "karpathy")
    assert formats_where(lambda f: f.identities) == ("cuhk-pedes", "icfg-pedes", "rstpreid")
    assert formats_where(lambda f: f.experts) == ("msrvtt",)
    assert formats_where(lambda f: f.streams) == ("webdataset",)
    assert formats_where(lambda f: f.evaluated_as is not None) == ("webdataset", "csv")
    assert formats_where(lambda f: f.vocabulary is None) == ("webdataset", "csv")
    assert get_format("icfg-pedes").splits == ("train", "test")  # no validation split


@pytest.mark.parametrize(
    ("fields", "key", "message"),
    [
        ({"format": "precomp", "shards": "a.tar"}, "shards", "only read with format 'webdataset'"),
        ({"format": "karpathy", "dev_csv": "d.csv"}, "dev_csv", "only read with format 'csv'"),
        (
            {"format": "csv", "annotations": "a.json", "csv": "t.csv", "vocab": "v.json"},
            "annotations",
            "only read with formats 'cuhk-pedes', 'icfg-pedes', 'rstpreid'",
        ),
        ({"format": "csv", "vocab": "v.json"}, "csv", "required for format 'csv'"),
        (
            {"format": "webdataset", "shards": "a.tar", "vocab": "v.json"},
            "train_num_samples",
            "required for format 'webdataset' (img2dataset writes no size file)",
        ),
        ({"format": "csv", "csv": "t.csv"}, "tokenizer", "format 'csv' builds no vocabulary"),
        (
            {"format": "precomp", "train_transform": "random_resized_crop"},
            "train_transform",
            "format 'precomp' serves no images to augment",
        ),
    ],
)
def test_the_config_checks_ask_the_record(fields, key, message):
    problem = image_data_problem(DataConfig(root="data", **fields), {})
    assert problem is not None and problem[0] == key and message in problem[1]


def test_a_format_key_left_unset_is_named():
    with pytest.raises(MissingDataKey, match="data.karpathy_json: required for format 'karpathy'"):
        get_format("karpathy").vocabulary(DataConfig(root="data", format="karpathy"))


def test_root_is_read_by_the_formats_that_read_their_files_from_it():
    assert get_format("precomp").root_required(DataConfig(root="data"))
    assert not get_format("karpathy").root_required(DataConfig(root="data", format="karpathy"))
    person = get_format("cuhk-pedes")
    assert person.root_required(
        DataConfig(root="data", format="cuhk-pedes")
    )  # its default files in root
    named = DataConfig(root="d", format="cuhk-pedes", annotations="a.json", image_root="imgs")
    assert not person.root_required(named)


# -- no format name compared outside the registry and its readers ---------------------------

SOURCE = Path(vlret.__file__).parent
#: the registry and readers may compare their own names; the synthetic worlds choose which
#: writer to write with (they write the formats, they read none)
ALLOWED = ("data/formats/", "worlds/")


def _compared_names(tree: ast.AST) -> list[tuple[int, str]]:
    names = set(BUILT_IN)
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Compare):
            continue
        for side in (node.left, *node.comparators):
            values = side.elts if isinstance(side, ast.Tuple | ast.List | ast.Set) else [side]
            for value in values:
                if isinstance(value, ast.Constant) and value.value in names:
                    found.append((node.lineno, value.value))
    return found


def test_no_format_name_is_compared_outside_the_registry_and_its_readers():
    found = {}
    for path in sorted(SOURCE.rglob("*.py")):
        rel = path.relative_to(SOURCE).as_posix()
        if rel.startswith(ALLOWED):
            continue
        hits = _compared_names(ast.parse(path.read_text(encoding="utf-8")))
        if hits:
            found[rel] = hits
    assert found == {}


def test_the_scan_finds_a_comparison():
    tree = ast.parse('if data.format in ("precomp", "karpathy"):\n    pass\nx = f == "csv"\n')
    assert _compared_names(tree) == [(1, "precomp"), (1, "karpathy"), (3, "csv")]


def test_importing_the_package_imports_every_format_module():
    """A new module under vlret/data/formats registers its record without an edit elsewhere."""
    import sys

    import vlret.data.formats as formats

    folder = Path(formats.__file__).parent
    modules = {p.stem for p in folder.glob("*.py") if not p.stem.startswith("_")}
    modules |= {p.parent.name for p in folder.glob("*/__init__.py")}
    assert modules >= {"precomp", "karpathy", "msrvtt", "webdataset", "csv", "pedes", "experts"}
    assert {m for m in modules if f"vlret.data.formats.{m}" not in sys.modules} == set()
