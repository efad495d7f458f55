"""The database layer: connection pool with deadlines, embedded Postgres, migrations."""

from shoal.db.embedded import EmbeddedPostgres, default_data_dir
from shoal.db.migrate import migrate
from shoal.db.pool import Database

__all__ = ["Database", "EmbeddedPostgres", "default_data_dir", "migrate"]
