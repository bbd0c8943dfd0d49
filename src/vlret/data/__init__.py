"""On-disk data formats, tokenisation and retrieval datasets.

* :mod:`~vlret.data.formats`: the data-format registry (one record per ``data.format``, its
  reader beside it; :func:`~vlret.data.formats.open_dataset` opens a split of any of them):
  precomputed features, Karpathy JSON + images, MSR-VTT and its multi-expert features,
  webdataset shards (local files or URLs, streamed; ``pixels`` extra), CSV / TSV pairs and
  person search (CUHK-PEDES, ICFG-PEDES, RSTPReid).
* :mod:`~vlret.data.dataset`: the contract every format implements (one item per caption).
* :mod:`~vlret.data.config`: the ``[data]`` section of a run config.
* :mod:`~vlret.data.transforms`: seeded training augmentation (random-resized crop, flip).
* :mod:`~vlret.data.vocab`: regex tokeniser, vocabulary JSON, local Hugging Face tokenizers.
* :mod:`~vlret.data.noisy`, :mod:`~vlret.data.offline_negatives`: what training applies to its
  split (noisy correspondence, AOQ's offline negatives).
* :mod:`~vlret.data.writers`: writers of these formats and tiny generated data sets.

Every dataset yields ``(features, caption ids, image index, caption index)`` per caption,
collates with ``dataset.collate`` (captions padded, with lengths) and exposes ``txt_to_img`` for
:func:`vlret.metrics.retrieval_metrics`. :func:`check_features` scans a split's precomputed
features for NaN / inf and a size other than the model's ``in_dim`` before training.
"""

from .checks import DataFormatError
from .dataset import (
    CaptionEncoder,
    RetrievalBatch,
    RetrievalDataset,
    RetrievalItem,
    check_features,
    collate_retrieval,
    pad_captions,
)
from .expert_batch import ExpertBatch, ExpertSample
from .formats.csv import CsvPairsDataset, read_csv_pairs
from .formats.experts.features import (
    ExpertFeatures,
    ExpertSpec,
    convert_experts,
    write_expert_features,
)
from .formats.karpathy import KarpathyDataset, build_karpathy_vocab
from .formats.karpathy_json import (
    KarpathyData,
    KarpathyImage,
    KarpathySentence,
    read_karpathy_json,
)
from .formats.msrvtt import (
    FULL_SPLIT_SIZES,
    ONE_K_A_SIZES,
    MSRVTTDataset,
    VideoFeatures,
    build_msrvtt_vocab,
    read_jsfusion_csv,
    read_msrvtt_json,
    read_train_csv,
)
from .formats.pedes import (
    PEDES_FORMATS,
    CUHKPedesDataset,
    ICFGPedesDataset,
    IRRAAugment,
    PersonSearchDataset,
    RSTPReidDataset,
    read_pedes_json,
)
from .formats.precomp import SPLITS, PrecompDataset, build_precomp_vocab
from .formats.shards import ShardDevSet, ShardError, ShardStream, expand_shards
from .transforms import RandomResizedCrop
from .vocab import (
    SPECIAL_TOKENS,
    HFTokenizer,
    Vocabulary,
    build_vocab,
    load_hf_tokenizer,
    tokenize,
)

__all__ = [
    "FULL_SPLIT_SIZES",
    "ONE_K_A_SIZES",
    "PEDES_FORMATS",
    "SPECIAL_TOKENS",
    "SPLITS",
    "CUHKPedesDataset",
    "CaptionEncoder",
    "CsvPairsDataset",
    "DataFormatError",
    "ExpertBatch",
    "ExpertFeatures",
    "ExpertSample",
    "ExpertSpec",
    "HFTokenizer",
    "ICFGPedesDataset",
    "IRRAAugment",
    "KarpathyData",
    "KarpathyDataset",
    "KarpathyImage",
    "KarpathySentence",
    "MSRVTTDataset",
    "PersonSearchDataset",
    "PrecompDataset",
    "RSTPReidDataset",
    "RandomResizedCrop",
    "RetrievalBatch",
    "RetrievalDataset",
    "RetrievalItem",
    "ShardDevSet",
    "ShardError",
    "ShardStream",
    "VideoFeatures",
    "Vocabulary",
    "build_karpathy_vocab",
    "build_msrvtt_vocab",
    "build_precomp_vocab",
    "build_vocab",
    "check_features",
    "collate_retrieval",
    "convert_experts",
    "expand_shards",
    "load_hf_tokenizer",
    "pad_captions",
    "read_csv_pairs",
    "read_jsfusion_csv",
    "read_karpathy_json",
    "read_msrvtt_json",
    "read_pedes_json",
    "read_train_csv",
    "tokenize",
    "write_expert_features",
]
