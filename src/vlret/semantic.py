"""Caption TF-IDF similarity between images, the semantic side of VSL (VSL paper Eq. 3).

The VSL paper calls it a "CIDEr" similarity; the authors' released code computes it with
scikit-learn's TF-IDF at default settings, and so does :class:`CaptionTfidf`: one caption is one
document, lower-casing, the default token pattern (which drops one-letter words such as "a"),
smooth idf, L2-normalised rows, fitted on the captions of the training split.

Everything stays sparse. Because each caption vector ``g(.)`` has unit norm, Eq. (3)

    K(v_a, v_b) = 1 / (Q_a Q_b) * sum_{p, q} g(pt_a^p) . g(pt_b^q) = mean_g_a . mean_g_b

is the dot product of the two images' mean normalised caption vectors ``mean_g``, which are
precomputed once at fit time; a batch lookup is one small sparse product.
"""

from __future__ import annotations

import json
import os
from collections.abc import Hashable, Mapping, Sequence
from pathlib import Path
from typing import TypeVar

import numpy as np
import torch

from ._extras import missing_extra

try:  # the ``vsl`` extra
    import scipy.sparse as sp
    from sklearn.exceptions import NotFittedError
    from sklearn.feature_extraction.text import TfidfVectorizer
except ImportError:
    raise missing_extra("sklearn", "vlret.semantic (VSL's caption TF-IDF)") from None

from ._files import atomic_write, atomic_write_text
from .similarity import Ids

__all__ = ["CaptionTfidf"]

_Id = TypeVar("_Id", bound=Hashable)


def _check_ngram_range(ngram_range: tuple[int, int]) -> tuple[int, int]:
    ok = (
        isinstance(ngram_range, (tuple, list))
        and len(ngram_range) == 2
        and all(isinstance(n, int) and not isinstance(n, bool) for n in ngram_range)
        and 1 <= ngram_range[0] <= ngram_range[1]
    )
    if not ok:
        raise ValueError(f"ngram_range must be a pair of ints 1 <= lo <= hi, got {ngram_range!r}")
    return int(ngram_range[0]), int(ngram_range[1])


def _check_caption(caption: object, where: str) -> str:
    if not isinstance(caption, str):
        raise ValueError(f"{where} must be a string, got {type(caption).__name__}")
    if not caption.strip():
        raise ValueError(f"{where} is empty; remove empty captions before fitting")
    return caption


