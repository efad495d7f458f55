"""shoal's release files built as a release is, and clean virtualenvs to install them in.

Used by the session fixtures ``release`` and ``core_venv`` (tests/conftest.py),
which tests/test_release.py and tests/test_core_install.py share: the sdist
and the wheel are built once per run, and the wheel is installed once.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
import venv
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).parent.parent
# What the distribution is built from: pyproject.toml names the package and
# the readme; nothing else of the checkout goes in.
BUILD_INPUTS = ("pyproject.toml", "README.md", "LICENSE")
PACKAGE = "shoal"
# The test extra installs them (make .venv/.installed).
RELEASE_TOOLS = ("build", "twine", "uv")


@dataclass(frozen=True)
class Release:
    source: Path  # the copy of the checkout's build inputs it was built from
    wheel: Path
    sdist: Path


def run(
    *args: str | Path,
    env: dict[str, str] | None = None,
    cwd: Path | None = None,
    timeout_s: float = 300,
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(a) for a in args], capture_output=True, text=True, env=env, cwd=cwd, timeout=timeout_s
    )


def check_release_tools() -> None:
    missing = [tool for tool in RELEASE_TOOLS if importlib.util.find_spec(tool) is None]
    if missing:
        raise AssertionError(
            f"{' and '.join(missing)} missing from {sys.prefix}: they are in shoal's test "
            "extra (make .venv/.installed installs it)"
        )


def build_release(base: Path) -> Release:
    """``python -m build`` on a copy of the checkout's build inputs: the sdist, then the
    wheel built from the sdist, as a release is made.

    A copy, because the build writes ``shoal.egg-info`` and ``build/`` beside
    its sources, and a stale ``build/`` of the checkout would go into the wheel.
    """
    check_release_tools()
    source = base / "source"
    source.mkdir()
    for name in BUILD_INPUTS:
        shutil.copy2(ROOT / name, source / name)
    shutil.copytree(
        ROOT / PACKAGE, source / PACKAGE, ignore=shutil.ignore_patterns("__pycache__", "*.pyc")
    )
    dist = base / "dist"
    built = run(sys.executable, "-m", "build", "--outdir", dist, source)
    assert built.returncode == 0, built.stdout + built.stderr
    (wheel,) = dist.glob("*.whl")
    (sdist,) = dist.glob("*.tar.gz")
    return Release(source, wheel, sdist)


def package_files(source: Path) -> set[str]:
    """Every file of the package in ``source``, as a path relative to it (``shoal/py.typed``)."""
    return {
        path.relative_to(source).as_posix()
        for path in (source / PACKAGE).rglob("*")
        if path.is_file()
    }


def clean_venv(path: Path, *requirements: str | Path) -> Path:
    """A virtualenv of the base interpreter, without the system's site-packages or
    this one's, with ``requirements`` and their dependencies installed from the
    package index.

    uv installs them, not pip: the same wheels from the same index, resolved
    afresh, in about 2 s where pip took 8-16 s on the 2-core machine (and the
    venv needs no pip of its own, whose ensurepip costs seconds more).
    """
    check_release_tools()
    from uv import find_uv_bin

    venv.create(path, with_pip=False)
    python = path / "bin" / "python"
    uv = (find_uv_bin(), "pip", "install", "--quiet", "--python", python)
    installed = run(*uv, *requirements, env=venv_env(path))
    assert installed.returncode == 0, installed.stdout + installed.stderr
    return path


def distributions(venv_path: Path) -> set[str]:
    """The normalized names of the distributions installed in the venv at ``venv_path``."""
    script = (
        "import importlib.metadata as m, re; "
        "print(*sorted({re.sub(r'[-_.]+', '-', d.metadata['Name']).lower() "
        "for d in m.distributions()}))"
    )
    listed = run(venv_path / "bin" / "python", "-c", script, env=venv_env(venv_path))
    assert listed.returncode == 0, listed.stderr
    return set(listed.stdout.split())


# What would let a checkout's code into the clean venv: a test run's own
# PYTHONPATH (often the checkout itself), or another environment's settings.
LEAKS = ("PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP", "PYTHONUSERBASE", "VIRTUAL_ENV")


def venv_env(venv_path: Path, **extra: str) -> dict[str, str]:
    """The environment of a command run in the venv at ``venv_path``, as its user's shell
    would have it once activated: its ``bin`` first on PATH, nothing else of Python's."""
    env = {name: value for name, value in os.environ.items() if name not in LEAKS}
    env["PATH"] = f"{venv_path / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    return {**env, **extra}
