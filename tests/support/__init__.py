"""Helpers shared by the test suites (imported as ``support``; tests/ is on sys.path)."""
