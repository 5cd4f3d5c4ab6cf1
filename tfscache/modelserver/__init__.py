"""``tfscache node``: a TF-Serving-compatible model server (imports tensorflow).

Only this package and the tests import tensorflow or tensorflow_serving; see
docs/DESIGN.md for the process contract and the modules' contracts.
"""

import os

# oneDNN's CPU allocator keeps memory freed by an unloaded model, so unloading would
# give nothing back to the OS (measured: +108 MB on load, -0 MB on unload with it on;
# -101 MB with it off). Must be set before tensorflow is first imported.
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")
