"""helios-serve."""
