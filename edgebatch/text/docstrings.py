"""A real, variable-length text corpus that needs no download: the Python standard library's docstrings.

The task: given a docstring, say which standard-library package it comes from (asyncio, email,
logging, ...). The text is real English written by many people, its lengths run from a few words
to several hundred, and the labels are facts about where each text lives, not annotations. It is
license-clean (the Python Software Foundation License) and on every machine that has Python.

The corpus depends on the Python version (the standard library changes between releases):
`DocstringCorpus.fingerprint` names the exact set, so a benchmark can say what it ran on. Files are
parsed with `ast` (never imported), so reading the corpus runs no library code. Tests directories
are left out: their docstrings describe tests, not the package.

Pure Python and numpy; no TensorFlow.
"""

from __future__ import annotations

import ast
import hashlib
import os
import re
import sys
import sysconfig
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import numpy as np

# Packages present as directories in the standard library of Python 3.10 to 3.13, each with over
# 100 docstrings of at least 3 words in 3.11.7 (load_docstrings() there: asyncio 359, email 309,
# importlib 302, logging 242, xml 226, unittest 181, multiprocessing 173, http 142; 1,934 in all).
# A bag-of-words logistic regression labels the held-out 20% 86% right (the largest class is 18%).
LABEL_PACKAGES = ("asyncio", "email", "http", "importlib", "logging", "multiprocessing", "unittest", "xml")
MIN_WORDS = 3
PAD_ID = 0
OOV_ID = 1
_TOKEN_RE = re.compile(r"[a-z_]+|\d+|[^\sa-z_\d]")
_SKIPPED_DIRS = {"test", "tests", "__pycache__", "idle_test"}


@dataclass(frozen=True)
class DocstringCorpus:
    """Docstrings with their package label; `sources` say where each one is (file:qualified name)."""

    texts: tuple[str, ...]
    labels: np.ndarray
    label_names: tuple[str, ...]
    sources: tuple[str, ...]
    python_version: str

    def __len__(self) -> int:
        return len(self.texts)

    @property
    def fingerprint(self) -> str:
        """Python version, size and a hash of every source and text: equal fingerprints, equal corpora."""
        digest = hashlib.sha256()
        for source, text in zip(self.sources, self.texts):
            digest.update(source.encode())
            digest.update(b"\0")
            digest.update(text.encode())
            digest.update(b"\0")
        return f"py{self.python_version}-{len(self)}-{digest.hexdigest()[:12]}"

    def subset(self, indices) -> DocstringCorpus:
        indices = list(indices)
        return DocstringCorpus(
            texts=tuple(self.texts[i] for i in indices),
            labels=self.labels[indices],
            label_names=self.label_names,
            sources=tuple(self.sources[i] for i in indices),
            python_version=self.python_version,
        )


def stdlib_directory() -> Path:
    """Where this interpreter's standard library lives."""
    return Path(sysconfig.get_paths()["stdlib"])


def load_docstrings(
    packages: tuple[str, ...] = LABEL_PACKAGES,
    *,
    min_words: int = MIN_WORDS,
    stdlib_dir: str | Path | None = None,
) -> DocstringCorpus:
    """Every module, class and function docstring of at least `min_words` words in `packages`.

    Ordered by package, then file path, then position in the file, so two loads give the same
    corpus. A package missing from this Python is a ValueError naming it.
    """
    root = Path(stdlib_dir) if stdlib_dir is not None else stdlib_directory()
    texts, labels, sources = [], [], []
    for label, package in enumerate(packages):
        package_dir = root / package
        if not package_dir.is_dir():
            raise ValueError(f"standard-library package {package!r} not found under {root}: choose others")
        for path in _python_files(package_dir):
            for qualified_name, text in _docstrings(path):
                if len(text.split()) < min_words:
                    continue
                texts.append(text)
                labels.append(label)
                sources.append(f"{path.relative_to(root).as_posix()}:{qualified_name}")
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    return DocstringCorpus(tuple(texts), np.asarray(labels, dtype=np.int32), tuple(packages), tuple(sources), version)


