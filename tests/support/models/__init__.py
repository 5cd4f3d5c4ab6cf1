"""The models the tests and scripts/ serve, built by each kind's own tools (not in the wheel)."""
