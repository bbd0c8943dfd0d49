"""Text-based person search data: CUHK-PEDES, ICFG-PEDES and RSTPReid.

* :mod:`~vlret.data.formats.pedes.common`: the annotation files, parsed and checked, the official
  splits and the relabelling of identities.
* :mod:`~vlret.data.formats.pedes.readers`: the splits as retrieval data sets whose batches carry
each
  item's identity (images, or precomputed features in ``{split}_ims.npy``).
* :mod:`~vlret.data.formats.pedes.augment`: IRRA's 384 x 128 training augmentation and evaluation
  resize (``data.train_transform = "irra"``).
"""

from .augment import IRRAAugment, ResizeNormalize, build_irra_transforms
from .common import (
    PEDES_FORMATS,
    PedesData,
    PedesImage,
    default_annotations,
    identity_labels,
    read_pedes_json,
)
from .readers import (
    CUHKPedesDataset,
    ICFGPedesDataset,
    PersonSearchDataset,
    RSTPReidDataset,
    open_person_search,
    person_search_vocab_captions,
)

__all__ = [
    "PEDES_FORMATS",
    "CUHKPedesDataset",
    "ICFGPedesDataset",
    "IRRAAugment",
    "PedesData",
    "PedesImage",
    "PersonSearchDataset",
    "RSTPReidDataset",
    "ResizeNormalize",
    "build_irra_transforms",
    "default_annotations",
    "identity_labels",
    "open_person_search",
    "person_search_vocab_captions",
    "read_pedes_json",
]