class CaptionTfidf:
    """Semantic similarity between images from the TF-IDF vectors of their captions, Eq. (3).

    ``CaptionTfidf(ngram_range=(1, 1)).fit(captions)`` where ``captions`` maps each image id to
    its list of caption strings (images may have different numbers of captions). Then
    ``similarity(img_ids_a, img_ids_b)`` is the ``(len(a), len(b))`` tensor of the mean of the
    ``Q_a x Q_b`` caption cosines.

    Every caption must keep at least one token after tokenisation: a blank caption, or one made
    only of one-letter words, raises ``ValueError`` at fit time rather than silently counting
    as a zero vector.

    A fitted instance is not part of any model's ``state_dict``: :meth:`save` writes it to a
    directory (sparse ``.npz`` plus JSON, no pickle) and :meth:`load` restores it, so a resumed
    run need not refit on the training captions.

    Args:
        ngram_range: ``(1, 1)`` (default) reproduces the authors' released code (unigrams);
            ``(1, 4)`` is closer to CIDEr, which the paper's text names (CIDEr uses 1- to
            4-grams; this is still one TF-IDF space over all n-gram orders, not CIDEr's
            per-order average, and without its length penalty).

    Raises:
        ValueError: ``ngram_range`` is not a pair of ints ``1 <= lo <= hi``.
    """

    #: Files written by :meth:`save` inside its directory.
    META_FILE = "caption_tfidf.json"
    VECTORS_FILE = "image_vectors.npz"
    _FORMAT = "vlret.semantic.CaptionTfidf"
    _VERSION = 1

    def __init__(self, ngram_range: tuple[int, int] = (1, 1)) -> None:
        self.ngram_range = _check_ngram_range(ngram_range)
        self._vectorizer: TfidfVectorizer | None = None
        self._row_of: dict[Hashable, int] = {}
        self._mean_vectors: sp.csr_matrix | None = None
        self._caption_counts: np.ndarray | None = None

    # -- fitting -----------------------------------------------------------------------------

    def fit(self, captions: Mapping[_Id, Sequence[str]]) -> CaptionTfidf:
        """Fit the TF-IDF vocabulary and idf on all captions and precompute per-image means.

        Args:
            captions: Each image id's list of caption strings (the training split's).

        Returns:
            ``self``, fitted.

        Raises:
            ValueError: The mapping is empty, an image has no captions, or a caption is empty
                or keeps no token.
        """
        if not isinstance(captions, Mapping):
            raise ValueError(
                "captions must be a mapping from image id to a list of caption strings, "
                f"got {type(captions).__name__}"
            )
        if len(captions) == 0:
            raise ValueError("captions is empty; expected at least one image with captions")
        texts: list[str] = []
        counts = np.empty(len(captions), dtype=np.int64)
        row_of: dict[Hashable, int] = {}
        for row, (img_id, caps) in enumerate(captions.items()):
            if isinstance(caps, str) or not isinstance(caps, Sequence):
                raise ValueError(
                    f"captions[{img_id!r}] must be a list of caption strings, "
                    f"got {type(caps).__name__}"
                )
            if len(caps) == 0:
                raise ValueError(f"captions[{img_id!r}] has no captions; expected at least one")
            for q, cap in enumerate(caps):
                texts.append(_check_caption(cap, f"captions[{img_id!r}][{q}]"))
            counts[row] = len(caps)
            row_of[img_id] = row

        vectorizer = TfidfVectorizer(ngram_range=self.ngram_range, dtype=np.float64)
        try:
            unit = vectorizer.fit_transform(texts).tocsr()  # (n_captions, V), unit-norm rows
        except ValueError as err:  # every caption lost all its tokens
            raise ValueError(f"captions: no caption has a usable token ({err})") from err
        owner = np.repeat(np.arange(len(counts)), counts)  # image row of each caption
        tokenless = np.flatnonzero(np.diff(unit.indptr) == 0)
        if tokenless.size:
            ids = list(row_of)
            first = int(tokenless[0])
            raise ValueError(
                f"{tokenless.size} caption(s) have no token the vectorizer keeps (one-letter "
                f"words are dropped), e.g. {texts[first]!r} of image {ids[owner[first]]!r}; "
                "remove or fix them before fitting"
            )
        # (n_images, n_captions) averaging operator: row i holds 1/Q_i on image i's captions.
        averaging = sp.csr_matrix(
            (1.0 / counts[owner], (owner, np.arange(len(texts)))),
            shape=(len(counts), len(texts)),
        )
        self._vectorizer = vectorizer
        self._row_of = row_of
        self._mean_vectors = (averaging @ unit).tocsr()
        self._caption_counts = counts
        return self

    # -- introspection -----------------------------------------------------------------------

    @property
    def is_fitted(self) -> bool:
        """Whether :meth:`fit` (or :meth:`load`) has run."""
        return self._mean_vectors is not None

    def _require_fitted(self) -> None:
        if not self.is_fitted:
            raise NotFittedError("this CaptionTfidf is not fitted yet; call fit(captions) first")

    @property
    def n_images(self) -> int:
        """Number of fitted images."""
        self._require_fitted()
        return len(self._row_of)

    @property
    def vocabulary_size(self) -> int:
        """Number of TF-IDF terms (columns of the caption vectors)."""
        self._require_fitted()
        assert self._vectorizer is not None  # fitted
        return len(self._vectorizer.vocabulary_)

    @property
    def image_vectors(self) -> sp.csr_matrix:
        """Sparse ``(n_images, V)`` mean of each image's L2-normalised caption vectors."""
        self._require_fitted()
        return self._mean_vectors

    def __contains__(self, img_id: Hashable) -> bool:
        return img_id in self._row_of

    def __repr__(self) -> str:
        state = f"{len(self._row_of)} images" if self.is_fitted else "not fitted"
        return f"CaptionTfidf(ngram_range={self.ngram_range}, {state})"

    # -- persistence -------------------------------------------------------------------------

    def save(self, path: str | os.PathLike) -> Path:
        """Write the fitted state to a directory.

        Two files: :data:`VECTORS_FILE`, the per-image mean vectors
        (``scipy.sparse.save_npz``), and :data:`META_FILE`, JSON with the ``ngram_range``, the
        image ids in row order, their caption counts, the vocabulary in column order and the
        idf weights. No pickle is involved, so image ids must be ``int`` or ``str``.

        Args:
            path: The directory (created if missing).

        Returns:
            ``path`` as a ``Path``.

        Raises:
            sklearn.exceptions.NotFittedError: The instance is not fitted.
            ValueError: An image id is neither an ``int`` nor a ``str``.
        """
        self._require_fitted()
        vectorizer, counts, vectors = self._vectorizer, self._caption_counts, self._mean_vectors
        assert vectorizer is not None and counts is not None and vectors is not None  # fitted
        ids: list[int | str] = []
        for img_id in self._row_of:
            if isinstance(img_id, (np.integer, int)) and not isinstance(img_id, (bool, np.bool_)):
                ids.append(int(img_id))
            elif isinstance(img_id, str):
                ids.append(img_id)
            else:
                raise ValueError(
                    f"save() supports int or str image ids only, got {type(img_id).__name__} "
                    f"({img_id!r})"
                )
        vocabulary = [""] * len(vectorizer.vocabulary_)
        for term, column in vectorizer.vocabulary_.items():
            vocabulary[column] = term
        meta = {
            "format": self._FORMAT,
            "version": self._VERSION,
            "ngram_range": list(self.ngram_range),
            "ids": ids,
            "caption_counts": [int(c) for c in counts],
            "vocabulary": vocabulary,
            "idf": [float(v) for v in vectorizer.idf_],
        }
        out = Path(path)
        out.mkdir(parents=True, exist_ok=True)
        vectors = vectors.tocsr()
        atomic_write(out / self.VECTORS_FILE, lambda fh: sp.save_npz(fh, vectors, compressed=True))
        atomic_write_text(out / self.META_FILE, json.dumps(meta))
        return out

    @classmethod
    def load(cls, path: str | os.PathLike) -> CaptionTfidf:
        """Restore an instance written by :meth:`save`; lookups give identical results.

        Args:
            path: The directory :meth:`save` wrote.

        Returns:
            The fitted instance.

        Raises:
            ValueError: The files are not a saved ``CaptionTfidf`` of this format version, or
                their parts disagree in size.
        """
        src = Path(path)
        meta = json.loads((src / cls.META_FILE).read_text(encoding="utf-8"))
        if not isinstance(meta, dict) or meta.get("format") != cls._FORMAT:
            raise ValueError(f"{src / cls.META_FILE} is not a saved CaptionTfidf")
        if meta.get("version") != cls._VERSION:
            raise ValueError(
                f"{src / cls.META_FILE}: unsupported CaptionTfidf format version "
                f"{meta.get('version')!r} (this vlret reads version {cls._VERSION})"
            )
        vectors = sp.load_npz(src / cls.VECTORS_FILE).tocsr()
        ids, counts = meta["ids"], np.asarray(meta["caption_counts"], dtype=np.int64)
        vocabulary, idf = meta["vocabulary"], np.asarray(meta["idf"], dtype=np.float64)
        if not (
            vectors.shape == (len(ids), len(vocabulary))
            and len(counts) == len(ids) == len(set(ids))
            and len(idf) == len(vocabulary) == len(set(vocabulary))
        ):
            raise ValueError(
                f"{src}: inconsistent saved CaptionTfidf (vectors {vectors.shape}, "
                f"{len(ids)} ids, {len(counts)} caption counts, {len(vocabulary)} terms, "
                f"{len(idf)} idf weights)"
            )
        obj = cls(ngram_range=tuple(meta["ngram_range"]))
        vectorizer = TfidfVectorizer(
            ngram_range=obj.ngram_range,
            dtype=np.float64,
            vocabulary={term: column for column, term in enumerate(vocabulary)},
        )
        vectorizer.idf_ = idf  # public setter: builds the fitted TF-IDF transformer
        obj._vectorizer = vectorizer
        obj._row_of = {img_id: row for row, img_id in enumerate(ids)}
        obj._mean_vectors = vectors
        obj._caption_counts = counts
        return obj

    # -- lookups -----------------------------------------------------------------------------

    def _rows(self, ids: Ids, name: str) -> np.ndarray:
        if isinstance(ids, torch.Tensor):
            if ids.dim() != 1:
                raise ValueError(f"{name} must be 1-D, got shape {tuple(ids.shape)}")
            ids = ids.tolist()
        elif isinstance(ids, str) or not isinstance(ids, Sequence):
            raise ValueError(
                f"{name} must be a 1-D tensor or a sequence of image ids, got {type(ids).__name__}"
            )
        row_of = self._row_of
        try:
            return np.fromiter((row_of[i] for i in ids), dtype=np.int64, count=len(ids))
        except (KeyError, TypeError):
            missing = [i for i in ids if not _hashable_in(i, row_of)]
            raise ValueError(
                f"{name}: {len(missing)} id(s) are not in the fitted captions, e.g. {missing[:5]!r}"
            ) from None

    def similarity(
        self,
        img_ids_a: Ids,
        img_ids_b: Ids | None = None,
        *,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str | None = None,
        names: tuple[str, str] = ("img_ids_a", "img_ids_b"),
    ) -> torch.Tensor:
        """Semantic similarity of two lists of images, Eq. (3).

        Args:
            img_ids_a: Image ids: a 1-D integer tensor or a sequence of the keys given to
                :meth:`fit`.
            img_ids_b: Image ids of the columns; None uses ``img_ids_a`` (the ``(B, B)``
                matrix ``C`` of a batch).
            dtype: Dtype of the result.
            device: Device of the result.
            names: The argument names error messages use for the two id lists (a caller that
                forwards its own arguments, such as ``VisualSemanticLoss``, passes
                ``("img_ids", "txt_ids")``).

        Returns:
            The ``(len(a), len(b))`` tensor of the means of the ``Q_a x Q_b`` caption cosines.

        Raises:
            sklearn.exceptions.NotFittedError: The instance is not fitted.
            ValueError: The ids are not 1-D, or an id was not fitted.
        """
        self._require_fitted()
        assert self._mean_vectors is not None  # fitted
        name_a, name_b = names
        rows_a = self._rows(img_ids_a, name_a)
        rows_b = rows_a if img_ids_b is None else self._rows(img_ids_b, name_b)
        mean_a = self._mean_vectors[rows_a]
        mean_b = mean_a if img_ids_b is None else self._mean_vectors[rows_b]
        dense = (mean_a @ mean_b.T).toarray()
        return torch.from_numpy(dense).to(dtype=dtype, device=device)

    def caption_similarity(
        self,
        captions_a: Sequence[str],
        captions_b: Sequence[str] | None = None,
        *,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str | None = None,
    ) -> torch.Tensor:
        """TF-IDF cosines between single captions (``Q = 1`` in Eq. 3).

        This is the text-side semantic matrix ``TC`` of Eq. (7). Captions are vectorised with
        the fitted vocabulary and idf; a caption with no known token is a zero vector and so has
        similarity 0 to everything (itself included).

        Args:
            captions_a: Caption strings of the rows.
            captions_b: Caption strings of the columns; None uses ``captions_a``.
            dtype: Dtype of the result.
            device: Device of the result.

        Returns:
            The ``(len(a), len(b))`` tensor of caption cosines.

        Raises:
            sklearn.exceptions.NotFittedError: The instance is not fitted.
            ValueError: A list is empty or not a sequence of non-empty strings.
        """
        self._require_fitted()
        vec_a = self._caption_vectors(captions_a, "captions_a")
        vec_b = vec_a if captions_b is None else self._caption_vectors(captions_b, "captions_b")
        dense = (vec_a @ vec_b.T).toarray()
        return torch.from_numpy(dense).to(dtype=dtype, device=device)

    def _caption_vectors(self, captions: Sequence[str], name: str) -> sp.csr_matrix:
        if isinstance(captions, str) or not isinstance(captions, Sequence):
            raise ValueError(
                f"{name} must be a sequence of caption strings, got {type(captions).__name__}"
            )
        if len(captions) == 0:
            raise ValueError(f"{name} is empty; expected at least one caption")
        texts = [_check_caption(c, f"{name}[{k}]") for k, c in enumerate(captions)]
        assert self._vectorizer is not None  # callers check is_fitted
        return self._vectorizer.transform(texts).tocsr()


def _hashable_in(key: object, table: dict) -> bool:
    try:
        return key in table
    except TypeError:
        return False
