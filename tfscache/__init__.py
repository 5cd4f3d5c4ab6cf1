"""tfscache: a caching manager for TensorFlow Serving.

The package root imports nothing heavy: the sidecar and front end must start
without tensorflow or tensorflow_serving (only ``tfscache.modelserver`` loads them).
"""

__version__ = "0.1.0"
