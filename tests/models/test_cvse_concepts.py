"""CVSE's concept statistics and files against naive oracles and files written by Python's own
pickle / json (the release's producers), and ``vlret cvse-concepts`` on a precomputed folder
written as plain text and ``np.save``."""

from __future__ import annotations

import argparse
import json
import os
import pickle
from collections import Counter

import numpy as np
import pytest
import torch

from vlret.cli import cvse_concepts as cli
from vlret.data.vocab import build_vocab, tokenize
from vlret.models import build_model
from vlret.models.matchers import cvse_concepts as cc
from vlret.models.matchers import cvse_files as cf
from vlret.models.matchers.cvse_layers import gen_adj as torch_gen_adj

CAPS = [
    "A man in a red shirt rides a bike .",
    "A man on a bike .",
    "Two dogs run on green grass .",
    "A dog runs on the grass .",
    "A woman and a man sit on a red bench .",
    "People sit on a bench .",
]


def test_select_concepts_counts_words_outside_the_stop_list():
    tokens = [tokenize(c) for c in CAPS]
    counts = Counter(t for c in tokens for t in c if t.isalpha() and t not in cc.STOP_WORDS)
    want = sorted(counts, key=lambda w: (-counts[w], w))[:5]
    got = cc.select_concepts(tokens, num_concepts=5)
    assert got == want and got[0] == "man" and "a" not in got and "." not in got
    with pytest.raises(ValueError, match="num_concepts"):
        cc.select_concepts(tokens, num_concepts=500)


def test_labels_and_cooccurrence_match_loops():
    rng = np.random.default_rng(0)
    labels = [sorted(set(rng.integers(0, 9, size=rng.integers(0, 6)).tolist())) for _ in range(40)]
    nums, adj = cc.cooccurrence(labels, 9)
    for i in range(9):
        assert nums[i] == sum(i in s for s in labels)
        for j in range(9):
            want = 0 if i == j else sum(i in s and j in s for s in labels)
            assert adj[i, j] == want
    o_p, o_m = cc.group_blocks(adj, (4, 3, 2))
    assert (o_p[:4, 4:7] == adj[:4, 4:7]).all() and (o_p[4:7, :4] == adj[4:7, :4]).all()
    assert o_p[:4, :4].sum() == 0 and o_p[:, 7:].sum() == 0
    assert (o_m[:4, 7:] == adj[:4, 7:]).all() and o_m[4:7].sum() == 0
    with pytest.raises(ValueError, match="groups"):
        cc.group_blocks(adj, (4, 3, 3))


def test_image_labels_are_the_union_of_surface_matches():
    tokens = [tokenize(c) for c in CAPS]
    concepts = ["man", "dog", "dogs", "bench", "red"]
    got = cc.image_labels(tokens, [0, 0, 1, 1, 2, 2], 3, concepts)
    assert got == [[0, 4], [1, 2], [0, 3, 4]]  # "dogs" and "dog" each their own surface form
    with pytest.raises(ValueError, match="image_of_caption"):
        cc.image_labels(tokens, [0, 0, 1], 3, concepts)


def _naive_complex(counts, nums, second):
    c = len(nums)
    p = [[counts[i][j] / nums[i] if nums[i] else 0.0 for j in range(c)] for i in range(c)]
    b = [
        [1.0 if 5 ** (p[i][j] - 0.02) - 5 ** (-0.02) >= 0.3 else 0.0 for j in range(c)]
        for i in range(c)
    ]
    col = [sum(b[i][j] for i in range(c)) for j in range(c)]
    w = [[b[i][j] * 0.25 / (col[j] + 1e-6) for j in range(c)] for i in range(c)]
    if second:
        col = [sum(w[i][j] for i in range(c)) for j in range(c)]
        w = [[w[i][j] / (col[j] + 1e-8) for j in range(c)] for i in range(c)]
    return np.array([[w[i][j] + (i == j) for j in range(c)] for i in range(c)])


