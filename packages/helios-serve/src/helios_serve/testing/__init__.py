"""Test-only helpers: a scripted token source behind the real scheduler and output path.

Nothing here is used when serving a core; tests import it to drive the worker, the
scheduler and the HTTP layer with exact, chosen token sequences.
"""
