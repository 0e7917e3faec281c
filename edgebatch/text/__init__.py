"""Text: a real variable-length corpus built from the standard library (docstrings.py).

The home of sequence-length work (issue 14): bucketing by length and token budgets come next.
Importing this package does not import TensorFlow.
"""
