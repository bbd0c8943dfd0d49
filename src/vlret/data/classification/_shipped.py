"""Class names and prompt templates: the lists shipped as package data, and user files.

The shipped files (``classnames/*.txt``, ``templates/*.txt`` beside this module, found through
``Path(__file__).parent`` so that the source tree and an installed wheel read the same files)
hold one entry a line after a ``#`` header that names their source.
"""

from __future__ import annotations

from pathlib import Path

from ..checks import DataFormatError, read_lines

_HERE = Path(__file__).parent
CLASSNAMES_DIR = _HERE / "classnames"
TEMPLATES_DIR = _HERE / "templates"

#: the template list each set uses by default (CLIP_benchmark's per-dataset lists; ImageNet-1k
#: and an image folder take OpenAI's 80 ImageNet templates, CLIP_benchmark's fallback)
DEFAULT_TEMPLATES: dict[str, str] = {
    "imagenet1k": "openai",
    "cifar10": "cifar",
    "cifar100": "cifar",
    "caltech101": "caltech101",
    "food101": "food101",
    "flowers102": "flowers102",
    "pets": "pets",
    "fgvc_aircraft": "fgvc_aircraft",
    "imagefolder": "openai",
}


def _entries(path: Path, what: str) -> list[tuple[int, str]]:
    """``(line number, entry)`` of a one-entry-a-line file: ``#`` lines and blank lines at the
    end skipped, surrounding whitespace stripped; a blank line before an entry is refused."""
    out = []
    for number, line in enumerate(read_lines(path, what), start=1):
        if line.lstrip().startswith("#"):
            continue
        entry = line.strip()
        if not entry:
            raise DataFormatError(path, f"a blank line; expected {what}", line=number)
        out.append((number, entry))
    if not out:
        raise DataFormatError(path, f"holds no entry; expected {what}")
    return out


def read_classnames(path: str | Path) -> list[str]:
    """Read class names, one a line (line k: the name of label k).

    Lines starting with ``#`` are comments; surrounding whitespace is stripped; the file is
    UTF-8. The names need not be unique (CLIP's ImageNet list repeats two).

    Args:
        path: The file.

    Returns:
        The names.

    Raises:
        FileNotFoundError: The file is missing.
        DataFormatError: A blank line between names, no name, or text that is not UTF-8.
    """
    return [e for _, e in _entries(Path(path), "class names, one a line")]


def shipped_classnames(name: str) -> list[str]:
    """A class-name list shipped with vlret (``classnames/NAME.txt``: ``imagenet1k``,
    ``imagenet1k_wnids``, ``caltech101``, ``caltech101_folders``, ``flowers102``, ``pets``)."""
    return read_classnames(CLASSNAMES_DIR / f"{name}.txt")


def _read_templates(path: Path) -> list[str]:
    templates = []
    for number, entry in _entries(path, "prompt templates, one a line, with {c}"):
        if "{c}" not in entry:
            if "{}" not in entry:
                raise DataFormatError(
                    path,
                    f"template {entry!r} has no {{c}} (or open_clip's {{}}) for the class name",
                    line=number,
                )
            entry = entry.replace("{}", "{c}")
        templates.append(entry)
    return templates


def default_templates(name: str) -> list[str]:
    """The prompt templates a set uses by default, with a ``{c}`` placeholder.

    CLIP_benchmark's per-dataset lists (CLIP's own): ImageNet-1k and ``imagefolder`` use
    OpenAI's 80 ImageNet templates, CIFAR-10/100 18, Caltech-101 34, Food-101, Flowers-102 and
    Pets 1 each, FGVC-Aircraft 2.

    Args:
        name: One of :data:`vlret.data.classification.DATASETS`.

    Raises:
        ValueError: An unknown set (the known are listed).
    """
    if name not in DEFAULT_TEMPLATES:
        raise ValueError(f"dataset {name!r}: expected one of {', '.join(DEFAULT_TEMPLATES)}")
    return _read_templates(TEMPLATES_DIR / f"{DEFAULT_TEMPLATES[name]}.txt")


def load_templates(spec: str) -> list[str]:
    """Prompt templates from ``--templates``: ``"openai"`` (OpenAI's 80 ImageNet templates),
    a set's name (its :func:`default_templates`), or a file.

    A file holds one template a line with ``{c}`` where the class name goes (open_clip's ``{}``
    is accepted and rewritten to ``{c}``); ``#`` lines are comments. A name wins over a file of
    the same name in the working folder (write ``./openai`` for the file).

    Args:
        spec: The name or the file's path.

    Raises:
        FileNotFoundError: ``spec`` is neither a known name nor an existing file.
        DataFormatError: A template without a placeholder (file and line named), a blank
            line between templates, or no template.
    """
    if spec == "openai":
        return _read_templates(TEMPLATES_DIR / "openai.txt")
    if spec in DEFAULT_TEMPLATES:
        return default_templates(spec)
    path = Path(spec)
    if not path.is_file():
        raise FileNotFoundError(
            f"{spec}: no such file; expected openai, a dataset name "
            f"({', '.join(DEFAULT_TEMPLATES)}) or a file of templates, one a line, with {{c}}"
        )
    return _read_templates(path)