def test_gen_a_concept_complex_matches_a_naive_loop():
    rng = np.random.default_rng(1)
    labels = [sorted(set(rng.integers(0, 8, size=rng.integers(1, 5)).tolist())) for _ in range(60)]
    nums, adj = cc.cooccurrence(labels, 10)  # concepts 8, 9 never occur: empty rows
    o_p, o_m = cc.group_blocks(adj, (5, 3, 2))
    got = cc.gen_a_concept({"nums": nums, "adj_all": adj, "adj_O_P": o_p, "adj_O_M": o_m})
    for key, counts, second in (
        ("adj_all", adj, False),
        ("adj_O_P", o_p, True),
        ("adj_O_M", o_m, True),
    ):
        assert got[key].dtype == np.float32
        np.testing.assert_allclose(got[key], _naive_complex(counts, nums, second), rtol=1e-6)
    assert 0 < (got["adj_all"] - np.eye(10)).sum() < 10  # some edges, weight 0.25 per column
    a = got["adj_all"].astype(np.float64)
    torch.testing.assert_close(torch_gen_adj(torch.from_numpy(a)), torch.from_numpy(cc.gen_adj(a)))


def _stats():
    tokens = [tokenize(c) for c in CAPS]
    return cc.compute_concept_stats(tokens, [0, 0, 1, 1, 2, 2], ["10", "20", "30"], num_concepts=5)


@pytest.mark.parametrize("protocol", range(6))
def test_adjacency_pickles_of_every_protocol_read_back(tmp_path, protocol):
    arrays = {
        "nums": np.arange(4, dtype=np.int64),
        "adj_all": np.arange(16, dtype=np.float64).reshape(4, 4),
        "adj_O_P": np.eye(4),
        "adj_O_M": np.asfortranarray(np.ones((4, 4), dtype=np.float32)),
    }
    path = tmp_path / "x_adj_concepts.pkl"
    with path.open("wb") as fh:
        pickle.dump(arrays, fh, protocol=protocol)
    got = cf.read_adjacency_pickle(path)
    for key, value in arrays.items():
        np.testing.assert_array_equal(got[key], value)


class _Hostile:
    def __reduce__(self):
        return (os.system, ("echo pwned > /dev/null",))


def test_adjacency_pickle_refuses_code_and_bad_contents(tmp_path):
    path = tmp_path / "bad.pkl"
    path.write_bytes(pickle.dumps({"nums": _Hostile()}))
    with pytest.raises(ValueError, match=r"refuses (posix|os)\.system"):
        cf.read_adjacency_pickle(path)
    path.write_bytes(pickle.dumps({"nums": np.ones(3)}))
    with pytest.raises(ValueError, match="lacks key 'adj_all'"):
        cf.read_adjacency_pickle(path)
    keys = {"nums": np.ones(3), "adj_all": np.ones((3, 2)), "adj_O_P": np.ones((3, 3))}
    path.write_bytes(pickle.dumps({**keys, "adj_O_M": np.ones((3, 3))}))
    with pytest.raises(ValueError, match=r"adj_all has shape \(3, 2\)"):
        cf.read_adjacency_pickle(path)
    with pytest.raises(ValueError, match="max_bytes"):
        cf.read_adjacency_pickle(path, max_bytes=10)
    path.write_bytes(b"not a pickle")
    with pytest.raises(ValueError, match="not a readable pickle"):
        cf.read_adjacency_pickle(path)


