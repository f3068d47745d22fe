"""helios-contract."""
