"""``python -m shoal.cli``: the ``shoal`` command."""

import sys

from shoal.cli.run import main

sys.exit(main())
