"""Shards named by webdataset's URLs (vlret.data.formats.shard_urls): shards written by
``webdataset.ShardWriter``, read through ``pipe:cat PATH``, through an HTTP server started here
on 127.0.0.1 and as ``file:`` URLs, give the samples of the local files sample for sample, split
over ranks and workers and resumed the same; bad samples inside them are counted the same; a
failing command, an HTTP error, a refused connection or a cut transfer stops the reading in one
line naming the shard as written; the form of a URL is checked before a run."""

from __future__ import annotations

import base64
import http.server
import io
import os
import signal
import socket
import tarfile
import threading
import time
from functools import partial
from pathlib import Path

import numpy as np
import pytest
import torch

wds = pytest.importorskip("webdataset")
Image = pytest.importorskip("PIL.Image")

from vlret.data.formats import shard_urls  # noqa: E402
from vlret.data.formats.shard_urls import ShardReadError, read_shards, shown_url  # noqa: E402
from vlret.data.formats.shards import (  # noqa: E402
    ShardDevSet,
    ShardError,
    ShardStream,
    expand_shards,
)


@pytest.fixture(autouse=True)
def no_hang():
    """A test that waits for more than a minute fails instead of hanging the suite."""

    def fail(signum, frame):
        raise TimeoutError("the test waited for more than 60 s")

    old = signal.signal(signal.SIGALRM, fail)
    signal.alarm(60)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, old)


def jpeg(seed: int) -> bytes:
    rng = np.random.default_rng(seed)
    buf = io.BytesIO()
    Image.fromarray(rng.integers(0, 256, (6 + seed % 3, 7, 3), dtype=np.uint8)).save(buf, "JPEG")
    return buf.getvalue()


def write_shards(root: Path, count: int, per_shard: int, bad: dict[int, str] | None = None):
    """``count`` shards of ``per_shard`` samples written by webdataset's ShardWriter (the real
    producer, as img2dataset uses it); ``bad``: sample index -> "jpeg" (corrupt bytes) or
    "caption" (empty). Returns the good keys."""
    bad = bad or {}
    good = []
    with wds.ShardWriter(str(root / "%05d.tar"), maxcount=per_shard, verbose=0) as sink:
        for i in range(count * per_shard):
            key = f"{(i // per_shard) * 10_000 + i % per_shard:09d}"
            image = jpeg(i) if bad.get(i) != "jpeg" else b"\xff\xd8 not a jpeg"
            caption = "  " if bad.get(i) == "caption" else f"caption {key}"
            sink.write({"__key__": key, "jpg": image, "txt": caption, "json": {"key": key}})
            if i not in bad:
                good.append(key)
    return good


