"""Drop-in vision-language retrieval losses.

Every loss comes as a pure function on a ``(B, B)`` similarity matrix and as an ``nn.Module``
taking embeddings (``loss(img_emb, txt_emb, img_ids=None, txt_ids=None)``) or a similarity
matrix (``loss.from_similarity(sim, pos_mask=None)``). Build any registered loss by name with
:func:`build_loss`.

Every public module of this package is imported on import, so a loss family added as a new file
registers itself (``build_loss``, configs, ``vlret losses``) without an edit here.
"""

import importlib
import pkgutil

from .._deprecation import module_getattr
from ._base import LossCapabilities, PairLoss
from .adacl import AdaCLLoss, adacl_anchor, adacl_loss, adacl_margins, tiled_adacl_loss
from .aoq import AOQLoss, aoq_loss
from .cmpm import CMPMLoss, cmpm_loss, tiled_cmpm_loss
from .combined import CombinedLoss, CombinedParams
from .dcl import DCLLoss, dcl_loss, tiled_dcl_loss
from .deprecated import OLD_NAMES
from .dml import (
    BinomialDevianceLoss,
    CircleLoss,
    MultiSimilarityLoss,
    NCAHardLoss,
    binomial_deviance_loss,
    circle_loss,
    multi_similarity_loss,
    nca_hard_loss,
)
from .goal import (
    PAIR_WEIGHTS,
    TRIPLET_WEIGHTS,
    GoalFunction,
    GoalObjective,
    GoalParams,
    goal_anchor_weights,
    goal_objective,
    goal_pair_weights,
    goal_triplet_weight,
    tiled_goal_objective,
)
from .hn_nce import HNNCELoss, hn_nce_loss, tiled_hn_nce_loss
from .identity import IdentityLoss, identity_loss
from .infonce import InfoNCELoss, infonce_loss, tiled_infonce_loss
from .params import LossParams, TiledLossParams, param
from .polynomial import (
    RSPLoss,
    SSPLoss,
    polynomial_weights,
    rsp_loss,
    rsp_unified_loss,
    ssp_loss,
    tiled_rsp_loss,
    tiled_ssp_loss,
)
from .registry import (
    available_losses,
    build_loss,
    check_loss_params,
    compared_losses,
    loss_capabilities,
    loss_class,
    loss_parameters,
    register_loss,
)
from .sdm import SDMLoss, sdm_loss, tiled_sdm_loss
from .siglip import SigLIPLoss, siglip_loss, tiled_siglip_loss
from .step import StepInputs
from .tal import TALLoss, tal_loss, tiled_tal_loss
from .triplet import TripletLoss, tiled_triplet_loss, triplet_loss
from .unified import UnifiedLoss, tiled_unified_loss, unified_loss
from .uto import UTOLoss, uto_loss
from .vsl import VisualSemanticLoss, smooth_rank, visual_semantic_loss

__all__ = [
    "StepInputs",
    "AOQLoss",
    "aoq_loss",
    "AdaCLLoss",
    "adacl_anchor",
    "adacl_loss",
    "adacl_margins",
    "BinomialDevianceLoss",
    "CircleLoss",
    "CMPMLoss",
    "cmpm_loss",
    "tiled_cmpm_loss",
    "CombinedLoss",
    "CombinedParams",
    "IdentityLoss",
    "identity_loss",
    "TALLoss",
    "tal_loss",
    "tiled_tal_loss",
    "DCLLoss",
    "dcl_loss",
    "tiled_dcl_loss",
    "SDMLoss",
    "sdm_loss",
    "tiled_sdm_loss",
    "SigLIPLoss",
    "siglip_loss",
    "tiled_siglip_loss",
    "MultiSimilarityLoss",
    "NCAHardLoss",
    "binomial_deviance_loss",
    "circle_loss",
    "multi_similarity_loss",
    "nca_hard_loss",
    "PAIR_WEIGHTS",
    "TRIPLET_WEIGHTS",
    "GoalParams",
    "LossParams",
    "TiledLossParams",
    "param",
    "GoalFunction",
    "GoalObjective",
    "goal_objective",
    "goal_anchor_weights",
    "goal_pair_weights",
    "goal_triplet_weight",
    "VisualSemanticLoss",
    "smooth_rank",
    "visual_semantic_loss",
    "HNNCELoss",
    "hn_nce_loss",
    "tiled_hn_nce_loss",
    "InfoNCELoss",
    "LossCapabilities",
    "PairLoss",
    "TripletLoss",
    "UnifiedLoss",
    "UTOLoss",
    "uto_loss",
    "available_losses",
    "build_loss",
    "check_loss_params",
    "compared_losses",
    "infonce_loss",
    "loss_capabilities",
    "loss_class",
    "loss_parameters",
    "register_loss",
    "RSPLoss",
    "SSPLoss",
    "polynomial_weights",
    "rsp_loss",
    "rsp_unified_loss",
    "ssp_loss",
    "tiled_rsp_loss",
    "tiled_ssp_loss",
    "tiled_adacl_loss",
    "tiled_goal_objective",
    "tiled_infonce_loss",
    "tiled_triplet_loss",
    "tiled_unified_loss",
    "triplet_loss",
    "unified_loss",
]


# 0.1.0's names that were renamed since, each warned about (vlret.losses.deprecated)
__getattr__ = module_getattr(__name__, OLD_NAMES)


def _import_families() -> None:
    """Import every public module of the package: each registers its losses."""
    for info in pkgutil.iter_modules(__path__):
        if not info.name.startswith("_"):
            importlib.import_module(f"{__name__}.{info.name}")


_import_families()
