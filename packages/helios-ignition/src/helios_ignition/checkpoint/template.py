"""Chat template rendering for preparation; the one implementation lives in helios-tools.

Serve cannot import ignition, so both sides use `helios_tools.frontend_assets`; this module
re-exports it so ignition code has one obvious import path.
"""

from helios_tools.frontend_assets import ChatTemplateError, load_tokenizer, render_chat

__all__ = ["ChatTemplateError", "load_tokenizer", "render_chat"]
