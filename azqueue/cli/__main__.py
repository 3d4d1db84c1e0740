"""``python -m azqueue.cli``: the ``azqueue`` command."""

import sys

from azqueue.cli import main

sys.exit(main())
