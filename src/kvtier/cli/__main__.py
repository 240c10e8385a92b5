"""``python -m kvtier.cli``: the ``kvtier`` command."""

import sys

from kvtier.cli.main import main

sys.exit(main())
