"""OpenAI-compatible HTTP layer (Litestar): the only module tree that imports Litestar."""