def _python_files(package_dir: Path) -> list[Path]:
    found = []
    for dirpath, dirnames, filenames in os.walk(package_dir):
        dirnames[:] = sorted(name for name in dirnames if name not in _SKIPPED_DIRS)
        found.extend(Path(dirpath) / name for name in sorted(filenames) if name.endswith(".py"))
    return found


def _docstrings(path: Path) -> list[tuple[str, str]]:
    """(qualified name, docstring) of the module, its classes and functions, in source order."""
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    except (SyntaxError, UnicodeDecodeError, ValueError):
        return []
    found = []

    def visit(node, prefix):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                name = f"{prefix}{child.name}"
                text = ast.get_docstring(child)
                if text:
                    found.append((name, text))
                visit(child, f"{name}.")

    module_text = ast.get_docstring(tree)
    if module_text:
        found.append(("<module>", module_text))
    visit(tree, "")
    return found


def split(corpus: DocstringCorpus, validation_fraction: float = 0.2) -> tuple[DocstringCorpus, DocstringCorpus]:
    """(train, validation), decided per docstring by a hash of its source: stable across runs and machines."""
    if not 0 < validation_fraction < 1:
        raise ValueError(f"validation_fraction must be in (0, 1), got {validation_fraction!r}")
    threshold = int(validation_fraction * 2**32)
    validation = [int.from_bytes(hashlib.sha256(s.encode()).digest()[:4], "big") < threshold for s in corpus.sources]
    train_idx = [i for i, is_val in enumerate(validation) if not is_val]
    val_idx = [i for i, is_val in enumerate(validation) if is_val]
    return corpus.subset(train_idx), corpus.subset(val_idx)


def tokenize(text: str) -> list[str]:
    """Lowercase words (letters and underscores), digit runs, and single punctuation marks."""
    return _TOKEN_RE.findall(text.lower())


@dataclass(frozen=True)
class Vocabulary:
    """Token ids: 0 is padding, 1 an unknown token, then tokens by falling count (ties by name)."""

    tokens: tuple[str, ...]

    @classmethod
    def build(cls, texts, *, max_size: int = 20000, min_count: int = 2) -> Vocabulary:
        if max_size < 3:
            raise ValueError(f"max_size must leave room for padding, unknown and a token, got {max_size!r}")
        counts = Counter(token for text in texts for token in tokenize(text))
        ranked = sorted((token for token, n in counts.items() if n >= min_count), key=lambda t: (-counts[t], t))
        return cls(tuple(ranked[: max_size - 2]))

    @property
    def size(self) -> int:
        """Ids in use, padding and unknown included: the input dimension of an Embedding."""
        return len(self.tokens) + 2

    def encode(self, text: str, max_tokens: int | None = None) -> np.ndarray:
        """int32 ids of `text`, truncated to `max_tokens`; never padded (batching pads)."""
        index = self._index()
        ids = [index.get(token, OOV_ID) for token in tokenize(text)]
        if max_tokens is not None:
            ids = ids[:max_tokens]
        return np.asarray(ids, dtype=np.int32)

    def _index(self) -> dict[str, int]:
        cached = self.__dict__.get("_cached_index")
        if cached is None:
            cached = {token: i + 2 for i, token in enumerate(self.tokens)}
            object.__setattr__(self, "_cached_index", cached)
        return cached


def encode_corpus(corpus: DocstringCorpus, vocabulary: Vocabulary, max_tokens: int | None = None) -> list[np.ndarray]:
    """One variable-length int32 array per docstring (empty texts after tokenising keep one unknown id)."""
    encoded = []
    for text in corpus.texts:
        ids = vocabulary.encode(text, max_tokens)
        encoded.append(ids if ids.size else np.asarray([OOV_ID], dtype=np.int32))
    return encoded


def length_summary(sequences: list[np.ndarray]) -> dict:
    """Token counts: min, median, 90th percentile, max, and the total."""
    lengths = np.asarray([len(s) for s in sequences])
    return {
        "count": int(lengths.size),
        "min_tokens": int(lengths.min()),
        "median_tokens": float(np.median(lengths)),
        "p90_tokens": float(np.percentile(lengths, 90)),
        "max_tokens": int(lengths.max()),
        "total_tokens": int(lengths.sum()),
    }
