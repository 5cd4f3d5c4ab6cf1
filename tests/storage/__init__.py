"""Tests of tfscache.storage: the object stores and the disk tier, against a real moto S3 server."""
