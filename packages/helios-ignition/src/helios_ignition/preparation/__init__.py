"""Reusable contract declarations for recipes (specification: Ownership and bootstrap)."""
