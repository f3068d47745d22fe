"""The routing view of a request: its rendered prompt's leading page keys and its
`previous_response_id`, read from the raw JSON body at the ingress.

The ingress renders chat messages with the core's own chat template and tokenizer (the
same verified core the replicas serve), so the keys are those of the token pages a
replica's prefix cache publishes. Routing is a hint: a body the replica will reject, or
one this view renders differently from the replica (Responses and Messages input is read
as plain chat messages here), only loses affinity; the replica still answers it.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from helios_tools.frontend_assets import ChatTemplateError, render_chat

from helios_serve.bootstrap import Bootstrap
from helios_serve.ray.affinity import DEFAULT_MAX_PAGES, page_keys


@dataclass(frozen=True)
class RequestView:
    """What routing reads from one request.

    Attributes:
        keys: page keys of the rendered prompt (affinity.page_keys), () when none.
        previous_response_id: the Responses API's continuation id, or None.
    """

    keys: tuple[bytes, ...] = ()
    previous_response_id: str | None = None


def _text(content: Any) -> str:
    """A message's content as text: a string, or the text parts of a list of parts."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content
                       if isinstance(p, dict) and isinstance(p.get("text"), str))
    return ""


def _messages(path: str, body: dict[str, Any]) -> list[dict[str, Any]] | None:
    """The conversation of a chat, Messages or Responses body as chat messages."""
    if path == "/v1/chat/completions":
        raw = body.get("messages")
        if not isinstance(raw, list):
            return None
        # As the server's preparation does: None fields dropped, text parts joined.
        out = [{k: v for k, v in m.items() if v is not None} for m in raw if isinstance(m, dict)]
        for m in out:
            if isinstance(m.get("content"), list):
                m["content"] = _text(m["content"])
        return out
    if path == "/v1/messages":
        out = [{"role": "system", "content": _text(body["system"])}] if body.get("system") else []
        for m in body.get("messages") or []:
            if isinstance(m, dict):
                out.append({"role": m.get("role"), "content": _text(m.get("content"))})
        return out
    if path == "/v1/responses":
        out = ([{"role": "system", "content": body["instructions"]}]
               if isinstance(body.get("instructions"), str) else [])  # fmt: skip
        items = body.get("input")
        if isinstance(items, str):
            return [*out, {"role": "user", "content": items}]
        for item in items if isinstance(items, list) else []:
            if isinstance(item, dict) and "role" in item:
                out.append({"role": item["role"], "content": _text(item.get("content"))})
        return out
    return None


class PromptRouting:
    """Renders request bodies into page keys with one core's template and tokenizer.

    Args:
        tokenizer: the core's `tokenizers.Tokenizer`.
        chat_template: the core's Jinja2 chat template.
        template_variables: bos/eos/pad strings the template names.
        page_tokens: tokens per cache page.
        max_pages: leading pages hashed per prompt.
    """

    def __init__(self, tokenizer: Any, chat_template: str, template_variables: dict[str, str],
                 page_tokens: int, max_pages: int = DEFAULT_MAX_PAGES) -> None:  # fmt: skip
        self.tokenizer = tokenizer
        self.chat_template = chat_template
        self.template_variables = template_variables
        self.page_tokens = page_tokens
        self.max_pages = max_pages

    @classmethod
    def from_core(cls, core: str, trusted_keys: Sequence[str], acceptance: str,
                  resource_key: bytes | None = None) -> PromptRouting:  # fmt: skip
        """Verify and open the core (Bootstrap.load), keep its frontend assets, close it.

        Raises:
            StartupError: the core does not verify, authorize or load.
        """
        with Bootstrap.load(core, list(trusted_keys), acceptance,
                            resource_key=resource_key) as bootstrap:  # fmt: skip
            return cls(bootstrap.tokenizer, bootstrap.chat_template,
                       bootstrap.template_variables, bootstrap.contract.model.cache.page_tokens)

    def token_ids(self, path: str, body: dict[str, Any]) -> list[int]:
        """The prompt's token ids as the replica would render them; [] when this view
        cannot render the body (routing then has no prefix to follow)."""
        if path == "/v1/completions":
            prompt = body.get("prompt")
            if isinstance(prompt, str):
                return self.tokenizer.encode(prompt, add_special_tokens=True).ids
            if isinstance(prompt, list) and all(isinstance(i, int) for i in prompt):
                return prompt
            return []
        messages = _messages(path, body)
        if not messages:
            return []
        tools = body.get("tools") if path == "/v1/chat/completions" else None
        try:
            text = render_chat(self.chat_template, messages, add_generation_prompt=True,
                               tools=tools if isinstance(tools, list) else None,
                               **self.template_variables)  # fmt: skip
        except (ChatTemplateError, TypeError, ValueError):
            return []
        return self.tokenizer.encode(text, add_special_tokens=False).ids

    def view(self, path: str, raw: bytes) -> RequestView:
        """The routing view of one POST body (an unreadable body has an empty view)."""
        try:
            body = json.loads(raw)
        except (ValueError, UnicodeDecodeError):
            return RequestView()
        if not isinstance(body, dict):
            return RequestView()
        previous = body.get("previous_response_id") if path == "/v1/responses" else None
        keys = page_keys(self.token_ids(path, body), self.page_tokens, self.max_pages)
        return RequestView(keys, previous if isinstance(previous, str) else None)
