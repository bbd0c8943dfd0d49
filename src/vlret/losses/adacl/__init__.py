r"""Adaptive contrastive learning (AdaCL): "Discovering clone negatives via adaptive contrastive
learning for image-text matching", Eq. (3)-(11), Algorithm 1, appendix A.3-A.4, A.9-A.10.

AdaCL replaces the temperature of contrastive learning with two margins on the positive logit,
a scale ``m1`` and a shift ``m2`` (Eq. 3). Each training batch recomputes them in closed form
(Eq. 4-6, A.3) from an *anchor* chosen among the batch's likely clone negatives: a salient
score per row (Eq. 7) picks a row of salient negatives and a row of clone negatives, a 1-D
Gaussian discriminant analysis fitted on those two rows (Eq. 8-10) classifies every negative,
and the anchor comes from the median distance of the clones to their positives (Eq. 11).
No public code exists; each reading of the paper is written where it is made. Modules:
``objective`` (Eq. 3, dense and tiled), ``margins`` (Eq. 20, 22), ``gda`` (Eq. 8-10),
``anchor`` (Eq. 7-11 over score tiles), ``config`` (``AdaCLParams``, the parameter
declaration) and ``module`` (Algorithm 1).
"""

from ..._deprecation import module_getattr
from .._tiling import QueueBlock
from ..deprecated import OLD_NAMES
from .anchor import AdaCLAnchor, ScoreTiles, adacl_anchor, select_anchor
from .config import ANCHOR_SELECTIONS, DEFAULT_EPS, DEFAULT_P_U, GUARDS, AdaCLParams
from .gda import GDAFit, clone_log_odds, clone_posterior, clone_region, fit_gda
from .margins import adacl_margins
from .module import AdaCLLoss
from .objective import DenseAdaCLBatch, TiledAdaCLBatch, adacl_loss, tiled_adacl_loss

__all__ = [
    "ANCHOR_SELECTIONS",
    "DEFAULT_EPS",
    "DEFAULT_P_U",
    "GUARDS",
    "AdaCLAnchor",
    "AdaCLParams",
    "AdaCLLoss",
    "DenseAdaCLBatch",
    "GDAFit",
    "QueueBlock",
    "ScoreTiles",
    "TiledAdaCLBatch",
    "adacl_anchor",
    "adacl_loss",
    "adacl_margins",
    "clone_log_odds",
    "clone_posterior",
    "clone_region",
    "fit_gda",
    "select_anchor",
    "tiled_adacl_loss",
]


# 0.1.0's AdaCLConfig, warned about (vlret.losses.deprecated)
__getattr__ = module_getattr(__name__, OLD_NAMES)