def test_written_files_are_what_pickle_and_json_read(tmp_path):
    stats = _stats()
    vocab = build_vocab(CAPS, min_count=1)
    cf.write_concept_folder(tmp_path, stats, dataset="f30k", vocab_words=vocab.idx2word)
    with (tmp_path / "f30k_adj_concepts.pkl").open("rb") as fh:
        plain = pickle.load(fh)  # the release's loader
    assert sorted(plain) == sorted(cc.ADJACENCY_KEYS)
    np.testing.assert_array_equal(plain["adj_all"], stats.adj_all)
    category = json.loads((tmp_path / "category_concepts.json").read_text())
    assert category == {w: i for i, w in enumerate(stats.concepts)}
    labels = json.loads((tmp_path / "all_f30k_concept_label.json").read_text())
    assert labels[0] == {"img_id": "10", "concept_labels": stats.labels[0]}
    assert (
        cf.read_concept_labels(tmp_path / "all_f30k_concept_label.json", 5)["30"] == stats.labels[2]
    )
    size, pairs = cf.read_vocab_concepts(tmp_path / cf.VOCAB_CONCEPTS_FILE, 5)
    assert size == len(vocab) and pairs[vocab("man")] == stats.concepts.index("man")


def test_category_files_written_by_json_read_back(tmp_path):
    path = tmp_path / "category_concepts.json"
    path.write_text(json.dumps({"dog": 1, "man": 0, "red": 2}))
    assert cf.read_category_concepts(path) == ["man", "dog", "red"]
    path.write_text(json.dumps({"dog": 1, "man": 1}))
    with pytest.raises(ValueError, match="index 1 given to"):
        cf.read_category_concepts(path)


def _precomp(root, captions, per_image=2):
    root.mkdir()
    n = len(captions) // per_image
    np.save(root / "train_ims.npy", np.random.default_rng(0).normal(size=(n, 3, 4)).astype("f4"))
    (root / "train_caps.txt").write_text("\n".join(captions) + "\n")
    (root / "train_ids.txt").write_text("\n".join(str(100 + i) for i in range(n)) + "\n")


def _run(argv):
    parser = argparse.ArgumentParser()
    cli.add_parser(parser.add_subparsers())
    args = parser.parse_args([cli.NAME, *argv])
    return args.func(args)


def test_the_command_writes_a_folder_a_model_reads(tmp_path, capsys):
    root, out = tmp_path / "data", tmp_path / "concepts"
    _precomp(root, CAPS)
    argv = [
        str(root),
        "--out",
        str(out),
        "--num-concepts",
        "5",
        "--min-count",
        "1",
        "--captions-per-image",
        "2",
    ]
    assert _run(argv) == 0
    assert "5 concepts over 3 images" in capsys.readouterr().out
    labels = json.loads((out / "all_f30k_concept_label.json").read_text())
    assert [e["img_id"] for e in labels] == ["100", "101", "102"]
    assert labels == [
        {"img_id": "10" + str(i), "concept_labels": s} for i, s in enumerate(_stats().labels)
    ]
    assert _run(argv) == 2  # existing files without --overwrite
    assert "--overwrite" in capsys.readouterr().err
    vocab = build_vocab(CAPS, min_count=1)
    model = build_model(
        {
            "kind": "cvse",
            "embed_dim": 8,
            "concepts": str(out),
            "num_regions": 3,
            "image": {"in_dim": 4},
            "text": {"word_dim": 6},
        },
        vocab_size=len(vocab),
    )
    ids = torch.tensor([vocab.encode(CAPS[0])])
    labels0 = model.caption_labels(ids, torch.tensor([ids.shape[1]]))
    names = json.loads((out / "category_concepts.json").read_text())
    assert {w for w, i in names.items() if labels0[0, i]} == {"man", "red", "bike"} & set(names)


def test_the_command_reads_a_given_concept_list(tmp_path, capsys):
    root, out = tmp_path / "data", tmp_path / "concepts"
    _precomp(root, CAPS)
    (tmp_path / "list.txt").write_text("bench\nman\n")
    argv = [
        str(root),
        "--out",
        str(out),
        "--concepts",
        str(tmp_path / "list.txt"),
        "--min-count",
        "1",
        "--captions-per-image",
        "2",
    ]
    assert _run(argv) == 0
    assert json.loads((out / "category_concepts.json").read_text()) == {"bench": 0, "man": 1}
    assert _run([str(root), "--out", str(tmp_path / "o2"), "--groups", "1,x"]) == 2
    assert "--groups" in capsys.readouterr().err
