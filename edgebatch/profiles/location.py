"""Where profiles live: a local directory (a Path) or an fsspec URL (a ProfileURL).

A value is a URL when it starts with a protocol and `://` (`file:///srv/p`, `memory://p`,
`s3://bucket/p`, chained `simplecache::s3://bucket/p`); anything else is a local path. URLs are
never passed through Path, which would turn `s3://b/x` into `s3:/b/x`.

fsspec is imported only when a URL is used, and every way of failing to reach one (an unknown
protocol, a backend that is not installed, a refused connection, a backend's own exception)
becomes a one-line UsageError or ProfileError that names the URL.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator
from pathlib import Path

from edgebatch.errors import EdgebatchError, ProfileError, UsageError

# RFC 3986 scheme characters, optionally chained with fsspec's `::` (simplecache::s3://...).
_URL_RE = re.compile(r"^[A-Za-z][A-Za-z0-9+.\-]*(::[A-Za-z][A-Za-z0-9+.\-]*)*://")


def is_url(value: str | Path) -> bool:
    """True for a string that starts with `protocol://`; a Path is never a URL."""
    return isinstance(value, str) and _URL_RE.match(value) is not None


class ProfileURL(str):
    """An fsspec URL of a profiles directory or of one profile file.

    It is the URL string itself (print it, compare it, put it in JSON), plus the few Path
    operations the callers of the store use: `url / name`, `.name`, `.parent`, `.is_dir()`.
    """

    __slots__ = ()

    @property
    def protocol(self) -> str:
        """What comes before `://` (for a chained URL, the whole chain: `simplecache::s3`)."""
        return self.partition("://")[0]

    def __truediv__(self, name: str) -> ProfileURL:
        relative = str(name).strip("/")
        return ProfileURL(self + relative if self.endswith("/") else f"{self}/{relative}")

    @property
    def name(self) -> str:
        """The last path component, like Path.name ('' for a bare `memory://`)."""
        return self.partition("://")[2].rsplit("/", 1)[-1]

    @property
    def parent(self) -> ProfileURL:
        """The URL one component up; a URL with a single component is its own parent."""
        scheme, separator, rest = self.partition("://")
        if "/" not in rest.lstrip("/"):
            return self
        return ProfileURL(f"{scheme}{separator}{rest.rsplit('/', 1)[0]}")

    def is_dir(self) -> bool:
        """True if the URL names an existing directory (for object stores: a prefix with objects under it)."""
        fs, path = open_url(self)
        with remote_errors(self, "reach"):
            return bool(fs.isdir(path))


def as_location(value: str | Path) -> Path | ProfileURL:
    """`value` as a location: a ProfileURL if it is a URL (trailing slashes dropped), else an expanded Path."""
    if isinstance(value, ProfileURL):
        return value
    if is_url(value):
        scheme, separator, rest = value.partition("://")
        stripped = rest.rstrip("/")
        return ProfileURL(f"{scheme}{separator}{stripped if stripped else rest}")
    return Path(value).expanduser()


def open_url(url: str):
    """(fsspec filesystem, path inside it) for `url`.

    An unknown protocol or a backend that is not installed is a UsageError that says what to
    install; any other failure to reach the filesystem (a refused connection, missing
    credentials) is a ProfileError. Both name the URL.
    """
    import fsspec.core  # lazily: local profiles never need fsspec

    try:
        return fsspec.core.url_to_fs(url)
    except ImportError as error:
        raise UsageError(_missing_backend_message(url, error)) from error
    except ValueError as error:
        if "protocol not known" in str(error).lower():
            raise UsageError(
                f"profiles location {url}: fsspec knows no filesystem {_failing_protocol(url, error)!r}; "
                "check the URL (file://, memory://, s3://, gs://, abfs://, ...) or give a local directory"
            ) from error
        raise ProfileError(f"cannot reach profiles location {url}: {_one_line(error)}") from error
    except Exception as error:  # a backend connecting at construction (ftp, sftp) raises its own errors
        raise ProfileError(f"cannot reach profiles location {url}: {_one_line(error)}") from error


@contextlib.contextmanager
def remote_errors(url: str, doing: str) -> Iterator[None]:
    """Turn any failure of an fsspec call into `ProfileError("cannot <doing> <url>: ...")`.

    Backends raise their own exception types (botocore, aiohttp, ftplib ...), so everything but
    an EdgebatchError is translated; KeyboardInterrupt and other BaseExceptions pass through.
    """
    try:
        yield
    except EdgebatchError:
        raise
    except Exception as error:
        raise ProfileError(f"cannot {doing} {url}: {_one_line(error)}") from error


def _missing_backend_message(url: str, error: ImportError) -> str:
    from fsspec.registry import known_implementations

    protocol = _failing_protocol(url, error)
    message = f"profiles location {url} needs the fsspec backend for {protocol!r}, which is not installed"
    package = known_implementations.get(protocol, {}).get("class", "").split(".")[0]
    reason = _one_line(error)
    if package and package != "fsspec":
        return f"{message} ({reason}): pip install {package}"
    return f"{message}: {reason}"


def _failing_protocol(url: str, error: Exception) -> str:
    """The protocol fsspec complained about: the one it names, else the URL's innermost."""
    match = re.search(r"protocol not known: (\S+)", str(error), re.IGNORECASE)
    if match:
        return match.group(1)
    chain = url.partition("://")[0].split("::")
    from fsspec.registry import known_implementations, registry

    for protocol in reversed(chain):
        if protocol not in registry and protocol in known_implementations:
            return protocol
    return chain[-1]


def _one_line(error: BaseException) -> str:
    text = " ".join(str(error).split()) or type(error).__name__
    return text if len(text) <= 300 else text[:297] + "..."
