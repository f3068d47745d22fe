"""Frontend rules that need the tokenizer: markers that delimit only as their one token,
and the image placeholder the layout replaces by a span.

The specification ("Frontend implementations") makes some syntax strings token-bound:
recipient frame controls "delimit frames only when observed as their tokenizer tokens". A
control the frontend tokenizer does not encode as exactly one token can therefore never
delimit a frame, and no frame could be parsed: such a core fails startup (the output
frontend, ``helios_serve.frontend.pipeline.validate_syntax``) and ``lint-core`` with the
same finding. Everything about the syntax that the contract alone decides is a rule of
helios-contract (``frontend_syntax_findings``).
"""

from __future__ import annotations

from collections.abc import Iterator

from helios_contract import Finding, FrontendSyntaxError
from helios_contract.schema import frontend_pb2 as fpb

__all__ = ["FRAME_CONTROLS", "token_findings"]

FRAME_CONTROLS = ("frame_start", "message_open", "internal_message_end")


def token_findings(frontend: fpb.FrontendContract, tokenizer,
                   base: str = "model.frontend") -> Iterator[Finding]:
    """Token-bound markers the tokenizer does not encode as one token.

    Args:
        frontend: The contract's FrontendContract.
        tokenizer: The frontend ``tokenizers.Tokenizer``.
        base: Field path of ``frontend``.

    Yields:
        ``frontend.token_bound`` findings (raised as ``FrontendSyntaxError``).
    """
    yield from _placeholder(frontend, tokenizer, base)
    if frontend.reasoning_parser != fpb.REASONING_PARSER_RECIPIENT_HEADER:
        return
    for name in FRAME_CONTROLS:
        marker = getattr(frontend.recipient_syntax, name)
        if not marker:
            continue  # a missing control is a contract rule (frontend.syntax_required)
        ids = tokenizer.encode(marker, add_special_tokens=False).ids
        if len(ids) != 1 or tokenizer.decode(ids, skip_special_tokens=False) != marker:
            yield Finding.of(
                "frontend.token_bound", FrontendSyntaxError,
                f"{base}.recipient_syntax.{name}", marker,
                f"recipient frame controls delimit only as their token; the tokenizer "
                f"encodes it as {len(ids)} tokens",
            )


def _placeholder(frontend: fpb.FrontendContract, tokenizer, base: str) -> Iterator[Finding]:
    """IMAGE_LAYOUT_TILE_GRID_SPAN replaces the placeholder's token by an image's span:
    the template's placeholder text must encode as exactly one token."""
    if frontend.image_layout != fpb.IMAGE_LAYOUT_TILE_GRID_SPAN:
        return
    text = frontend.image_token_layout.template_placeholder
    if not text:
        return  # a missing placeholder is a contract rule (image.tile_grid)
    ids = tokenizer.encode(text, add_special_tokens=False).ids
    if len(ids) != 1:
        yield Finding.of(
            "frontend.token_bound", FrontendSyntaxError,
            f"{base}.image_token_layout.template_placeholder", text,
            f"the layout replaces the image placeholder's one token; the tokenizer encodes "
            f"it as {len(ids)} tokens")
