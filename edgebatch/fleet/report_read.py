"""What `edgebatch fleet report` reads: the profiles, and the versions of this install.

- `collect(locations)` reads profiles through `edgebatch.profiles.store` (a profile file, a directory
  searched recursively, or an fsspec URL) and returns the profiles plus every file that could not be
  read, each with its one-line error. Nothing here writes anything.
- `running_versions()` says what a profile written here would record (package metadata only).

The decisions on what was read are analyse's (report.py), which needs no files.
"""

from __future__ import annotations

import importlib.metadata
from collections.abc import Callable, Iterable, Sequence

from edgebatch.errors import EdgebatchError
from edgebatch.fleet.report_records import InvalidFile, ProfileEntry, RunningVersions
from edgebatch.profiles.schema import SCHEMA_VERSION

# Distributions TensorFlow ships as; the first one installed names the running TensorFlow version.
_TENSORFLOW_DISTRIBUTIONS = ("tensorflow", "tensorflow-cpu", "tensorflow-macos", "tf-nightly")


def running_versions() -> RunningVersions:
    """The running schema, edgebatch and TensorFlow versions, read from package metadata.

    TensorFlow is not imported (seconds, and gigabytes on a GPU): its installed distribution's
    version is what a probe run here would record.
    """
    return RunningVersions(
        schema_version=SCHEMA_VERSION,
        edgebatch=_distribution_version(("edgebatch",)),
        tensorflow=_distribution_version(_TENSORFLOW_DISTRIBUTIONS),
    )


def _distribution_version(names: Iterable[str]) -> str | None:
    for name in names:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def collect(
    locations: Sequence[str],
    *,
    on_location: Callable[[str, int, int], None] | None = None,
) -> tuple[list[ProfileEntry], list[InvalidFile]]:
    """Read every profile under `locations`: profile files, directories (recursively) or fsspec URLs.

    A URL whose last component ends in `.json` is read as one profile file, any other URL as a
    directory. Returns (source, profile) for each readable profile and an InvalidFile for each
    file that is not one (corrupt, invalid, misnamed, of another schema version) and for each
    location that does not exist or cannot be reached; one bad location never stops the others.
    `on_location(location, profiles, invalid)` is called after each location is read (for progress lines).
    """
    from edgebatch.profiles.location import ProfileURL, as_location
    from edgebatch.profiles.store import list_profiles, load_profile

    entries: list[ProfileEntry] = []
    invalid: list[InvalidFile] = []
    for text in locations:
        found_before, invalid_before = len(entries), len(invalid)
        try:
            location = as_location(text)
            if isinstance(location, ProfileURL) and location.name.endswith(".json"):
                listed = [(location, load_profile(location))]
            elif isinstance(location, ProfileURL) or location.is_dir():
                listed = list_profiles(location, recursive=True)
                if not listed and isinstance(location, ProfileURL):
                    # An object store cannot tell an empty prefix from a missing one; say both.
                    invalid.append(InvalidFile(text, f"{text} holds no profile files (or does not exist)"))
            elif location.is_file():
                listed = [(location, load_profile(location))]
            else:
                listed = []
                invalid.append(InvalidFile(text, f"{text} does not exist"))
        except EdgebatchError as error:
            listed = []
            invalid.append(InvalidFile(text, _one_line(str(error))))
        for source, item in listed:
            if isinstance(item, Exception):
                invalid.append(InvalidFile(str(source), _one_line(str(item))))
            else:
                entries.append((str(source), item))
        if on_location is not None:
            on_location(text, len(entries) - found_before, len(invalid) - invalid_before)
    return entries, invalid


def _one_line(text: str) -> str:
    return " ".join(text.split())
