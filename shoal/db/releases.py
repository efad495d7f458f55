"""The migrations each release of shoal shipped, by version and SHA-256 digest.

One record, read by the migration runner and by the upgrade tests. A file a
release shipped is never edited, renamed or removed: :func:`check_released`
(called by :func:`shoal.db.migrate.load_migrations` for shoal's own files)
refuses a checkout whose file differs from the record, so the edit is caught
where it is made, not in a user's database. The upgrade tests start from the
oldest release's schema (tests/upgrade).

At a release, the migrations written since the previous one are folded into
one file per layer before the release is recorded here (0.2.0 folded its
development's migrations 4-34 into 4-6), so no function that never shipped
stays in the schema; docs/upgrading.md has the recipe.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Protocol

# Release -> {version: SHA-256 of the file's UTF-8 text}. Each release lists
# every file it shipped, the earlier releases' included.
RELEASES: Mapping[str, Mapping[int, str]] = {
    "0.1.0": {
        1: "1a503f06de36659f45d67faaf4ebcaae9ede86cb1d628aeb5bef6cc64df7f4d0",
        2: "6d19acc4b82a37a358e177d98dd0b689a161c0794fe911907d42ea8ef881bb20",
        3: "bbc0dd054baf6ce2ca769bd4dc0d9f959614541a13564f9c00018324c7338d96",
    },
    "0.2.0": {
        1: "1a503f06de36659f45d67faaf4ebcaae9ede86cb1d628aeb5bef6cc64df7f4d0",
        2: "6d19acc4b82a37a358e177d98dd0b689a161c0794fe911907d42ea8ef881bb20",
        3: "bbc0dd054baf6ce2ca769bd4dc0d9f959614541a13564f9c00018324c7338d96",
        4: "6c72da976dfc4c5e63d845bf5afec4338f945aedae4671ba81b8a04a3563db6e",
        5: "cf496044d0e966aeeeecfd79166b348d8937e4734cd2713c2263e7e5ac0c1606",
        6: "514d2fe7c19d1944639ef4bf633d57608cc147f29eca82928668020dc77872a5",
    },
}


class _Migration(Protocol):
    @property
    def version(self) -> int: ...
    @property
    def label(self) -> str: ...
    @property
    def package(self) -> str: ...
    @property
    def checksum(self) -> str: ...


def released_versions() -> dict[str, frozenset[int]]:
    """Each release's migration versions."""
    return {release: frozenset(files) for release, files in RELEASES.items()}


def check_released(migrations: Iterable[_Migration]) -> None:
    """Refuse files that differ from what a release shipped, or that a release shipped and are gone.

    Raises ``RuntimeError`` naming the file and the release: a released
    migration is never edited (a change is a new migration).
    """
    found = {m.version: m for m in migrations}
    for release, files in RELEASES.items():
        for version, digest in files.items():
            migration = found.get(version)
            if migration is None:
                raise RuntimeError(
                    f"migration {version:04d}, shipped by shoal {release}, is missing: a released "
                    "migration is never removed (shoal/db/releases.py)"
                )
            if migration.checksum != digest:
                raise RuntimeError(
                    f"migration {migration.label} ({migration.package}) differs from the file "
                    f"shoal {release} shipped (SHA-256 {migration.checksum[:12]}, released "
                    f"{digest[:12]}): a released migration is never edited; undo the edit and "
                    "write the change as a new migration (docs/upgrading.md)"
                )
