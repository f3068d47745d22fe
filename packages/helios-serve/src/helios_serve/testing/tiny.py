"""A tiny served model for tests: tokenizer, ChatML template, contract and bootstrap."""

from __future__ import annotations

from helios_contract.schema import contract_pb2, frontend_pb2

from helios_serve.bootstrap import Bootstrap
from helios_serve.testing.tokenizer import CHAT_TEMPLATE, EOS_ID, TinyTokenizer

SERVED_ID = "helios-tiny"


def tiny_contract(
    tokenizer: TinyTokenizer,
    *,
    max_active: int = 0,
    queue_capacity: int = 0,
    frontend_workers: int = 0,
    max_output_tokens: int = 64,
) -> contract_pb2.ServingContract:
    """A ServingContract carrying what serving reads besides the graphs."""
    c = contract_pb2.ServingContract(
        served_id=SERVED_ID,
        aliases=["tiny"],
        cache_identity="tiny-v1",
        context_tokens=256,
        eos_token_ids=[EOS_ID],
    )
    c.defaults.sampling.temperature = 0.0
    c.defaults.sampling.top_p = 1.0
    c.defaults.sampling.repetition_penalty = 1.0
    c.defaults.sampling.max_output_tokens = max_output_tokens
    c.defaults.max_active = max_active
    c.defaults.queue_capacity = queue_capacity
    c.defaults.frontend_workers = frontend_workers
    c.template_tokens.eos_token = "<|im_end|>"
    c.model.version = 3
    c.model.vocabulary.sampled_tokens = tokenizer.vocab_size
    c.model.vocabulary.histogram_width = tokenizer.vocab_size
    c.model.vocabulary.mask_words = (tokenizer.vocab_size + 31) // 32
    fe = c.model.frontend
    fe.tool_parser = frontend_pb2.TOOL_PARSER_NONE
    fe.reasoning_parser = frontend_pb2.REASONING_PARSER_NONE
    fe.image_preparation = frontend_pb2.IMAGE_PREPARATION_NONE
    fe.image_layout = frontend_pb2.IMAGE_LAYOUT_NONE
    fe.assistant_boundaries.message_end_markers.append("<|im_end|>")
    fe.assistant_boundaries.assistant_header = "<|im_start|>assistant"
    return c


def tiny_bootstrap(tokenizer: TinyTokenizer, **contract_options) -> Bootstrap:
    """A Bootstrap without a core (test-built)."""
    return Bootstrap.from_parts(
        tiny_contract(tokenizer, **contract_options), tokenizer.to_json(), CHAT_TEMPLATE
    )
