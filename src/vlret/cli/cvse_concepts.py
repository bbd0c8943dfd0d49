"""``vlret cvse-concepts DATA_ROOT --out DIR``: CVSE's concept statistics of a precomputed data
folder's training captions, in the files the authors' release reads
(:mod:`vlret.models.matchers.cvse_concepts`), plus the vocabulary map a ``kind = "cvse"``
model reads from the same folder (its ``concepts`` key).

The captions are tokenised as training tokenises them: with ``--vocab`` (the run's
``data.vocab``) or, as a run without one does, with the vocabulary built from the train (and
dev) captions with ``--min-count`` (4)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from ._common import EXIT_OK, fail, positive_int

NAME = "cvse-concepts"


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register ``cvse-concepts`` on the ``vlret`` sub-command parsers."""
    p = subparsers.add_parser(
        NAME,
        help="compute CVSE's concept list, labels and co-occurrence graph from training captions",
        description="Write category_concepts.json, all_<ds>_concept_label.json and "
        "<ds>_adj_concepts.pkl (the CVSE release's formats) and cvse_vocab_concepts.json from "
        "the training captions of a precomputed data folder; a cvse model's `concepts` key "
        "names the folder.",
    )
    p.add_argument("data_root", type=Path, help="the precomputed data folder ({split}_caps.txt)")
    p.add_argument("--out", type=Path, required=True, help="the folder to write")
    p.add_argument("--dataset", default="f30k", help="the file names' dataset name (f30k, coco)")
    p.add_argument("--split", default="train", help="the split counted (default train)")
    p.add_argument(
        "--num-concepts",
        type=positive_int,
        default=300,
        help="concepts chosen by frequency, stop words left out (default 300, the release's)",
    )
    p.add_argument(
        "--concepts",
        type=Path,
        default=None,
        help="use this concept list instead: a category_concepts.json or one word per line",
    )
    p.add_argument(
        "--groups",
        default=None,
        help="objects,properties,motions sizes for adj_O_P / adj_O_M (default 210,60,30 for "
        "300 concepts, else all objects)",
    )
    p.add_argument("--vocab", type=Path, default=None, help="the run's vocabulary JSON")
    p.add_argument("--min-count", type=positive_int, default=4, help="vocabulary threshold")
    p.add_argument("--captions-per-image", type=positive_int, default=5)
    p.add_argument("--overwrite", action="store_true", help="replace existing files in --out")
    p.set_defaults(func=run)
    return p


def _groups(text: str | None) -> tuple[int, ...] | None:
    if text is None:
        return None
    try:
        return tuple(int(x) for x in text.split(","))
    except ValueError:
        raise ValueError(
            f"--groups: expected three integers such as 210,60,30, got {text!r}"
        ) from None


def _concept_list(path: Path) -> list[str]:
    from ..models.matchers.cvse_files import read_category_concepts

    if path.suffix == ".json":
        return read_category_concepts(path)
    if not path.is_file():
        raise FileNotFoundError(f"--concepts: {path} is missing")
    return [line.strip() for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def write_concepts(args: argparse.Namespace) -> tuple[list[Path], Any, list[str]]:
    """Compute and write the folder; ``(files, stats, concepts missing from the vocabulary)``."""
    from .._files import check_output_file
    from ..data.formats.precomp import PrecompDataset, load_precomp_captions
    from ..data.vocab import Vocabulary, build_vocab, word_tokenizer
    from ..models.matchers import cvse_concepts as cc
    from ..models.matchers import cvse_files as cf

    groups = _groups(args.groups)  # the arguments and the output paths before the work
    names = [
        cf.CATEGORY_FILE,
        cf.LABELS_FILE.format(ds=args.dataset),
        cf.ADJACENCY_FILE.format(ds=args.dataset),
        cf.VOCAB_CONCEPTS_FILE,
    ]
    for name in names:
        check_output_file(args.out / name, "--out", name, overwrite=args.overwrite)
    data = PrecompDataset(args.data_root, args.split, captions_per_image=args.captions_per_image)
    if args.vocab is not None:
        vocab = Vocabulary.load(args.vocab)
    else:
        splits = ["train"] + (["dev"] if (args.data_root / "dev_caps.txt").is_file() else [])
        captions = load_precomp_captions(
            args.data_root, splits, captions_per_image=args.captions_per_image
        )
        vocab = build_vocab(captions, min_count=args.min_count)
    split = word_tokenizer(vocab.tokenizer)
    tokens = [split(c) for c in data.captions]
    owners = data.txt_to_img.tolist()
    ids = data.image_ids if data.image_ids is not None else range(data.num_images)
    concepts = _concept_list(args.concepts) if args.concepts is not None else None
    stats = cc.compute_concept_stats(
        tokens,
        owners,
        [str(i) for i in ids],
        concepts=concepts,
        num_concepts=args.num_concepts,
        groups=groups,
    )
    files = cf.write_concept_folder(
        args.out, stats, dataset=args.dataset, vocab_words=vocab.idx2word
    )
    unknown = [w for w in stats.concepts if w not in vocab]
    return files, stats, unknown


def run(args: argparse.Namespace) -> int:
    """Write the folder and print what it holds."""
    try:
        files, stats, unknown = write_concepts(args)
    except (FileNotFoundError, ValueError) as err:  # DataFormatError, OutputPathError included
        return fail(NAME, err)
    labelled = sum(1 for labels in stats.labels if labels)
    print(
        f"{args.out}: {len(stats.concepts)} concepts over {len(stats.labels)} images "
        f"({labelled} with a concept), {int(stats.adj_all.sum()) // 2} co-occurring pairs counted"
    )
    for path in files:
        print(f"  {path.name}")
    if unknown:
        print(
            f"  note: {len(unknown)} concepts are not vocabulary words and never label a "
            f"caption in the model: {', '.join(unknown[:10])}"
        )
    return EXIT_OK
