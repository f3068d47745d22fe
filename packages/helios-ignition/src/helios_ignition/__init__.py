"""helios-ignition."""
