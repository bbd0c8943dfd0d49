"""Captions generated for a dataset's images, read in place of its annotations (AdaCL 3.4:
pseudo captions for weakly-supervised matching; docs/captions.md).

* :mod:`vlret.data.captioning_files`: the captions file (one caption per line, ``k`` per
  image, in split order) and its JSON sidecar; what ``data.train_captions``
  (``dev_captions``, ``test_captions``) reads.
* :mod:`.images`: a split's images in split order (Karpathy JSON + image folder; a synthetic
  world's rendered pictures).
* :mod:`.generate`: ``vlret caption``, a local Hugging Face captioner (BLIP, BLIP-2, GIT) over
  those images, resumable, writing a captions file (imports transformers when called).
* CoCa (AdaCL's fourth captioner) is not run: it is an open_clip model and open_clip cannot
  be installed here. A captions file CoCa (or any tool) wrote elsewhere in the format above is
  read the same way (docs/captions.md, "Captions made elsewhere").

The datasets import :mod:`vlret.data.captioning_files` alone (no cycle through this package).
"""

from ..data.captioning_files import (
    FORMAT_KEY,
    CaptionsFile,
    clean_caption,
    read_captions_file,
    sidecar_path,
    write_captions_file,
)

__all__ = [
    "FORMAT_KEY",
    "CaptionsFile",
    "clean_caption",
    "read_captions_file",
    "sidecar_path",
    "write_captions_file",
]
