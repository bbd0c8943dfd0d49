"""The synthetic world: determinism, the real formats, exhaustive relevance, clone edits,
noise masks and the sanity expectations (chance, oracle, bag of words on binding swaps)."""

from __future__ import annotations

import json
import math
from collections import Counter
from dataclasses import replace

import numpy as np
import pytest
import torch

from vlret.data import KarpathyDataset, MSRVTTDataset, PrecompDataset
from vlret.metrics import retrieval_metrics
from vlret.worlds import (
    EDIT_KINDS,
    FactSets,
    apply_edit,
    clone_forced_choice,
    clone_group_images,
    evaluate_synthetic,
    extended_metrics,
    fact_oracle_embeddings,
    generate_world,
    get_preset,
    iter_relevance,
    load_synthetic,
    parse_noise,
    relevance_matrix,
    relevance_pairs,
    subset_recalls,
    synth_main,
    write_synthetic,
)
from vlret.worlds.language import (
    FIELD,
    N_FACTS,
    CaptionPlan,
    Mention,
    fact_names,
    render_caption,
    scene_facts,
)
from vlret.worlds.relevance import clone_trials

SMALL = {"train": 60, "dev": 12, "test": 16}


@pytest.fixture(scope="module")
def world():
    return generate_world("tiny", seed=0)


@pytest.fixture(scope="module")
def clone_world():
    """Many clone groups, no features (fast)."""
    return generate_world("tiny", seed=3, features=False, clone_fraction=0.8, splits={"train": 400})


def naive_relevance(split) -> np.ndarray:
    out = np.zeros((split.num_captions, split.num_images), dtype=bool)
    for j in range(split.num_captions):
        cap = set(split.caption_facts[j].tolist())
        for i in range(split.num_images):
            out[j, i] = cap <= set(split.image_facts[i].tolist())
    return out


# ------------------------------------------------------------------------------ world


def test_same_seed_same_world_and_other_seed_differs(world):
    again = generate_world("tiny", seed=0)
    other = generate_world("tiny", seed=1)
    for name, split in world.splits.items():
        twin = again[name]
        assert split.tokens == twin.tokens
        assert split.scenes == twin.scenes
        assert np.array_equal(split.caption_facts.indices, twin.caption_facts.indices)
        assert np.array_equal(split.groups, twin.groups)
        assert np.array_equal(split.features, twin.features)
    assert world["train"].tokens != other["train"].tokens
    assert not np.array_equal(world["test"].features, other["test"].features)


def test_split_does_not_depend_on_other_split_sizes(world):
    bigger = generate_world("tiny", seed=0, splits={"train": 300, "dev": 40, "test": 40})
    assert bigger["test"].tokens == world["test"].tokens
    assert np.array_equal(bigger["test"].features, world["test"].features)


