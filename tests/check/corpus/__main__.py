"""``python -m tests.check.corpus [--half dev|test|both]``: the corpus's figures per half."""

import sys

from tests.check.corpus import main

sys.exit(main())
