"""The optional dependencies (pip extras) of vlret, imported only where they are needed.

``pip install vlret`` installs torch and numpy: the losses, the metrics, the similarity and the
memory banks need nothing else, and ``import vlret`` imports no extra. The harness's own
dependencies are extras (pyproject.toml ``[project.optional-dependencies]``):

- ``train``: PyYAML (the run folder's ``config.yaml``, YAML configs) and tqdm (progress bars;
  without it no bar is drawn, :mod:`vlret._progress`), for ``vlret train | eval | compare |
  sweep | import-checkpoint | demo --preset``;
- ``vsl``: scikit-learn and SciPy, VSL's caption TF-IDF (:mod:`vlret.semantic`);
- ``plot`` (matplotlib), ``hf`` (transformers, pillow), ``nltk``; ``all``: every one of them.

A missing extra raises :class:`MissingExtra`, an :class:`ImportError` whose message is one line
naming the extra to install; the command line prints that line and exits with status 2.
"""

from __future__ import annotations

import importlib
from types import ModuleType

__all__ = ["EXTRAS", "MissingExtra", "missing_extra", "require"]

#: Top-level import name -> (the distribution a user installs, the extra that carries it).
EXTRAS: dict[str, tuple[str, str]] = {
    "yaml": ("PyYAML", "train"),
    "tqdm": ("tqdm", "train"),
    "sklearn": ("scikit-learn", "vsl"),
    "scipy": ("SciPy", "vsl"),
    "transformers": ("transformers", "hf"),
    "PIL": ("Pillow", "hf"),
    "matplotlib": ("matplotlib", "plot"),
    "webdataset": ("webdataset", "pixels"),
}


class MissingExtra(ImportError):
    """An optional dependency is not installed: ``"<what> needs <package>: pip install
    'vlret[<extra>]'"``."""

    def __init__(self, package: str, extra: str, what: str) -> None:
        self.package = package
        self.extra = extra
        self.what = what
        super().__init__(f"{what} needs {package}: {self.install}")

    @property
    def install(self) -> str:
        """The command that installs the missing extra."""
        return f"pip install 'vlret[{self.extra}]'"

    def for_command(self, command: str | None) -> str:
        """The one line the command line prints: ``vlret train needs PyYAML: pip install ...``."""
        who = f"vlret {command}" if command else "vlret"
        return f"{who} needs {self.package}: {self.install}"


def missing_extra(module: str | None, what: str, default: str = "sklearn") -> MissingExtra:
    """The :class:`MissingExtra` for a failed import of ``module`` (an ``ImportError.name``;
    ``default`` when that is unknown), with ``what`` needing it named in the message."""
    top = (module or default).partition(".")[0]
    package, extra = EXTRAS.get(top) or EXTRAS[default.partition(".")[0]]
    return MissingExtra(package, extra, what)


def require(module: str, what: str) -> ModuleType:
    """Import ``module`` (``"yaml"``, ``"tqdm.auto"``, ...) of an extra listed in
    :data:`EXTRAS`.

    Args:
        module: The module to import.
        what: What needs it, named in the error message (``"a YAML run config"``).

    Returns:
        The module.

    Raises:
        MissingExtra: The module is not installed (the message names the extra).
    """
    try:
        return importlib.import_module(module)
    except ImportError as err:
        raise missing_extra(err.name or module, what, default=module) from None
