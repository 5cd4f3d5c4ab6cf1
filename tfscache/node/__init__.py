"""``tfscache node``: a TF-Serving-compatible model server (imports tensorflow).

Only this package and the tests import tensorflow or tensorflow_serving; see
docs/DESIGN.md for the process contract and the modules' contracts.
"""
