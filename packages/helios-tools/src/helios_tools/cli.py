"""Command-line entry point (placeholder until its issue lands)."""

import click


@click.group()
def main() -> None:
    """helios-tools."""
