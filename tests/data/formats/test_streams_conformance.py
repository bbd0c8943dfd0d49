"""The pixel readers on files written by the real producers, not by our own fixtures.

- CSV / TSV: files written by Python's ``csv`` module (``csv.writer`` and ``csv.DictWriter``
  with ``QUOTE_MINIMAL``, ``QUOTE_ALL`` and ``QUOTE_NONNUMERIC``, the ``excel`` dialect's
  ``\\r\\n`` line ends, ``excel-tab``, ``unix``; separators, quotes and line breaks inside fields;
  a UTF-8 byte order mark as spreadsheets write) read by :mod:`vlret.data.formats.csv` and
  compared with ``csv.reader``'s own reading of the same file: the same rows, the same
  captions (vlret strips surrounding whitespace, so the truth is stripped too) and each row's
  first and last line as ``csv.reader.line_num`` counts them.
- Shards: tar files written by ``webdataset.ShardWriter`` (several shards; ``jpg``, ``png``,
  ``txt`` and ``json`` members; RGB and greyscale images) read by :mod:`vlret.data.formats.shards`
  and
  compared with an independent reading of the tar files (``tarfile`` grouping members by key,
  PIL decoding each image, numpy for the greyscale-to-RGB expansion): the same samples,
  captions and pixels, exactly.
"""

from __future__ import annotations

import csv
import io
import tarfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from vlret.data.checks import DataFormatError
from vlret.data.formats.csv import read_csv_pairs

# -- CSV / TSV written by Python's csv module -------------------------------------------------

#: Captions that exercise quoting: separators, quotes, spaces, non-ASCII; the multi-line ones
#: are added where ``multiline`` is on.
CAPTIONS = [
    "a dog on the grass",
    "a cat, a mouse, and a ball",
    'the sign says "stop"',
    "tabs\tinside\ta caption",
    '"quoted from the start", then not',
    "  padded with spaces  ",
    "café, naïve, 東京, emoji 🐕",
    'ends with a quote"',
    "semi;colon|pipe",
    "1234",
]
MULTILINE = ["first line\nsecond line", "windows\r\nline end, and a comma", '"\n"']


def truth(path: Path, delimiter: str, img_key: str, caption_key: str) -> list[tuple]:
    """``csv.reader``'s own reading: ``(image, caption stripped, first line, last line)``."""
    out = []
    with open(path, encoding="utf-8-sig", newline="") as fh:
        reader = csv.reader(fh, delimiter=delimiter)
        header = next(reader)
        i_img, i_cap = header.index(img_key), header.index(caption_key)
        start = reader.line_num + 1
        for fields in reader:
            if fields:
                out.append((fields[i_img].strip(), fields[i_cap].strip(), start, reader.line_num))
            start = reader.line_num + 1
    return out


def vlret_rows(path: Path, **kw: Any) -> list[tuple]:
    return [(r.image, r.caption, r.line, r.end_line) for r in read_csv_pairs(path, **kw)]


WRITERS = [
    pytest.param({"quoting": csv.QUOTE_MINIMAL}, ",", id="minimal-excel-crlf"),
    pytest.param({"quoting": csv.QUOTE_ALL}, ",", id="all-excel-crlf"),
    pytest.param({"quoting": csv.QUOTE_NONNUMERIC}, ",", id="nonnumeric"),
    pytest.param({"dialect": "unix"}, ",", id="unix-lf-quote-all"),
    pytest.param({"dialect": "excel-tab"}, "\t", id="excel-tab"),
    pytest.param({"dialect": "excel-tab", "quoting": csv.QUOTE_ALL}, "\t", id="tab-quote-all"),
    pytest.param({"delimiter": ";", "lineterminator": "\n"}, ";", id="semicolon-lf"),
]


@pytest.mark.parametrize(("fmt", "delimiter"), WRITERS)
@pytest.mark.parametrize("bom", [False, True], ids=["utf8", "utf8-bom"])
@pytest.mark.parametrize("multiline", [False, True], ids=["one-line", "multi-line"])
def test_csv_module_files_read_as_csv_reader_reads_them(tmp_path, fmt, delimiter, bom, multiline):
    captions = CAPTIONS + (MULTILINE if multiline else [])
    path = tmp_path / "pairs.csv"
    encoding = "utf-8-sig" if bom else "utf-8"  # utf-8-sig writes the BOM spreadsheets write
    with open(path, "w", encoding=encoding, newline="") as fh:
        writer = csv.writer(fh, **fmt)
        writer.writerow(["title", "extra", "filepath"])  # columns in another order than usual
        for k, caption in enumerate(captions):
            writer.writerow([caption, f"x{delimiter}y" if k % 2 else k, f"img/{k:03d}.jpg"])
    if bom:
        assert path.read_bytes().startswith(b"\xef\xbb\xbf")
    if "dialect" not in fmt and "lineterminator" not in fmt:
        assert b"\r\n" in path.read_bytes()  # the excel dialect's line end
    expected = truth(path, delimiter, "filepath", "title")
    assert len(expected) == len(captions)
    got = vlret_rows(path, separator=delimiter, multiline=multiline)
    assert got == expected
    assert [row[1] for row in got] == [c.strip() for c in captions]  # what was written
    if multiline:  # the same file without the key: refused at the first multi-line row
        first = next(row for row in expected if row[3] > row[2])
        with pytest.raises(DataFormatError, match=rf"line {first[2]}: field 'title' runs over"):
            read_csv_pairs(path, separator=delimiter)


