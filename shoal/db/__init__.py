"""The database layer: connection pool with deadlines, embedded Postgres, migrations."""

from shoal.db.embedded import EmbeddedPostgres, default_data_dir, free_port
from shoal.db.migrate import migrate
from shoal.db.pool import Database
from shoal.db.usage import CallTimes

__all__ = ["CallTimes", "Database", "EmbeddedPostgres", "default_data_dir", "free_port", "migrate"]
