"""MkDocs hook for the API site: the README becomes the "Guide" page.

The README lives at the repository root, outside ``docs_dir``, and links the topic pages as
``docs/NAME.md``. The hook adds it to the site as a generated ``guide.md`` with those links made
relative to ``docs/``, so the built site is self-contained and ``--strict`` checks its links.
"""

from __future__ import annotations

import re
from pathlib import Path

from mkdocs.config.defaults import MkDocsConfig
from mkdocs.structure.files import File, Files

_DOCS_LINK = re.compile(r"\]\(docs/")


def on_files(files: Files, config: MkDocsConfig) -> Files:
    readme = Path(config.config_file_path).parent / "README.md"
    text = _DOCS_LINK.sub("](", readme.read_text(encoding="utf-8"))
    files.append(File.generated(config, "guide.md", content=text))
    return files
