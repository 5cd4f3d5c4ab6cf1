"""The APIs the front ends speak, one package per protocol (method tables, REST URLs, probes)."""
