"""A user's own type check resolves shoal as installed (editable, by `make`): mypy
finds the package and its py.typed from outside the checkout."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

USER_CODE = textwrap.dedent(
    """
    import shoal

    app = shoal.App()


    @app.handler("email")
    async def send_email(job: shoal.Job) -> None: ...


    async def enqueue(boss: shoal.Shoal) -> shoal.JobId | None:
        return await boss.send("email", {"user_id": 1})
    """
)


MYPY_OPTIONS = ("--strict", "--no-incremental", "--config-file=")


def test_mypy_type_checks_user_code_importing_shoal_from_outside_the_repo(
    tmp_path: Path,
) -> None:
    (tmp_path / "user.py").write_text(USER_CODE)
    # And a wrong use, to show mypy sees shoal's types rather than Any.
    (tmp_path / "wrong.py").write_text("import shoal\n\nwrong: int = shoal.Shoal\n")
    checked = subprocess.run(
        # The venv's mypy, run in a folder of the user's, without the project's config.
        [sys.executable, "-m", "mypy", *MYPY_OPTIONS, "user.py", "wrong.py"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    errors = [line for line in checked.stdout.splitlines() if ": error:" in line]
    assert len(errors) == 1, checked.stdout + checked.stderr
    assert errors[0].startswith("wrong.py:3: error: Incompatible types in assignment")
    assert 'expression has type "type[Shoal]"' in errors[0]
