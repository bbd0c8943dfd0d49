"""0.1.0's path of the synthetic worlds, now :mod:`vlret.worlds`: each of its old names warns
and gives the world's value until 0.3.0 (:mod:`vlret.data.deprecated`). Nothing here is
imported by a reader; the value is looked up by name when it is asked for."""

from ..._deprecation import module_getattr
from ..deprecated import OLD_NAMES

__all__: list[str] = []

# 0.1.0's names, each warned about (vlret.data.deprecated)
__getattr__ = module_getattr(__name__, OLD_NAMES)
