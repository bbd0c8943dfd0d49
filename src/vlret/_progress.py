"""Progress bars: the one rule that decides whether a bar is drawn, for every bar vlret shows.

A bar is drawn on standard error when all of these hold:

- bars are not switched off for the process (:func:`set_enabled`, :func:`switched_off`):
  ``vlret COMMAND --no-progress`` switches them off for the command;
- the caller asked for one (``progress=True`` of a library function, ``train.progress`` of a
  run);
- standard error is a terminal (``isatty()``) or a Jupyter kernel's output, where ``tqdm.auto``
  draws its widget: a log file, a pipe or CI's captured output gets no bar, and no ``\\r``
  lines in it;
- the process is the main one: rank 0 of a distributed run (or not distributed);
- tqdm (the ``train`` extra) is installed: without it there is no bar, never an error.

When one of them does not hold, :func:`progress_bar` returns a :class:`QuietBar`, which takes the
same calls as a tqdm bar (iteration, ``update``, ``set_postfix``, ``close``, ``with``) and draws
nothing, so the code that counts progress is the same either way.

Library functions take ``progress: bool = False``: a call from Python draws nothing unless asked
(a script's output or a test's capture stays clean); ``progress=True`` asks for a bar, drawn
under the rule above. The command line asks for bars unless ``--no-progress`` is given. The
trainer's ``train.progress`` defaults to ``true``, which means the same: a bar where a terminal
shows it. The per-epoch summary line is printed either way.
"""

from __future__ import annotations

import importlib
import os
import sys
import warnings
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any, TextIO

__all__ = [
    "QuietBar",
    "bars_enabled",
    "hugging_face_bars",
    "progress_bar",
    "set_enabled",
    "shows",
    "switched_off",
]

_ENABLED = True  # the process-wide switch (the command line's --no-progress)


def set_enabled(enabled: bool) -> bool:
    """Switch progress bars on or off for the whole process; returns the previous setting.

    Args:
        enabled: ``False``: no bar is drawn, whatever a caller asks.

    Returns:
        Whether bars were switched on before this call.
    """
    global _ENABLED
    previous, _ENABLED = _ENABLED, bool(enabled)
    return previous


def bars_enabled() -> bool:
    """Whether progress bars are switched on for the process (:func:`set_enabled`)."""
    return _ENABLED


@contextmanager
def switched_off(when: bool = True) -> Iterator[None]:
    """Bars switched off inside the ``with`` block when ``when`` is true, the previous setting
    restored afterwards (``vlret COMMAND --no-progress``)."""
    previous = set_enabled(False) if when else _ENABLED
    try:
        yield
    finally:
        set_enabled(previous)


def _is_terminal(stream: Any) -> bool:
    """Whether ``stream`` shows a bar as it is redrawn: a terminal, or a Jupyter kernel's output
    stream (ipykernel's ``OutStream``, where ``tqdm.auto`` draws a widget)."""
    if type(stream).__module__.partition(".")[0] == "ipykernel":
        return True
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError, OSError):  # no isatty, or a closed stream
        return False


