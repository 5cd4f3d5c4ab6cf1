"""NVIDIA Triton as a node kind: its repository client, its node adapter (on tfscache.kinds.oip's
base), its launcher."""
