"""Taking a vlret CLIP out: ``transformers`` folders (:mod:`.hf`) and open_clip state dicts
with their model config (:mod:`.open_clip`); what neither can hold is refused in one line
(:mod:`.parts`). ``vlret export`` (docs/export.md) is the command line; ``transformers`` is
imported only when a format needs it."""

from __future__ import annotations

from .folder import EXPORT_FILES, check_export_dir, write_export_dir
from .parts import EXPORTABLE_KINDS, CLIPParts, ExportRefused, clip_parts

#: The formats ``vlret export --format`` writes.
EXPORT_FORMATS = ("hf", "open_clip")

__all__ = [
    "EXPORTABLE_KINDS",
    "EXPORT_FILES",
    "EXPORT_FORMATS",
    "CLIPParts",
    "ExportRefused",
    "check_export_dir",
    "clip_parts",
    "write_export_dir",
]
