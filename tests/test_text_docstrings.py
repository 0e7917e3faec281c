"""The docstring corpus: real variable-length text from this Python's standard library, with a real label."""

import subprocess
import sys
import textwrap

import numpy as np
import pytest

from edgebatch.text.docstrings import (
    LABEL_PACKAGES,
    OOV_ID,
    PAD_ID,
    Vocabulary,
    encode_corpus,
    length_summary,
    load_docstrings,
    split,
    tokenize,
)


@pytest.fixture(scope="module")
def corpus():
    return load_docstrings()


def test_the_corpus_is_large_varied_in_length_and_covers_every_label(corpus):
    assert len(corpus) >= 1000
    counts = np.bincount(corpus.labels, minlength=len(LABEL_PACKAGES))
    assert counts.min() >= 100, dict(zip(LABEL_PACKAGES, counts))
    vocabulary = Vocabulary.build(corpus.texts)
    lengths = length_summary(encode_corpus(corpus, vocabulary))
    # What makes it a corpus for length bucketing: short and very long texts side by side.
    assert lengths["min_tokens"] <= 5 and lengths["max_tokens"] >= 300 and lengths["median_tokens"] < 40
    for source, label in zip(corpus.sources, corpus.labels):
        assert source.startswith(LABEL_PACKAGES[label] + "/")
        assert "/test/" not in source and "/tests/" not in source


def test_loading_twice_gives_the_same_corpus(corpus):
    again = load_docstrings()
    assert again.fingerprint == corpus.fingerprint
    assert again.sources == corpus.sources and np.array_equal(again.labels, corpus.labels)
    assert corpus.fingerprint.startswith(f"py{sys.version_info.major}.{sys.version_info.minor}-{len(corpus)}-")


def test_split_is_disjoint_stable_and_near_the_fraction(corpus):
    train, validation = split(corpus, 0.2)
    assert len(train) + len(validation) == len(corpus)
    assert not set(train.sources) & set(validation.sources)
    assert 0.15 < len(validation) / len(corpus) < 0.25
    assert split(corpus, 0.2)[1].sources == validation.sources
    with pytest.raises(ValueError, match="validation_fraction"):
        split(corpus, 1.0)


def test_the_label_is_learnable_from_the_words(corpus):
    """A real task: bag of words + logistic regression beats the largest class by far (86% against 18% here)."""
    from sklearn.feature_extraction.text import CountVectorizer
    from sklearn.linear_model import LogisticRegression

    train, validation = split(corpus)
    vectorizer = CountVectorizer(tokenizer=tokenize, lowercase=False, token_pattern=None)
    model = LogisticRegression(max_iter=2000).fit(vectorizer.fit_transform(train.texts), train.labels)
    accuracy = model.score(vectorizer.transform(validation.texts), validation.labels)
    majority = np.bincount(validation.labels).max() / len(validation)
    assert accuracy > 0.6 and accuracy > 2.5 * majority, (accuracy, majority)


def test_an_exact_corpus_from_a_made_up_standard_library(tmp_path):
    package = tmp_path / "alpha"
    (package / "tests").mkdir(parents=True)
    (package / "__init__.py").write_text('"""Alpha does the first thing well."""\n')
    (package / "core.py").write_text(textwrap.dedent('''
        """Core pieces of alpha."""
        class Engine:
            """Runs the alpha engine forward."""
            def start(self):
                """Start it up now please."""
            def stop(self):
                """Stop."""
        async def spin():
            """Spin the wheel around once."""
    '''))
    (package / "tests" / "test_core.py").write_text('"""Tests that must not be in the corpus."""\n')
    (package / "broken.py").write_text("def (:\n")
    (tmp_path / "beta").mkdir()
    (tmp_path / "beta" / "b.py").write_text('"""Beta has its own words here."""\n')

    corpus = load_docstrings(("alpha", "beta"), stdlib_dir=tmp_path)
    assert corpus.sources == (
        "alpha/__init__.py:<module>",
        "alpha/core.py:<module>",
        "alpha/core.py:Engine",
        "alpha/core.py:Engine.start",
        "alpha/core.py:spin",
        "beta/b.py:<module>",
    )
    assert corpus.labels.tolist() == [0, 0, 0, 0, 0, 1]
    assert corpus.texts[3] == "Start it up now please."
    with pytest.raises(ValueError, match="'gamma' not found"):
        load_docstrings(("alpha", "gamma"), stdlib_dir=tmp_path)


def test_vocabulary_ids_padding_and_unknown_tokens():
    vocabulary = Vocabulary.build(["the cat sat", "the cat ran", "the dog"], min_count=2)
    assert vocabulary.tokens == ("the", "cat")
    assert vocabulary.size == 4
    ids = vocabulary.encode("The cat, the zebra!")
    assert ids.tolist() == [2, 3, OOV_ID, 2, OOV_ID, OOV_ID]
    assert PAD_ID not in ids
    assert vocabulary.encode("the cat the cat", max_tokens=3).tolist() == [2, 3, 2]
    assert tokenize("read_file(path, 2048)") == ["read_file", "(", "path", ",", "2048", ")"]


def test_the_corpus_imports_no_tensorflow():
    code = "import sys, edgebatch.text.docstrings as d; d.load_docstrings(); print('tensorflow' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.stdout.strip() == "False", done.stderr
