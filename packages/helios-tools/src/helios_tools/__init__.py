"""helios-tools."""
