"""``python -m shoal.cli``: the ``shoal`` command."""

import sys

from shoal.cli.run import main

if __name__ == "__main__":
    sys.exit(main())
