"""Text: a real variable-length corpus built from the standard library's docstrings (docstrings.py).

The sequence models trained on it live in edgebatch/models/text.py. Importing this package does
not import TensorFlow.
"""
