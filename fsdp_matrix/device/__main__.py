"""``python -m fsdp_matrix.device --prepare DIR``, the same as ``python -m fsdp_matrix device --prepare DIR``."""

import sys

from fsdp_matrix.device.prepare import main

sys.exit(main())