class Handler(http.server.SimpleHTTPRequestHandler):
    """Serves the shard folder; ``/busy/NAME`` answers 503 once per name, ``/private/NAME``
    wants user "u" with password "secret", ``/cut/NAME`` announces more bytes than it sends."""

    busy_seen: set[str] = set()

    def log_message(self, *args) -> None:  # quiet
        pass

    def do_GET(self) -> None:
        if self.path.startswith("/busy/") and self.path not in self.busy_seen:
            self.busy_seen.add(self.path)
            self.send_error(503)
            return
        if self.path.startswith("/private/"):
            token = base64.b64encode(b"u:secret").decode()
            if self.headers.get("Authorization") != f"Basic {token}":
                self.send_error(401)
                return
        if self.path.startswith("/cut/"):
            data = (Path(self.directory) / self.path.split("/")[-1]).read_bytes()
            self.send_response(200)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data[: len(data) // 2])
            self.close_connection = True
            return
        for prefix in ("/busy", "/private"):
            if self.path.startswith(prefix + "/"):
                self.path = self.path[len(prefix) :]
        super().do_GET()


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """Four shards of 6 samples, and the base URL of an HTTP server serving their folder."""
    root = tmp_path_factory.mktemp("shards")
    keys = write_shards(root, 4, 6)
    server = http.server.ThreadingHTTPServer(
        ("127.0.0.1", 0), partial(Handler, directory=str(root))
    )
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield root, keys, f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def forms(root: Path, base: str) -> dict[str, str]:
    """The same four shards named each way."""
    return {
        "local": f"{root}/{{00000..00003}}.tar",
        "pipe": f"pipe:cat {root}/{{00000..00003}}.tar",
        "http": f"{base}/{{00000..00003}}.tar",
        "file": f"file://{root}/{{00000..00003}}.tar",
        "mixed": f"pipe:cat {root}/0000{{0..1}}.tar::{base}/0000{{2..3}}.tar",
    }


def stream(files, n, batch=4, **kw):
    kw.setdefault("shuffle_buffer", 5)
    kw.setdefault("image_transform", pixels)
    return ShardStream(files, num_samples=n, batch_size=batch, seed=3, **kw)


def epoch(st, number=0, start=0, workers=0):
    st.set_epoch(number, start_batch=start)
    return list(st.loader(num_workers=workers, seed=number))


def summary(batches):
    """What a batch hands over: keys, captions, ids, pixels, skipped counts."""
    return [
        (b.keys, b.captions, b.img_index.tolist(), b.features.tolist(), b.skipped) for b in batches
    ]


def pixels(image):
    return torch.from_numpy(np.asarray(image, dtype=np.uint8).copy()).float().mean((0, 1))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# -- the same samples --------------------------------------------------------------------------


def test_every_url_form_reads_the_local_files_sample_for_sample(served):
    root, keys, base = served
    names = {form: expand_shards(spec) for form, spec in forms(root, base).items()}
    assert names["pipe"] == [f"pipe:cat {root}/{i:05d}.tar" for i in range(4)]
    assert names["http"][3] == f"{base}/00003.tar"
    assert names["file"] == names["local"]  # a file: URL is a local path spelled as a URL
    want: dict[int, list] = {}
    for form, files in names.items():  # "local" first: the others must read what it reads
        for workers in (0, 2):
            st = stream(files, 24, num_workers=workers)
            got = summary(epoch(st, number=1, workers=workers))
            assert got == want.setdefault(workers, got), (form, workers)
    assert sorted(k for b in want[0] for k in b[0]) == sorted(keys)  # one pass: every sample
    local = ShardDevSet(names["local"], image_transform=pixels)
    for form in ("pipe", "http", "mixed"):
        dev = ShardDevSet(names[form], image_transform=pixels)
        assert dev.image_ids == local.image_ids == keys and dev.captions == local.captions
        assert all(torch.equal(dev.image(i), local.image(i)) for i in range(len(keys)))


def test_url_shards_split_over_ranks_and_workers_as_local_ones(served):
    root, keys, base = served
    local, url = expand_shards(forms(root, base)["local"]), expand_shards(forms(root, base)["http"])
    seen = []
    for rank in (0, 1):
        kw = dict(rank=rank, world_size=2, num_workers=2)
        got = epoch(stream(url, 24, **kw), workers=2)
        assert summary(got) == summary(epoch(stream(local, 24, **kw), workers=2))
        seen.append({k for b in got for k in b.keys})
        # each of the rank's two workers reads whole shards of its own
        shards_of = [{int(k) // 10_000 for k in b.keys} for b in got]
        assert not set().union(*shards_of[0::2]) & set().union(*shards_of[1::2])
    assert not seen[0] & seen[1] and seen[0] | seen[1] == set(keys)


@pytest.mark.parametrize("form", ["pipe", "http"])
def test_a_resumed_epoch_on_url_shards_hands_over_the_uninterrupted_batches(served, form):
    root, _, base = served
    files = expand_shards(forms(root, base)[form])
    full = summary(epoch(stream(files, 24, num_workers=2), number=2, workers=2))
    for start in (1, 4):
        rest = epoch(stream(files, 24, num_workers=2), number=2, start=start, workers=2)
        assert summary(rest) == full[start:]
    # and the resumed run reads what a resumed run on the local files reads
    local = expand_shards(forms(root, base)["local"])
    assert summary(epoch(stream(local, 24, num_workers=2), number=2, workers=2)) == full


def test_bad_samples_in_url_shards_are_skipped_and_counted_as_in_local_files(tmp_path, served):
    _, _, base = served
    root = tmp_path / "bad"
    root.mkdir()
    good = write_shards(root, 3, 8, bad={1: "jpeg", 4: "caption", 10: "jpeg"})
    with tarfile.open(root / "00002.tar") as tar:  # cut the last shard inside its last image
        last = [m for m in tar.getmembers() if m.name.endswith(".jpg")][-1]
    data = (root / "00002.tar").read_bytes()
    (root / "00002.tar").write_bytes(data[: last.offset_data + last.size // 2])
    good.remove("000020007")
    local = expand_shards(f"{root}/{{00000..00002}}.tar")
    pipe = expand_shards(f"pipe:cat {root}/{{00000..00002}}.tar")
    want = summary(epoch(stream(local, 20, max_bad_fraction=0.5, shuffle_buffer=0)))
    assert sorted(k for b in want for k in b[0]) == sorted(good)
    assert sum(b[-1] for b in want) >= 3  # two corrupt JPEGs and an empty caption (and the cut)
    got = summary(epoch(stream(pipe, 20, max_bad_fraction=0.5, shuffle_buffer=0)))
    assert got == want  # the same samples, batches and skipped counts
    dev_local = ShardDevSet(local, max_bad_fraction=0.5)
    dev_pipe = ShardDevSet(pipe, max_bad_fraction=0.5)
    assert dev_pipe.image_ids == dev_local.image_ids and dev_pipe.skipped == dev_local.skipped >= 3
    # the bad-fraction stop holds for URL shards as for files: one line
    with pytest.raises(ShardError, match=r"max_bad_fraction = 0\.01") as err:
        epoch(stream(pipe, 20, max_bad_fraction=0.01, shuffle_buffer=0))
    assert "\n" not in str(err.value)


# -- a shard that cannot be read ----------------------------------------------------------------


def one_line(err: pytest.ExceptionInfo, *parts: str) -> str:
    text = str(err.value)
    assert "\n" not in text
    for part in parts:
        assert part in text, (part, text)
    return text


def failures(root: Path, base: str) -> list[tuple[str, str]]:
    """(a shard that cannot be read, a part of the one line it gives)."""
    return [
        ("pipe:false", "the command exited with status 1"),
        (f"pipe:cat {root}/missing.tar", "exited with status 1"),
        (f"pipe:cat {root}/00000.tar; exit 3", "exited with status 3"),  # after a whole tar
        (f"{base}/missing.tar", "HTTP 404"),
        (f"http://127.0.0.1:{free_port()}/00000.tar", "unreachable (Connection refused)"),
        (f"{base}/cut/00001.tar", "the connection closed after"),
    ]


@pytest.mark.parametrize("workers", [0, 2])
def test_a_failing_command_or_url_stops_the_epoch_in_one_line_naming_the_shard(served, workers):
    root, _, base = served
    good = expand_shards(forms(root, base)["local"])
    for shard, what in failures(root, base):
        start = time.monotonic()
        # the failing shard among good ones, read by worker 0 (so never silently left out)
        files = [shard, *good[1:]]
        st = stream(files, 24, num_workers=workers, shuffle_buffer=0, max_bad_fraction=1.0)
        with pytest.raises(ShardError) as err:
            epoch(st, workers=workers)
        one_line(err, f"data.shards: {shard}: ", what)
        assert time.monotonic() - start < 30


def test_a_failing_dev_shard_is_one_line_naming_it(served):
    root, _, base = served
    for shard, what in failures(root, base):
        with pytest.raises(ShardError) as err:
            ShardDevSet([shard], max_bad_fraction=1.0)
        one_line(err, f"data.dev_shards: {shard}: ", what)


def test_a_shard_left_in_part_stops_its_command_at_once(served):
    root, keys, _ = served
    start = time.monotonic()  # a command that would go on for a minute after its tar
    dev = ShardDevSet([f"pipe:cat {root}/00000.tar; sleep 60"], max_images=2)
    assert dev.image_ids == keys[:2] and time.monotonic() - start < 20


def test_a_busy_server_is_asked_again_and_a_password_never_shown(served, monkeypatch):
    root, keys, base = served
    monkeypatch.setattr(shard_urls, "HTTP_RETRY_DELAY", 0.01)
    dev = ShardDevSet([f"{base}/busy/00000.tar"])  # 503 first, then the shard
    assert dev.image_ids == keys[:6]
    user = base.replace("http://", "http://u:secret@")
    assert ShardDevSet([f"{user}/private/00001.tar"]).image_ids == keys[6:12]
    wrong = base.replace("http://", "http://u:wrong@")
    with pytest.raises(ShardError) as err:
        ShardDevSet([f"{wrong}/private/00001.tar"])
    text = one_line(err, "HTTP 401", "http://u:***@127.0.0.1")
    assert "wrong" not in text
    assert shown_url("pipe:curl -sf https://a:b@h/x.tar") == "pipe:curl -sf https://a:***@h/x.tar"
    (root / "empty.tar").write_bytes(b"")  # served whole, holding nothing: named, password hidden
    user_empty = [f"{user}/private/empty.tar"]
    with pytest.raises(ShardError) as err:
        epoch(stream(user_empty, 4, max_bad_fraction=1.0))
    assert "secret" not in one_line(err, "read no sample", "(http://u:***@127.0.0.1")
    with pytest.raises(ValueError) as err:
        ShardDevSet(user_empty, max_bad_fraction=1.0)
    assert "secret" not in one_line(err, "http://u:***@127.0.0.1", "hold no readable sample")


def test_an_environment_variable_is_replaced_when_opened_and_never_shown(
    served, monkeypatch, tmp_path
):
    root, keys, _ = served
    monkeypatch.setenv("WDS_SHARDS", str(root))
    files = expand_shards("pipe:cat ${SHARDS}/0000{0..1}.tar")
    assert files == ["pipe:cat ${SHARDS}/00000.tar", "pipe:cat ${SHARDS}/00001.tar"]
    assert ShardDevSet(files).image_ids == keys[:12]
    monkeypatch.setenv("WDS_SHARDS", "/no/such/folder-s3cr3t")
    with pytest.raises(ShardError) as err:
        ShardDevSet(files)
    text = one_line(err, "pipe:cat ${SHARDS}/00000.tar: the command exited with status 1")
    assert "s3cr3t" not in text
    monkeypatch.delenv("WDS_SHARDS")
    with pytest.raises(ValueError, match=r"\$\{SHARDS\}.*WDS_SHARDS.*not set"):
        expand_shards("pipe:cat ${SHARDS}/00000.tar")
    with pytest.raises(ValueError, match=r"WDS_SHARDS.*not set"):  # a local path, as before
        expand_shards("${SHARDS}/00000.tar")
    # webdataset's rule for local paths: the environment, then the braces
    monkeypatch.setenv("WDS_SHARDS", str(root))
    assert expand_shards("${SHARDS}/0000{0..1}.tar") == [f"{root}/0000{i}.tar" for i in (0, 1)]


def test_read_shards_never_hands_a_read_failure_to_the_bad_sample_handler(served):
    root, _, _ = served
    handled = []
    samples = read_shards(["pipe:false"], handler=lambda e: handled.append(e) or True, key="k")
    with pytest.raises(ShardReadError, match="^k: pipe:false: the command exited with status 1"):
        list(samples)
    assert handled == []


# -- the form of a URL, before the run ---------------------------------------------------------


def test_the_form_of_a_url_is_checked_before_any_reading(served, tmp_path):
    root, _, base = served
    refused = [
        ("s3://bucket/cc3m/{00000..00001}.tar", "read it through.*'pipe:aws s3 cp s3://bucket/"),
        ("gs://bucket/00000.tar", r"'pipe:gsutil cat gs://bucket/00000\.tar'"),
        ("hf://datasets/x/00000.tar", r"hf:// is not read.*pipe:"),
        ("pipe:  ", "no command after 'pipe:'"),
        ("http:///00000.tar", "no host"),
        ("http://127.0.0.1:port/00000.tar", "port is not a number"),
        (f"{base}/a shard.tar", "space or control character.*%20"),
        ("file://otherhost/x.tar", "a file: URL names a file of this machine"),
    ]
    for spec, match in refused:
        with pytest.raises(ValueError, match=match) as err:
            expand_shards(spec, key="data.dev_shards")
        assert "\n" not in str(err.value) and str(err.value).startswith("data.dev_shards: ")
    with pytest.raises(FileNotFoundError, match=r"data.shards: .*missing.tar: missing"):
        expand_shards(f"file://{root}/missing.tar")
    # nothing is fetched or run up front: a command or URL that would fail passes the check
    assert expand_shards(["pipe:false", f"{base}/missing.tar"]) == [
        "pipe:false",
        f"{base}/missing.tar",
    ]
    # local paths: exactly as before (webdataset's expansion, started from root)
    here = expand_shards("{00000..00003}.tar::00001.tar", root=root)
    assert here == [
        str(root / n) for n in wds.shardlists.expand_urls("{00000..00003}.tar::00001.tar")
    ]
    assert os.path.isfile(here[0])


def test_a_server_that_never_answers_fails_after_its_timeout(monkeypatch):
    monkeypatch.setattr(shard_urls, "HTTP_TIMEOUT", 0.3)
    monkeypatch.setattr(shard_urls, "HTTP_RETRY_DELAY", 0.01)
    with socket.socket() as silent:  # accepts connections (the backlog), never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        url = f"http://127.0.0.1:{silent.getsockname()[1]}/00000.tar"
        start = time.monotonic()
        with pytest.raises(ShardError) as err:
            ShardDevSet([url])
        one_line(err, f"data.dev_shards: {url}: no answer within 0.3 s")
        assert time.monotonic() - start < 10  # 1 + HTTP_RETRIES tries of 0.3 s


def test_a_local_shard_gone_since_the_check_stops_the_epoch_in_one_line(served, tmp_path):
    root, _, _ = served
    copy = tmp_path / "00000.tar"
    copy.write_bytes((root / "00000.tar").read_bytes())
    files = expand_shards([str(copy), f"{root}/0000{{1..3}}.tar"])
    copy.unlink()  # once counted as a bad sample, the shard's samples silently left out
    with pytest.raises(ShardError) as err:
        epoch(stream(files, 24, max_bad_fraction=1.0))
    one_line(err, f"data.shards: {copy}: cannot be opened (No such file or directory)")
