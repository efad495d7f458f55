"""The workflow layer's migrations: one version sequence with the others' (shoal.db.migrate)."""
