"""The models edgebatch builds: built-in names, FILE.py:FUNCTION and .keras files.

zoo.py parses a model spec (no TensorFlow) and builds it (Keras 3, or tf_keras for TFMOT);
text.py holds the sequence models over the docstrings corpus (edgebatch/text); layers.py reads
what a built model holds, for the probe's trials and training's checks alike. Importing this
package does not import TensorFlow.
"""
