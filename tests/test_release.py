"""The release as users get it: the sdist and the wheel build, pass ``twine check``,
hold every file of the package, name one version everywhere, and the wheel,
installed in a clean virtualenv, runs the README's quick start on a new database.

The files are built once per run and the wheel installed once (the session
fixtures ``release`` and ``core_venv``, tests/install_helpers.py). Without a
reachable package index the install fails: a release that cannot be
installed is a failed test, not a skipped one.
"""

from __future__ import annotations

import asyncio
import re
import signal
import sys
import tarfile
import tomllib
import zipfile
from pathlib import Path

import psycopg

from shoal.db.releases import RELEASES
from tests.conftest import wait_for
from tests.install_helpers import ROOT, Release, package_files, run, venv_env

README = ROOT / "README.md"
FENCE = re.compile(r"^```(?P<lang>\w*)\s*$")
# A Python block of the quick start is saved under the last file name the
# text before it gives: "Save a handler as `tasks.py`:".
FILE_NAME = re.compile(r"`(?P<name>[\w.]+\.py)`")


def project_version() -> str:
    with (ROOT / "pyproject.toml").open("rb") as f:
        return str(tomllib.load(f)["project"]["version"])


def readme_section(title: str) -> str:
    text = README.read_text(encoding="utf-8")
    start = text.index(f"\n## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end != -1 else len(text)]


def code_blocks(section: str) -> list[tuple[str, str, str]]:
    """(language, code, the text before it) of each fenced block of ``section``, in order."""
    blocks = []
    lines = section.splitlines()
    before: list[str] = []
    i = 0
    while i < len(lines):
        match = FENCE.match(lines[i])
        if match is None:
            before.append(lines[i])
            i += 1
            continue
        end = i + 1
        while lines[end].strip() != "```":
            end += 1
        blocks.append((match["lang"], "\n".join(lines[i + 1 : end]) + "\n", "\n".join(before)))
        before = []
        i = end + 1
    return blocks


def commands(block: str) -> list[str]:
    """The shell commands of a block, without their comments."""
    lines = (line.partition("#")[0].strip() for line in block.splitlines())
    return [line for line in lines if line]


# -- the files ------------------------------------------------------------------


def test_the_wheel_holds_every_file_of_the_package_and_nothing_else(release: Release) -> None:
    with zipfile.ZipFile(release.wheel) as wheel:
        names = wheel.namelist()
    packaged = {name for name in names if name.startswith("shoal/")}
    expected = package_files(release.source)
    assert sorted(expected - packaged) == []  # the migrations, queries, console, py.typed
    assert sorted(packaged - expected) == []
    assert {
        "shoal/py.typed",
        "shoal/queue/queries.sql",
        "shoal/api/static/console.html",
    } <= packaged
    version = project_version()
    assert f"shoal-{version}.dist-info/METADATA" in names
    # The licence's text travels with the wheel (PEP 639's license-files).
    assert f"shoal-{version}.dist-info/licenses/LICENSE" in names
    metadata = {name for name in names if name.startswith(f"shoal-{version}.dist-info/")}
    assert set(names) - packaged - metadata == set()


def test_the_sdist_holds_what_building_the_wheel_again_needs(release: Release) -> None:
    top = f"shoal-{project_version()}"
    with tarfile.open(release.sdist) as sdist:
        names = {member.name for member in sdist.getmembers() if member.isfile()}
    expected = {f"{top}/{name}" for name in package_files(release.source)}
    expected |= {f"{top}/pyproject.toml", f"{top}/README.md", f"{top}/PKG-INFO", f"{top}/LICENSE"}
    assert sorted(expected - names) == []


def test_the_release_is_recorded_with_the_migrations_its_wheel_ships(release: Release) -> None:
    # The record check_released holds every checkout to (shoal/db/releases.py),
    # written when pyproject's version was released.
    recorded = RELEASES.get(project_version())
    assert recorded is not None, f"shoal/db/releases.py has no {project_version()}"
    with zipfile.ZipFile(release.wheel) as wheel:
        shipped = {
            int(Path(name).name[:4])
            for name in wheel.namelist()
            if "/migrations/" in name and name.endswith(".sql")
        }
    assert set(recorded) <= shipped


def test_twine_check_passes_on_both_files(release: Release) -> None:
    checked = run(sys.executable, "-m", "twine", "check", "--strict", release.wheel, release.sdist)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert checked.stdout.count("PASSED") == 2, checked.stdout


def test_the_readme_installs_the_files_a_build_makes(release: Release) -> None:
    # The commands of "Installing it": a checkout first, the built files next.
    section = readme_section("Installing it in your project")
    install, built = (code for _, code, _ in code_blocks(section))
    assert commands(install)[0] == "pip install ."
    assert release.wheel.name == f"shoal-{project_version()}-py3-none-any.whl"
    assert f"dist/{release.wheel.name}" in built
    assert f"dist/{release.sdist.name}" in built


# -- the installed wheel -----------------------------------------------------------


def test_the_version_is_pyprojects_everywhere(core_venv: Path) -> None:
    version = project_version()
    env = venv_env(core_venv)
    assert run(core_venv / "bin" / "shoal", "--version", env=env).stdout == f"shoal {version}\n"
    script = (
        "import importlib.metadata, shoal; "
        "print(shoal.__version__, importlib.metadata.version('shoal'))"
    )
    shown = run(core_venv / "bin" / "python", "-c", script, env=env)
    assert shown.stdout == f"{version} {version}\n", shown.stderr


def quick_start(folder: Path) -> list[list[str]]:
    """The quick start's commands, a list per shell block; its Python files saved in ``folder``."""
    blocks = code_blocks(readme_section("Quick start"))
    for lang, code, before in blocks:
        if lang == "python":
            (folder / FILE_NAME.findall(before)[-1]).write_text(code)
    assert sorted(p.name for p in folder.iterdir()) == ["send.py", "tasks.py"]
    return [commands(code) for lang, code, _ in blocks if lang == "sh"]


async def test_the_readme_quick_start_runs_a_job(
    core_venv: Path, empty_db_url: str, tmp_path: Path
) -> None:
    """Each step of the README's quick start, as written, in the clean install."""
    set_up, steps = quick_start(tmp_path)
    # It names an example database: here it is a new one of the test's.
    assert set_up == ["export DATABASE_URL=postgresql://localhost/app", "shoal migrate"]
    env = venv_env(core_venv, DATABASE_URL=empty_db_url)

    async def step(command: str) -> str:
        done = await asyncio.to_thread(run, *command.split(), env=env, cwd=tmp_path)
        assert done.returncode == 0, f"{command}: {done.stdout}{done.stderr}"
        return done.stdout

    await step(set_up[1])
    send, work, show = steps
    assert await step(send) == "1\n"  # "prints 1, the job's id"
    assert work == "shoal worker --app tasks:app"
    worker = await asyncio.create_subprocess_exec(
        *work.split(),
        env=env,
        cwd=tmp_path,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    try:
        async with await psycopg.AsyncConnection.connect(empty_db_url, autocommit=True) as conn:

            async def finished() -> bool:
                cursor = await conn.execute("SELECT state FROM shoal.job WHERE id = 1")
                row = await cursor.fetchone()
                return row is not None and row[0] in ("completed", "failed")

            await wait_for(finished, timeout_s=60)
        worker.send_signal(signal.SIGINT)  # Ctrl-C
        output, _ = await asyncio.wait_for(worker.communicate(), 60)
    finally:
        if worker.returncode is None:
            worker.kill()
            await worker.wait()
    assert worker.returncode == 0, output.decode()
    assert show == "shoal job 1"
    shown = await step(show)
    assert re.search(r"\bstate\s+completed\b", shown), shown
    assert re.search(r'^output\s+\{"greeting": "hello, world"\}$', shown, re.MULTILINE), shown
