"""A procedural image-text retrieval world that exercises what the papers claim.

Each image is a scene: one primary object and 0-3 secondary ones, each with a category,
count, colour, size, material and a cell of a 3 x 3 grid; relations (left of, above) follow
from the cells. The scene's facts are atomic propositions (``colour(square)=red``,
``left_of(square, circle)``; :mod:`~vlret.worlds.language`). Each image gets ``K``
captions from a grammar with synonyms and varied word order, each stating a random subset of
the facts: most describe the primary object, some only a secondary one (so they also fit
images whose primary object it is, the case VSL targets). Clone siblings, images that differ
from a base image by one edit (an attribute, a binding swap, a relation flip, a count), share
their caption plans, so their captions are near-duplicates (the case AdaCL targets).

Because the facts are known, relevance is exhaustive: a caption is relevant to every image
whose facts include its facts (:mod:`~vlret.worlds.relevance`). Region features are
composed from fixed random embeddings of the concepts through a fixed random non-linear map,
plus noise and background regions, so an encoder has to learn the composition; the video
preset has frame features instead, and the video-experts preset four expert features that
each carry a different part of the scene (:mod:`~.video_experts`). The writers emit the real
on-disk formats (SCAN precomp, Karpathy JSON with rendered images, MSR-VTT) through
:mod:`vlret.data.writers`, plus side files with the facts, relevance, clone groups and the
clean mask (``docs/synthetic.md``)::

    from vlret.worlds import write_synthetic
    write_synthetic("tiny", "data/synth_tiny", format="precomp", seed=0,
                    noise="permute_captions:0.2")

A fixed seed gives the same world (``numpy.random.Generator`` streams keyed by seed, split and
purpose, so one split does not change when another's size does).

Modules, in the order a world is made: :mod:`~.config` (sizes, presets, noise),
:mod:`~.language` (lexicon, facts, caption grammar), :mod:`~.scenes` (scenes and clone edits),
:mod:`~.splits` (captions, clone groups, noise), :mod:`~.features` (region and frame
features), :mod:`~.video_experts` (the multi-expert features), :mod:`~.world` (all splits in
memory), :mod:`~.io` (the on-disk formats and side files; :mod:`~.render` draws the pictures,
:mod:`~.pixels` writes them as webdataset shards and image folders, :mod:`~.hint` the
``vlret train`` settings),
:mod:`~.relevance` (exhaustive relevance, clone forced choice) and :mod:`~.evaluation`
(reading a split back and scoring embeddings on it).
"""

from ..metrics import ExtendedMetrics, SubsetRecall, extended_metrics, subset_recalls
from .config import (
    CAPTION_FORMS,
    EDIT_KINDS,
    FORMATS,
    NOISE_MODES,
    PRESETS,
    NoiseSpec,
    SyntheticConfig,
    get_preset,
    parse_noise,
)
from .evaluation import SyntheticAnnotations, evaluate_synthetic, load_synthetic
from .features import FeatureSpace, frame_features, make_feature_space, region_features
from .hint import META_FILE, train_hint_lines, train_overrides
from .io import check_out_dir, synth_main, write_synthetic
from .persons import PersonsWorld, generate_persons, write_persons
from .pixels import LABEL_KINDS, SHARD_SAMPLES, render_jpeg, write_pixels
from .relevance import (
    CloneChoice,
    FactSets,
    clone_forced_choice,
    clone_group_images,
    fact_oracle_embeddings,
    iter_relevance,
    relevance_matrix,
    relevance_pairs,
)
from .scenes import Edit, apply_edit, sample_edit, sample_scene
from .splits import SyntheticSplit, apply_noise, build_split
from .video_experts import EXPERTS, SyntheticExperts, expert_dims, expert_features
from .world import SyntheticWorld, generate_world

__all__ = [
    "PersonsWorld",
    "generate_persons",
    "write_persons",
    "EXPERTS",
    "META_FILE",
    "CAPTION_FORMS",
    "EDIT_KINDS",
    "FORMATS",
    "LABEL_KINDS",
    "NOISE_MODES",
    "PRESETS",
    "SHARD_SAMPLES",
    "CloneChoice",
    "Edit",
    "ExtendedMetrics",
    "FactSets",
    "FeatureSpace",
    "NoiseSpec",
    "SubsetRecall",
    "SyntheticAnnotations",
    "SyntheticConfig",
    "SyntheticExperts",
    "SyntheticSplit",
    "SyntheticWorld",
    "apply_edit",
    "apply_noise",
    "build_split",
    "check_out_dir",
    "clone_forced_choice",
    "clone_group_images",
    "evaluate_synthetic",
    "expert_dims",
    "expert_features",
    "extended_metrics",
    "fact_oracle_embeddings",
    "frame_features",
    "generate_world",
    "get_preset",
    "iter_relevance",
    "load_synthetic",
    "make_feature_space",
    "parse_noise",
    "region_features",
    "relevance_matrix",
    "relevance_pairs",
    "render_jpeg",
    "sample_edit",
    "sample_scene",
    "subset_recalls",
    "synth_main",
    "train_hint_lines",
    "train_overrides",
    "write_pixels",
    "write_synthetic",
]
