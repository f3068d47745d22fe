"""Prompt-turn endpoints: where a rendered conversation's reusable prefixes end.

Specification: "Frontend implementations" (prefix-boundary rules declare message roles
and rendering constraints) and "Attention histories and cache policy" (snapshots at exact
token endpoints). The scheduler publishes a snapshot wherever a request's committed state
reaches one of these endpoints, so a later conversation sharing those turns restores the
state after them instead of recomputing it.

Rule (FrontendSyntax.prefix_boundary_rules): the boundary lies right after the end marker
of a rendered message of a role with a rule, unless the template renders messages of
that role differently once later messages follow (`rerendered_by_later_messages`): then
only the last message's end can be one. Messages are rendered in order, so the k-th
message's marker is the first occurrence after the previous message's end. A boundary
counts only where a token ends exactly there (an endpoint is a token count); one that
falls inside a token, or a message whose role has no rule, ends the search (later
positions are no longer known).
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Sequence

from helios_serve.frontend.syntax import FrontendMessageRole, PrefixBoundaryRule

ROLE_OF = {
    "system": FrontendMessageRole.SYSTEM,
    "developer": FrontendMessageRole.SYSTEM,
    "user": FrontendMessageRole.USER,
    "assistant": FrontendMessageRole.ASSISTANT,
    "tool": FrontendMessageRole.TOOL,
}


def prefix_endpoints(text: str, token_ends: Sequence[int], roles: Sequence[str],
                     rules: Sequence[PrefixBoundaryRule],
                     first_end: int | None = None) -> tuple[int, ...]:
    """Token endpoints of the prompt turns `rules` mark in a rendered prompt.

    Args:
        text: the rendered prompt.
        token_ends: character offset (in `text`) where each prompt token ends, ascending
            (tokenizers' Encoding.offsets[i][1]).
        roles: each given message's role ("system", "user", ...), in order.
        rules: the frontend's prefix-boundary rules (one per role at most).
        first_end: where the first message's rendering ends in `text`, when the caller
            knows it (`first_message_end`). A template may render messages nobody sent
            before it (SmolLM2's default system message when the first is not a system
            one); the first end marker is then not the first message's.

    Returns:
        Ascending token counts in [1, len(token_ends)]: each is the number of prompt tokens
        up to and including a boundary.
    """
    by_role = {rule.role: rule for rule in rules}
    out: list[int] = []
    pos = 0
    for index, role in enumerate(roles):
        rule = by_role.get(ROLE_OF.get(role, FrontendMessageRole.UNSPECIFIED))
        if rule is None or not rule.end_marker:
            break
        if index == 0 and first_end is not None:
            if not text.startswith(rule.end_marker, first_end - len(rule.end_marker)):
                break
            at = first_end - len(rule.end_marker)
        else:
            at = text.find(rule.end_marker, pos)
        if at < 0:
            break
        pos = at + len(rule.end_marker)
        if rule.rerendered_by_later_messages and index + 1 < len(roles):
            continue
        tokens = bisect_left(token_ends, pos)
        if tokens == len(token_ends) or token_ends[tokens] != pos:
            break  # inside a token: not an endpoint
        out.append(tokens + 1)
    return tuple(out)


def first_message_end(text: str, first_alone: str) -> int | None:
    """Where the first message's rendering ends in the rendered prompt `text`.

    `first_alone` is the same template rendered with only the first message and no
    generation prompt: templates render messages in order, so when it is a prefix of
    `text` its length is that end, whatever the template put before the message.
    None when it is not a prefix (then `prefix_endpoints` searches for the marker).
    """
    return len(first_alone) if first_alone and text.startswith(first_alone) else None
