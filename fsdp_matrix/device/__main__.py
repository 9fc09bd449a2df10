"""``python -m fsdp_matrix.device --prepare DIR`` (what ``nox -s device`` runs)."""

import sys

from fsdp_matrix.device.prepare import main

sys.exit(main())
