"""Fakes of services that cannot run on the build machines (see each module's docstring)."""
