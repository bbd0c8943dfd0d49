"""Every deprecated name of :mod:`vlret.data`, each with its replacement and the version that
removes it.

In 0.1.0 the synthetic retrieval worlds were :mod:`vlret.data.synthetic`, a sub-package of the
readers. They are the top-level package :mod:`vlret.worlds` now (issue 42): the worlds write
data in the formats the readers read and score models against their exhaustive relevance, and
no reader imports them. The 0.1.0 names of ``vlret.data.synthetic`` (its ``__all__``) stay
importable from that path (the package's ``__getattr__``,
:func:`vlret._deprecation.module_getattr`), each access with a :class:`DeprecationWarning`
naming the replacement ``vlret.worlds.<name>``, until :data:`REMOVED_IN`. Its modules' own paths
(``vlret.data.synthetic.io`` ...) were never on the API reference and are gone.

==============================================  ==============================
0.1.0 name                                      use instead
==============================================  ==============================
``vlret.data.synthetic.<name>``, every name of  ``vlret.worlds.<name>``
its ``__all__`` (:data:`SYNTHETIC_NAMES`)
==============================================  ==============================

Every name above is removed in 0.3.0.
"""

from __future__ import annotations

from .._deprecation import OldName

#: The version that removes every name below.
REMOVED_IN = "0.3.0"

#: The ``__all__`` of 0.1.0's ``vlret.data.synthetic``, each now :mod:`vlret.worlds`' own.
SYNTHETIC_NAMES: tuple[str, ...] = (
    "META_FILE",
    "CAPTION_FORMS",
    "EDIT_KINDS",
    "FORMATS",
    "NOISE_MODES",
    "PRESETS",
    "CloneChoice",
    "Edit",
    "ExtendedMetrics",
    "FactSets",
    "FeatureSpace",
    "NoiseSpec",
    "SubsetRecall",
    "SyntheticAnnotations",
    "SyntheticConfig",
    "SyntheticSplit",
    "SyntheticWorld",
    "apply_edit",
    "apply_noise",
    "build_split",
    "check_out_dir",
    "clone_forced_choice",
    "clone_group_images",
    "evaluate_synthetic",
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
    "sample_edit",
    "sample_scene",
    "subset_recalls",
    "synth_main",
    "train_hint_lines",
    "train_overrides",
    "write_synthetic",
)

#: The old names, served by :mod:`vlret.data.synthetic`'s ``__getattr__``.
OLD_NAMES: tuple[OldName, ...] = tuple(
    OldName(
        module="vlret.data.synthetic",
        name=name,
        replacement=f"vlret.worlds.{name}",
        removed_in=REMOVED_IN,
        target=f"vlret.worlds:{name}",
    )
    for name in SYNTHETIC_NAMES
)

__all__ = ["OLD_NAMES", "REMOVED_IN", "SYNTHETIC_NAMES"]
