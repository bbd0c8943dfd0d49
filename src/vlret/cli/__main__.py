"""``python -m vlret.cli``, the same as ``python -m vlret`` and the ``vlret`` script."""

import sys

from . import main

sys.exit(main())
