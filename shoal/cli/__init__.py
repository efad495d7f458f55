"""``shoal``: the command line (``shoal --help``; ``python -m shoal.cli``).

The commands live in the modules of this package; what an application's own
command line builds on (the reference apps' do) is exported here: the
database URL with the embedded fallback, the API token, the transport.
"""

from shoal.cli.common import database_url, ingest_transport
from shoal.cli.run import main
from shoal.cli.serve import api_token

__all__ = ["api_token", "database_url", "ingest_transport", "main"]
