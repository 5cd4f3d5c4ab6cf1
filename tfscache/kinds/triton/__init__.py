"""NVIDIA Triton as a node kind: its repository client, its node adapter, its launcher, test models."""