def test_dict_writer_with_a_bom_and_quoting_all(tmp_path):
    path = tmp_path / "pairs.tsv"
    rows = [
        {"filepath": f"a b/{k}.png", "title": c, "url": "http://x/?a=1,b=2"}
        for k, c in enumerate(CAPTIONS)
    ]
    with open(path, "w", encoding="utf-8-sig", newline="") as fh:
        writer = csv.DictWriter(
            fh, fieldnames=["url", "filepath", "title"], delimiter="\t", quoting=csv.QUOTE_ALL
        )
        writer.writeheader()
        writer.writerows(rows)
    assert vlret_rows(path) == truth(path, "\t", "filepath", "title")
    assert [r.image for r in read_csv_pairs(path)] == [r["filepath"] for r in rows]


# -- shards written by webdataset.ShardWriter -------------------------------------------------

wds = pytest.importorskip("webdataset")
Image = pytest.importorskip("PIL.Image")

from vlret.data.formats.shards import ShardDevSet, ShardStream, expand_shards  # noqa: E402


def make_samples(n: int) -> list[dict[str, Any]]:
    """Samples as a user hands them to ShardWriter: PIL images (RGB JPEG, RGB PNG, greyscale
    PNG), str captions, dict metadata; ShardWriter's own encoders write the members."""
    rng = np.random.default_rng(0)
    samples = []
    for i in range(n):
        key = f"{i:09d}"
        sample: dict[str, Any] = {
            "__key__": key,
            "txt": f'sample {i}: a photo, "quoted" ',
            "json": {"i": i},
        }
        if i % 3 == 0:
            sample["jpg"] = Image.fromarray(
                rng.integers(0, 256, (9 + i % 4, 11, 3), dtype=np.uint8)
            )
        elif i % 3 == 1:
            sample["png"] = Image.fromarray(rng.integers(0, 256, (7, 5 + i % 3, 3), dtype=np.uint8))
        else:
            grey = rng.integers(0, 256, (6, 8), dtype=np.uint8)
            sample["png"] = Image.fromarray(grey, mode="L")
        samples.append(sample)
    return samples


def independent_reading(files: list[str]) -> dict[str, tuple[np.ndarray, str]]:
    """Key -> (RGB uint8 pixels, caption) read with tarfile and PIL, not webdataset or vlret."""
    members: dict[str, dict[str, bytes]] = {}
    for file in files:
        with tarfile.open(file) as tar:
            for info in tar.getmembers():
                key, _, ext = Path(info.name).name.partition(".")
                members.setdefault(key, {})[ext] = tar.extractfile(info).read()  # type: ignore[union-attr]
    out = {}
    for key, m in members.items():
        data = m.get("jpg", m.get("png"))
        with Image.open(io.BytesIO(data)) as im:
            pixels = np.asarray(im)
        if pixels.ndim == 2:  # greyscale: the value in every channel
            pixels = np.repeat(pixels[:, :, None], 3, axis=2)
        out[key] = (pixels, m["txt"].decode("utf-8").strip())
    return out


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    root = tmp_path_factory.mktemp("wds")
    samples = make_samples(14)
    with wds.ShardWriter(str(root / "shard-%06d.tar"), maxcount=5, verbose=0) as sink:
        for sample in samples:
            sink.write(sample)
    files = expand_shards("shard-{000000..000002}.tar", root=root)
    assert not (root / "shard-000003.tar").exists()  # 14 samples, 5 a shard: three shards
    return files, independent_reading(files)


def test_shard_writer_files_stream_as_tarfile_and_pil_read_them(written):
    files, expected = written
    assert len(expected) == 14 and {v[0].shape[2] for v in expected.values()} == {3}
    stream = ShardStream(files, num_samples=14, batch_size=2, shuffle_buffer=0)
    batches = list(stream.loader(num_workers=0, seed=0))
    seen = {}
    for batch in batches:
        for key, image, caption in zip(batch.keys, batch.features, batch.captions, strict=True):
            seen[key] = (np.asarray(image), caption)
    assert sorted(seen) == sorted(expected) and sum(b.skipped for b in batches) == 0
    for key, (pixels, caption) in expected.items():
        assert seen[key][1] == caption
        assert seen[key][0].dtype == np.uint8 and np.array_equal(seen[key][0], pixels), key


def test_shard_writer_files_as_a_dev_set_in_shard_order(written):
    files, expected = written
    dev = ShardDevSet(files)
    assert dev.image_ids == sorted(expected) and dev.skipped == 0  # written in key order
    for i, key in enumerate(dev.image_ids):
        assert dev.captions[i] == expected[key][1]
        assert np.array_equal(np.asarray(dev.image(i)), expected[key][0]), key