def _main_process() -> bool:
    """Rank 0 of a distributed run, or a process that is not part of one (a rank launched by
    ``torchrun`` counts from its ``RANK`` before the process group exists)."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank() == 0
    return os.environ.get("RANK", "0").strip() in ("", "0")


def _tqdm() -> Any:
    """``tqdm.auto.tqdm``, or ``None`` when tqdm is not installed."""
    try:
        return importlib.import_module("tqdm.auto").tqdm
    except ImportError:
        return None


def shows(stream: TextIO | None = None) -> bool:
    """Whether a bar asked for now would be drawn on ``stream`` (default: the current
    ``sys.stderr``): bars switched on, ``stream`` a terminal, the main process and tqdm
    installed (module docstring)."""
    stream = sys.stderr if stream is None else stream
    return _ENABLED and _is_terminal(stream) and _main_process() and _tqdm() is not None


@contextmanager
def hugging_face_bars(show: bool) -> Iterator[None]:
    """Hugging Face's own bars (transformers' "Loading weights", huggingface_hub's) follow the
    rule inside the ``with`` block: off when ``show`` is false (vlret draws none either), as
    they were afterwards. The command line wraps every command in it with :func:`shows`, so
    ``--no-progress`` or a log file gets no bar from a model vlret loads either.

    Args:
        show: Whether bars are drawn (:func:`shows`); ``True`` leaves Hugging Face's alone.
    """
    hub: Any = None
    if not show:
        try:  # its bar functions import tqdm when first used
            hub = importlib.import_module("huggingface_hub.utils")
            hub_was_off = hub.are_progress_bars_disabled()
        except ImportError:  # no transformers or no tqdm: nothing draws those bars
            hub = None
    if hub is None:
        yield
        return
    loaded = "transformers.utils.logging" in sys.modules
    transformers_was_on = _transformers_bars(None) if loaded else not hub_was_off
    with warnings.catch_warnings():  # HF_HUB_DISABLE_PROGRESS_BARS=0 "has priority": fine
        warnings.simplefilter("ignore")
        hub.disable_progress_bars()
        if loaded:
            _transformers_bars(False)
    try:
        yield
    finally:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            if "transformers.utils.logging" in sys.modules:  # imported before or meanwhile
                _transformers_bars(transformers_was_on)  # (which sets huggingface_hub's too)
            (hub.disable_progress_bars if hub_was_off else hub.enable_progress_bars)()


def _transformers_bars(on: bool | None) -> bool:
    """transformers' own bar switch: set it (``on``) or read it (``None``); returns it."""
    logging = sys.modules["transformers.utils.logging"]
    if on is not None:
        (logging.enable_progress_bar if on else logging.disable_progress_bar)()
    return bool(logging.is_progress_bar_enabled())


class QuietBar:
    """A bar that draws nothing: iterating it iterates ``iterable``; ``update``,
    ``set_postfix``, ``set_description``, ``refresh`` and ``close`` do nothing but count; it is
    its own context manager. ``n`` counts the updates, as tqdm's."""

    def __init__(
        self, iterable: Iterable[Any] | None = None, *, total: float | None = None, **_: Any
    ) -> None:
        self.iterable = iterable
        self.total = total
        self.n: float = 0
        self.disable = True  # as a tqdm bar built with disable=True says

    def __iter__(self) -> Iterator[Any]:
        if self.iterable is None:
            raise TypeError("QuietBar: nothing to iterate (built without an iterable)")
        return iter(self.iterable)

    def __len__(self) -> int:
        if self.total is not None:
            return int(self.total)
        return len(self.iterable)  # type: ignore[arg-type]  # TypeError as tqdm's without one

    def __enter__(self) -> QuietBar:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def update(self, n: float = 1) -> None:
        self.n += n

    def set_postfix(self, *args: Any, **kwargs: Any) -> None:
        pass

    def set_description(self, *args: Any, **kwargs: Any) -> None:
        pass

    def refresh(self) -> None:
        pass

    def close(self) -> None:
        pass


def progress_bar(
    iterable: Iterable[Any] | None = None, /, *, show: bool = True, **options: Any
) -> Any:
    """A ``tqdm.auto`` bar on ``sys.stderr`` over ``iterable`` (or counting ``update`` calls
    towards ``total``) when ``show`` and :func:`shows` (module docstring), else a
    :class:`QuietBar` taking the same calls.

    Args:
        iterable: What the bar iterates over (``None``: a bar advanced by ``update``).
        show: Whether the caller wants a bar (``progress=True``, ``train.progress``).
        **options: tqdm's keyword arguments (``total``, ``desc``, ``unit``, ``leave``, ...);
            vlret's bars fit the terminal's width as it changes (``dynamic_ncols=True``) unless
            a caller passes otherwise.

    Returns:
        The bar: a tqdm bar, or a :class:`QuietBar`.
    """
    stream = options.pop("file", None) or sys.stderr
    if show and shows(stream):
        options = {"dynamic_ncols": True, **options}
        return _tqdm()(iterable, file=stream, **options)
    return QuietBar(iterable, total=options.get("total"))