def test_scene_structure_and_caption_kinds(world):
    train = world["train"]
    k = world.config.captions_per_image
    assert train.num_captions == k * train.num_images
    assert np.array_equal(train.txt_to_img, np.arange(train.num_captions) // k)
    sizes = Counter(len(s) for s in train.scenes)
    assert set(sizes) <= {1, 2, 3, 4} and len(sizes) >= 3
    for scene in train.scenes:
        assert len({o[0] for o in scene}) == len(scene)  # categories distinct
        assert len({o[5] for o in scene}) == len(scene)  # cells distinct
    forms = np.bincount(train.caption_form, minlength=4)
    assert forms[0] > forms[1] > 0  # mostly the primary object; some a secondary one only
    assert forms[2] > 0 and forms[3] > 0
    assert train.features.shape == (train.num_images, 36, 32)
    assert train.features.dtype == np.float32


def test_every_clean_caption_is_relevant_to_its_image_and_names_are_unique(world):
    for split in world.splits.values():
        rel = split.relevance()
        assert rel[np.arange(split.num_captions), split.txt_to_img].all()
    names = fact_names()
    assert len(names) == N_FACTS == len(set(names))


def test_secondary_only_captions_match_images_whose_primary_they_describe(world):
    train = world["train"]
    rel = train.relevance()
    hits = 0
    for j in np.flatnonzero(train.caption_form == 1):
        others = np.flatnonzero(rel[j])
        others = others[others != train.txt_to_img[j]]
        hits += int(len(others) > 0)
    assert hits > 0


# ------------------------------------------------------------------------------ relevance


def test_relevance_equals_naive_subset_check(world):
    split = world["dev"]
    expected = naive_relevance(split)
    assert np.array_equal(split.relevance(), expected)
    blocks = [b for _, b in iter_relevance(split.caption_facts, split.image_facts, chunk_size=7)]
    assert np.array_equal(np.concatenate(blocks), expected)
    txt, img = relevance_pairs(split.caption_facts, split.image_facts, chunk_size=13)
    assert np.array_equal(np.stack([txt, img]), np.stack(np.nonzero(expected)))
    # lists of facts work as well as FactSets
    lists = [list(split.caption_facts[j]) for j in range(split.num_captions)]
    imgs = [list(split.image_facts[i]) for i in range(split.num_images)]
    assert np.array_equal(relevance_matrix(lists, imgs), expected)


def test_factsets_roundtrip_and_padding():
    sets = [[3, 5], [], [7], [1, 2, 9]]
    fs = FactSets.from_lists(sets)
    assert len(fs) == 4 and [list(fs[k]) for k in range(4)] == sets
    assert fs.padded(fill=-1).tolist() == [[3, 5, -1], [-1, -1, -1], [7, -1, -1], [1, 2, 9]]
    dense = fs.dense(10)
    assert dense.sum() == 6 and dense[3, 9] and not dense[1].any()


# ------------------------------------------------------------------------------ sanity


def test_random_embeddings_score_at_chance():
    """Mean over draws of random embeddings sits at the analytic chance level, within six
    standard errors of the query mean (captions of an image share its embedding, so the
    binomial error is inflated by sqrt(K) for the t2i direction)."""
    split = generate_world("tiny", seed=0, features=False, splits={"test": 200})["test"]
    rel = split.relevance()
    n_txt, n_img = rel.shape
    k = split.num_captions // split.num_images
    draws = 4
    gen = torch.Generator().manual_seed(0)
    r1, rp_t2i, rp_i2t, amb = [], [], [], []
    for _ in range(draws):
        img = torch.randn(n_img, 16, generator=gen)
        txt = torch.randn(n_txt, 16, generator=gen)
        r1.append(retrieval_metrics(img, txt, torch.from_numpy(split.txt_to_img)).t2i_r1)
        ext = extended_metrics(img, txt, rel, txt_to_img=split.txt_to_img)
        rp_t2i.append(ext.t2i_rprecision)
        rp_i2t.append(ext.i2t_rprecision)
        amb.append(ext.ambiguity_rate)
    p = 1.0 / n_img
    se = 100 * math.sqrt(p * (1 - p) * k / (n_txt * draws))
    assert abs(np.mean(r1) - 100 * p) < 6 * se
    chance_t2i = 100 * float((rel.sum(1) / n_img).mean())
    chance_i2t = 100 * float((rel.sum(0) / n_txt).mean())
    assert abs(np.mean(rp_t2i) - chance_t2i) < 6 * se
    se_i2t = 100 * math.sqrt(chance_i2t / 100 / (n_img * k * draws))
    assert abs(np.mean(rp_i2t) - chance_i2t) < 6 * se_i2t
    assert max(rp_t2i) < 10 and max(rp_i2t) < 10
    assert len(set(amb)) == 1  # the ambiguity rate depends on the data only


def test_fact_oracle_scores_100_on_extended_metrics_and_clones(clone_world):
    split = generate_world("tiny", seed=0, features=False, splits={"test": 300})["test"]
    img, txt = fact_oracle_embeddings(split.image_facts, split.caption_facts)
    rel = split.relevance()
    ext = extended_metrics(img, txt, rel, txt_to_img=split.txt_to_img, chunk_size=97)
    for value in (ext.t2i_rprecision, ext.t2i_map_at_r, ext.i2t_rprecision, ext.i2t_map_at_r):
        assert value == pytest.approx(100.0)
    assert ext.ambiguity_rate > 0 and ext.mean_relevant_images > 1
    # the standard protocol punishes the oracle for the ambiguity of the data
    std = retrieval_metrics(img, txt, torch.from_numpy(split.txt_to_img))
    assert std.t2i_r1 < 100.0
    train = clone_world["train"]
    img, txt = fact_oracle_embeddings(train.image_facts, train.caption_facts)
    choice = clone_forced_choice(
        img,
        txt,
        txt_to_img=train.txt_to_img,
        groups=train.groups,
        caption_facts=train.caption_facts,
        image_facts=train.image_facts,
    )
    assert choice.t2i == 100.0 and choice.i2t == 100.0
    assert choice.t2i_trials > 100 and choice.i2t_trials > 100


def bow(tokens: list[str]) -> Counter:
    return Counter(t for t in tokens if t not in (",", "."))


def test_bag_of_words_cannot_separate_binding_swap_clones(clone_world):
    train = clone_world["train"]
    k = clone_world.config.captions_per_image
    swapped = []  # (caption of base, caption of binding sibling) stating different facts
    for i in np.flatnonzero(train.edit_kind == EDIT_KINDS.index("binding")):
        base = int(train.edit_parent[i])
        for c in range(k):
            a, b = base * k + c, int(i) * k + c
            if list(train.caption_facts[a]) != list(train.caption_facts[b]):
                swapped.append((a, b))
    assert len(swapped) >= 10
    same_bow = [(a, b) for a, b in swapped if bow(train.tokens[a]) == bow(train.tokens[b])]
    # every focus caption of a binding edit states the swapped attribute on both objects
    assert len(same_bow) >= len(np.flatnonzero(train.edit_kind == 3))
    for a, b in same_bow:
        assert train.tokens[a] != train.tokens[b]  # word order carries the binding
    # A bag-of-words encoder (sum of word vectors) gives those captions identical embeddings,
    # so over both directions of every pair the forced choice is exactly chance.
    vocab = sorted({t for toks in train.tokens for t in toks})
    vectors = torch.randn(len(vocab), 24, generator=torch.Generator().manual_seed(0))
    index = {w: n for n, w in enumerate(vocab)}

    def encode(tokens):  # word counts times word vectors: independent of word order
        counts = torch.bincount(torch.tensor([index[t] for t in tokens]), minlength=len(vocab))
        return counts.to(vectors.dtype) @ vectors

    img = torch.randn(train.num_images, 24, generator=torch.Generator().manual_seed(1))
    correct = []
    for a, b in same_bow:
        ia, ib = int(train.txt_to_img[a]), int(train.txt_to_img[b])
        ea, eb = encode(train.tokens[a]), encode(train.tokens[b])
        assert torch.equal(ea, eb)
        correct.append(float(ea @ img[ia] > ea @ img[ib]))
        correct.append(float(eb @ img[ib] > eb @ img[ia]))
    assert np.mean(correct) == pytest.approx(0.5)


def test_binding_swap_rendering_keeps_words_and_changes_facts():
    red_square = (0, 1, 0, 2, 0, 0)  # square, one, red, large, metal, top left
    blue_circle = (1, 1, 1, 0, 1, 8)
    scene = (red_square, blue_circle)
    swapped = ((0, 1, 1, 2, 0, 0), (1, 1, 0, 0, 1, 8))
    plan = CaptionPlan("pair", (Mention(0, ("colour",)), Mention(1, ("colour", "size"))), 0, 7)
    words_a, facts_a = render_caption(plan, scene)
    words_b, facts_b = render_caption(plan, swapped)
    assert Counter(words_a) == Counter(words_b) and words_a != words_b
    assert facts_a != facts_b and len(facts_a) == len(facts_b) == 5
    assert set(facts_a) <= set(scene_facts(scene))
    assert not set(facts_a) <= set(scene_facts(swapped))


def diff_fields(a, b) -> list[tuple[int, str]]:
    names = ["category", "count", "colour", "size", "material", "cell"]
    return [(s, names[f]) for s in range(len(a)) for f in range(6) if a[s][f] != b[s][f]]


def test_clone_siblings_differ_from_their_base_by_exactly_one_edit(clone_world):
    train = clone_world["train"]
    seen = Counter()
    for i, edit in enumerate(train.edits):
        kind = EDIT_KINDS[train.edit_kind[i]]
        if edit is None:
            assert kind in ("none", "base") and train.edit_parent[i] == -1
            continue
        base = train.scenes[train.edit_parent[i]]
        sibling = train.scenes[i]
        assert train.groups[i] == train.groups[train.edit_parent[i]]
        assert sibling == apply_edit(base, edit) and kind == edit.kind
        assert len(base) == len(sibling)
        diffs = diff_fields(base, sibling)
        fields = {f for _, f in diffs}
        slots = {s for s, _ in diffs}
        if kind in ("attribute", "count"):
            assert len(diffs) == 1 and fields <= {"colour", "size", "material", "count"}
        else:  # binding swap or relation flip: one field swapped between two objects
            assert len(diffs) == 2 and len(fields) == 1 and len(slots) == 2
            assert kind != "relation" or fields == {"cell"}
            s, t = sorted(slots)
            f = FIELD[next(iter(fields))]
            assert base[s][f] == sibling[t][f] and base[t][f] == sibling[s][f]
        assert scene_facts(base) != scene_facts(sibling)
        seen[kind] += 1
    assert set(seen) == {"attribute", "binding", "relation", "count"}
    # group members are contiguous and every group has one base
    for g in np.unique(train.groups):
        members = np.flatnonzero(train.groups == g)
        assert np.array_equal(members, np.arange(members[0], members[-1] + 1))
        if len(members) > 1:
            assert (train.edit_kind[members] == 1).sum() == 1
    # each edit shows in at least one caption: there is a forced-choice trial per sibling
    t2i, _ = clone_trials(
        txt_to_img=train.txt_to_img,
        groups=train.groups,
        caption_facts=train.caption_facts,
        image_facts=train.image_facts,
    )
    siblings = set(np.flatnonzero(train.edit_kind > 1).tolist())
    assert siblings <= set(t2i[:, 1].tolist())


# ------------------------------------------------------------------------------ noise


@pytest.mark.parametrize("mode", ["permute_captions", "permute_images", "falsify"])
def test_noise_modes_and_clean_masks(mode):
    clean_world = generate_world("tiny", seed=5, features=False, splits={"train": 200, "test": 20})
    noisy = generate_world(
        "tiny", seed=5, features=False, splits={"train": 200, "test": 20}, noise=f"{mode}:0.3"
    )
    ref, tr = clean_world["train"], noisy["train"]
    expected = np.array(
        [
            set(tr.caption_facts[j].tolist()) <= set(tr.image_facts[tr.txt_to_img[j]].tolist())
            for j in range(tr.num_captions)
        ]
    )
    assert np.array_equal(tr.clean, expected)
    changed = np.array([a != b for a, b in zip(ref.tokens, tr.tokens, strict=True)])
    assert not changed[tr.clean].any() or mode != "falsify"
    assert (~tr.clean).sum() <= changed.sum()
    noisy_fraction = 1 - tr.clean.mean()
    assert 0.2 < noisy_fraction <= 0.3 + 1e-9
    assert ref.tokens != tr.tokens and ref.scenes == tr.scenes
    if mode.startswith("permute"):  # captions only move
        assert sorted(map(tuple, ref.tokens)) == sorted(map(tuple, tr.tokens))
    if mode == "permute_images":  # whole blocks move: an image's captions stay together
        k = noisy.config.captions_per_image
        blocks = {tuple(map(tuple, ref.tokens[i * k : i * k + k])) for i in range(ref.num_images)}
        for i in range(tr.num_images):
            assert tuple(map(tuple, tr.tokens[i * k : i * k + k])) in blocks
    if mode == "falsify":
        for j in np.flatnonzero(~tr.clean):
            wrong = set(tr.caption_facts[j].tolist()) - set(
                tr.image_facts[tr.txt_to_img[j]].tolist()
            )
            assert 1 <= len(wrong) <= 2  # one stated fact changed (a cell also moves relations)
    # only the training split is noisy
    assert noisy["test"].tokens == clean_world["test"].tokens and noisy["test"].clean.all()


def test_parse_noise_and_options_errors():
    assert parse_noise("falsify:0.1").rate == 0.1
    assert parse_noise({"mode": "permute_images", "rate": 0.5}).mode == "permute_images"
    assert parse_noise(None) is None
    with pytest.raises(ValueError, match="noise mode"):
        parse_noise("shuffle:0.2")
    with pytest.raises(ValueError, match="MODE:RATE"):
        parse_noise("falsify")
    with pytest.raises(ValueError, match="noise rate"):
        parse_noise("falsify:2")
    with pytest.raises(ValueError, match="preset"):
        get_preset("imagenet")
    with pytest.raises(ValueError, match="unknown synthetic options"):
        get_preset("tiny", colours=3)
    assert get_preset("f30k-like").splits == {"train": 29000, "dev": 1000, "test": 1000}
    assert get_preset("coco-like").splits["testall"] == 5000
    assert get_preset("video").captions_per_image == 20


# ------------------------------------------------------------------------------ writers


def test_precomp_written_data_loads_with_side_files(tmp_path):
    root = synth_main(
        "tiny", tmp_path / "p", splits=SMALL, noise="permute_captions:0.2", seed=2, format=None
    )
    world = generate_world("tiny", seed=2, splits=SMALL, noise="permute_captions:0.2")
    meta = json.loads((root / "synthetic.json").read_text())
    assert meta["format"] == "precomp" and meta["noise"]["mode"] == "permute_captions"
    assert meta["train_config_hint"]["data"]["format"] == "precomp"
    for name, n in SMALL.items():
        ds = PrecompDataset(root, name)
        split = world[name]
        assert ds.num_images == n and ds.captions == split.captions("precomp")
        assert ds.feature_shape == (36, 32)
        assert torch.equal(ds.image(3), torch.from_numpy(split.features[3]))
        ann = load_synthetic(root, name)
        assert np.array_equal(ann.groups, split.groups)
        assert np.array_equal(ann.caption_facts.indices, split.caption_facts.indices)
        if name == "train":
            assert np.array_equal(ann.clean, split.clean) and not ann.clean.all()
            assert not (root / "train_relevance.npz").exists()
        else:
            assert ann.clean is None
            assert np.array_equal(ann.relevance(), naive_relevance(split))
    # ids: one per image for train, one per caption otherwise (the real layouts)
    assert len((root / "train_ids.txt").read_text().split()) == SMALL["train"]
    assert len((root / "test_ids.txt").read_text().split()) == 5 * SMALL["test"]
    # evaluation helper on the written side files, with the fact oracle
    ann = load_synthetic(root, "test")
    img, txt = fact_oracle_embeddings(ann.image_facts, ann.caption_facts)
    report = evaluate_synthetic(img, txt, ann)
    assert report["extended"].t2i_map_at_r == pytest.approx(100.0)
    assert report["standard"].rsum > 0
    # writing again into a synthetic folder needs overwrite; into a foreign folder too
    with pytest.raises(FileExistsError, match="already holds a synthetic world"):
        write_synthetic("tiny", root, splits=SMALL, seed=2)
    write_synthetic("tiny", root, splits=SMALL, seed=2, overwrite=True)
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("x")
    with pytest.raises(FileExistsError):
        write_synthetic("tiny", foreign, splits=SMALL)


def test_karpathy_written_data_loads_with_rendered_images(tmp_path):
    pytest.importorskip("PIL")
    from PIL import Image

    root = write_synthetic(
        "coco-like", tmp_path / "k", format="karpathy", splits={"train": 20, "dev": 4, "testall": 6}
    )
    world = generate_world(
        "coco-like", features=False, splits={"train": 20, "dev": 4, "testall": 6}
    )
    json_path = root / "dataset_coco.json"
    for name, n in (("train", 20), ("dev", 4), ("testall", 6)):
        ds = KarpathyDataset(json_path, name, image_root=root / "images")
        assert ds.num_images == n
        assert ds.captions == world[name].captions("raw")
        im = Image.open(ds.image(0))
        assert im.size == (64, 64) and im.mode == "RGB"
    splits = {e["split"] for e in json.loads(json_path.read_text())["images"]}
    assert splits == {"train", "restval", "val", "test"}
    hint = json.loads((root / "synthetic.json").read_text())["train_config_hint"]["data"]
    assert hint["karpathy_json"] == str(json_path) and hint["image_root"].endswith("images")


def test_msrvtt_written_data_loads_full_and_1ka(tmp_path):
    sizes = {"train": 12, "dev": 3, "test": 8}
    root = write_synthetic("video", tmp_path / "v", format="msrvtt", splits=sizes, n_1ka=5)
    world = generate_world("video", splits=sizes, n_1ka=5)
    for name, n in sizes.items():
        ds = MSRVTTDataset(root, name, protocol="full")
        assert ds.num_images == n and ds.num_captions == 20 * n
        assert ds.captions == world[name].captions("msrvtt")
        assert ds.image(0).shape == (12, 64)
        assert torch.allclose(ds.image(1), torch.from_numpy(world[name].features[1]))
    test_1ka = MSRVTTDataset(root, "test", protocol="1k-A")
    assert test_1ka.num_images == test_1ka.num_captions == 5
    assert test_1ka.captions[0] == world["test"].captions("msrvtt")[20 * 3]
    train_1ka = MSRVTTDataset(root, "train", protocol="1k-A")
    assert train_1ka.num_images == 12 + 3 + 3
    # precomp on the video preset: frames as regions, 20 captions per "image"
    root_p = write_synthetic("video", tmp_path / "vp", splits={"train": 4, "dev": 2, "test": 2})
    assert PrecompDataset(root_p, "test", captions_per_image=20).feature_shape == (12, 64)


def test_harness_trains_on_written_synthetic_data(tmp_path):
    from vlret.run import config_from_dict
    from vlret.train import train

    root = write_synthetic("tiny", tmp_path / "d", splits={"train": 64, "dev": 16, "test": 16})
    hint = json.loads((root / "synthetic.json").read_text())["train_config_hint"]
    raw = {
        "output_dir": str(tmp_path / "run"),
        "data": {**hint["data"], "min_count": 1},
        "model": {
            "embed_dim": 16,
            "image": {"kind": "precomp", "in_dim": hint["image_in_dim"], "pooling": "max"},
            "text": {"kind": "gru", "word_dim": 8, "bidirectional": True, "pooling": "last"},
        },
        "loss": {"name": "triplet"},
        "optim": {"name": "adam", "lr": 1e-3},
        "train": {"epochs": 1, "batch_size": 32, "seed": 0, "progress": False},
    }
    result = train(config_from_dict(raw))
    assert result is not None


# ------------------------------------------------------------------------------ query subsets


def _naive_ranks(img: torch.Tensor, txt: torch.Tensor, t2i: list[int]):
    """(i2t, t2i) 0-based ranks by loops: how many wrong candidates score above the best
    right one (continuous random scores: no ties)."""
    s = (img.double() @ txt.double().t()).tolist()
    n_img, n_txt = len(s), len(t2i)
    t2i_ranks = [sum(s[i][j] > s[t2i[j]][j] for i in range(n_img)) for j in range(n_txt)]
    i2t_ranks = []
    for i in range(n_img):
        best = max(s[i][j] for j in range(n_txt) if t2i[j] == i)
        i2t_ranks.append(sum(s[i][j] > best for j in range(n_txt) if t2i[j] != i))
    return i2t_ranks, t2i_ranks


def test_subset_recalls_equal_naive_loops():
    g = torch.Generator().manual_seed(0)
    img, txt = torch.randn(30, 4, generator=g), torch.randn(90, 4, generator=g)
    t2i = [j // 3 for j in range(90)]
    cap = np.arange(90) % 4 == 1
    im = np.arange(30) % 3 == 0
    got = subset_recalls(img, txt, txt_to_img=t2i, caption_mask=cap, image_mask=im)
    i2t_ranks, t2i_ranks = _naive_ranks(img, txt, t2i)
    for k in (1, 5, 10):
        want_t = 100.0 * np.mean([t2i_ranks[j] < k for j in range(90) if cap[j]])
        want_i = 100.0 * np.mean([i2t_ranks[i] < k for i in range(30) if im[i]])
        assert getattr(got, f"t2i_r{k}") == pytest.approx(want_t)
        assert getattr(got, f"i2t_r{k}") == pytest.approx(want_i)
    assert (got.t2i_queries, got.i2t_queries) == (int(cap.sum()), int(im.sum()))
    assert 0 < got.t2i_r5 < 100  # the subsets tell the directions and cut-offs apart
    none = subset_recalls(img, txt, txt_to_img=t2i, caption_mask=cap)
    assert math.isnan(none.i2t_r1) and none.i2t_queries == 0
    with pytest.raises(ValueError, match="caption_mask must be a boolean array of shape"):
        subset_recalls(img, txt, txt_to_img=t2i, caption_mask=np.ones(89, dtype=bool))
    with pytest.raises(ValueError, match="image_mask"):
        subset_recalls(img, txt, txt_to_img=t2i, image_mask=np.arange(30))


def test_clone_group_images():
    assert clone_group_images([5, 5, 7, 8, 8, 8, 9]).tolist() == [1, 1, 0, 1, 1, 1, 0]


def test_evaluate_synthetic_subsets_use_the_worlds_masks(clone_world):
    split = generate_world("tiny", seed=3, features=False, clone_fraction=0.5)["test"]
    g = torch.Generator().manual_seed(1)
    img = torch.randn(split.num_images, 8, generator=g)
    txt = torch.randn(split.num_captions, 8, generator=g)
    out = evaluate_synthetic(img, txt, split)["subsets"]
    t2i = split.txt_to_img.tolist()
    i2t_ranks, t2i_ranks = _naive_ranks(img, txt, t2i)
    sizes = Counter(split.groups.tolist())
    in_group = [sizes[gid] >= 2 for gid in split.groups.tolist()]
    assert any(in_group) and not all(in_group)
    forms = split.caption_form.tolist()
    captions = {
        "secondary": [f == 1 for f in forms],
        "primary": [f == 0 for f in forms],
        "clone_group": [in_group[t2i[j]] for j in range(len(t2i))],
        "no_clone": [not in_group[t2i[j]] for j in range(len(t2i))],
    }
    images = {"clone_group": in_group, "no_clone": [not x for x in in_group]}
    for name, mask in captions.items():
        want = 100.0 * np.mean([t2i_ranks[j] < 5 for j, m in enumerate(mask) if m])
        assert out[name].t2i_r5 == pytest.approx(want), name
        assert out[name].t2i_queries == sum(mask)
    for name, mask in images.items():
        want = 100.0 * np.mean([i2t_ranks[i] < 5 for i, m in enumerate(mask) if m])
        assert out[name].i2t_r5 == pytest.approx(want), name
    assert math.isnan(out["secondary"].i2t_r1)


# ------------------------------------------------------------------------------ vlret synth


def test_synth_refuses_to_replace_a_world_without_overwrite(tmp_path, capsys):
    # A model trained on the old world silently lost its data (rsum 113.0 -> 87.5): replacing
    # needs --overwrite (overwrite=True), as the help says.
    from vlret.cli import main

    out = tmp_path / "w"
    assert main(["synth", "tiny", "--out", str(out)]) == 0
    before = (out / "train_ims.npy").read_bytes()
    capsys.readouterr()
    assert main(["synth", "tiny", "--out", str(out), "--seed", "1"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("vlret synth: ") and err.count("\n") == 1
    assert str(out) in err and "--overwrite" in err
    assert (out / "train_ims.npy").read_bytes() == before
    assert json.loads((out / "synthetic.json").read_text())["seed"] == 0
    with pytest.raises(FileExistsError, match="overwrite=True"):
        write_synthetic("tiny", out, seed=1)
    assert main(["synth", "tiny", "--out", str(out), "--seed", "1", "--overwrite"]) == 0
    assert json.loads((out / "synthetic.json").read_text())["seed"] == 1
    assert (out / "train_ims.npy").read_bytes() != before


def _printed_train_command(text: str) -> tuple[str, list[str]]:
    import shlex

    (line,) = [x for x in text.splitlines() if "vlret train " in x]
    argv = shlex.split(line[line.index("vlret train ") :])
    return argv[2], [argv[i + 1] for i, a in enumerate(argv) if a == "--set"]


@pytest.mark.parametrize(
    ("preset", "fmt", "sizes"),
    [("tiny", "precomp", None), ("video", "msrvtt", {"train": 12, "dev": 4, "test": 6})],
)
def test_synth_prints_the_overrides_a_shipped_config_needs(tmp_path, capsys, preset, fmt, sizes):
    # No shipped config ran on `vlret synth tiny` as is (in_dim 64 vs 32, found at the first
    # forward pass); `vlret synth` prints the --set overrides, derived from the world.
    from vlret.cli import main
    from vlret.run import load_config
    from vlret.train import train

    out = tmp_path / "w"
    if sizes is None:
        assert main(["synth", preset, "--out", str(out), "--format", fmt]) == 0
        text = capsys.readouterr().out
    else:  # the CLI's sizes are the preset's: write a cut through the same entry point
        from vlret.worlds import synth_main, train_hint_lines

        synth_main(preset, out, format=fmt, splits=sizes, n_1ka=3)
        text = "\n".join(train_hint_lines(out))
    config, sets = _printed_train_command(text)
    meta = json.loads((out / "synthetic.json").read_text())
    feature_dim = meta["config"]["feature_dim"]
    assert f"model.image.in_dim={feature_dim}" in sets and f"data.root={out}" in sets
    assert f"data.format={fmt}" in sets
    run = [
        "train.epochs=1",
        "train.max_steps_per_epoch=2",
        "train.batch_size=8",
        "train.progress=false",
        f"output_dir={tmp_path / 'run'}",
    ]
    result = train(load_config(config, [*sets, *run]))  # a shipped config's name
    assert result.steps == 2


@pytest.mark.parametrize(
    "value",
    [
        "/data/w",
        "rel/dir with space",
        "2024",
        "1e-4",
        "[1, 2]",
        "{a = 1}",
        "true",
        "False",
        "null",
        "None",
        "~",
        '"quoted"',
        " padded ",
        "inf",
        "nan",
        "2024-01-01",
        "ünïcode\\back",
        "",
        None,
        True,
        False,
        7,
        0.25,
    ],
)
def test_hint_values_round_trip_through_set(value):
    # The hint writes each data key as `--set data.KEY=VALUE`; the value must come back as
    # itself through the trainer's parser, and a plain path must stay unquoted (readable).
    from vlret.run.config import apply_overrides
    from vlret.run.config_files import parse_value
    from vlret.worlds.hint import train_overrides

    meta = {"train_config_hint": {"data": {"root": value, "format": "karpathy"}}}
    item = train_overrides(meta)[0]
    assert item.startswith("data.root=")
    raw = apply_overrides({"data": {}}, [item])
    if value is None:  # `--set KEY=null` deletes the key: its declared default applies
        assert "root" not in raw["data"]
    else:
        assert raw["data"]["root"] == value and type(raw["data"]["root"]) is type(value)
    if isinstance(value, str) and parse_value(value) == value:
        assert item == f"data.root={value}"


def test_hint_does_not_import_the_trainer():
    # vlret.data sits below vlret.train (the import-linter layers in pyproject).
    import subprocess
    import sys

    code = (
        "import sys; import vlret.worlds.hint as h; "
        "h.train_overrides({'train_config_hint': {'data': {'root': '1'}, 'image_in_dim': 4}}); "
        "print('vlret.train' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_one_set_of_preset_names_for_synth_and_demo(capsys, monkeypatch):
    # `vlret demo --preset small` trained on a world `vlret synth` had no name for: now each
    # demo preset is the synth preset of the same name (the same world).
    from vlret.cli import main
    from vlret.demo import DEMO_PRESETS
    from vlret.worlds import PRESETS

    assert set(DEMO_PRESETS) <= set(PRESETS)
    small, f30k = get_preset("small"), get_preset("f30k-like")
    assert small.splits == {"train": 6000, "dev": 500, "test": 1000}
    same = {"name": "", "splits": {"train": 1}}
    assert replace(small, **same) == replace(f30k, **same)  # the same world, other sizes
    cut = {"train": 30, "dev": 5, "test": 8}
    a, b = generate_world("small", splits=cut), generate_world("f30k-like", splits=cut)
    for split in cut:
        assert a[split].tokens == b[split].tokens
        assert np.array_equal(a[split].features, b[split].features)
    monkeypatch.setenv("COLUMNS", "1000")  # argparse wraps at hyphens ("coco-\nlike") when narrow
    with pytest.raises(SystemExit):
        main(["synth", "--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    assert all(name in help_text for name in PRESETS)
