"""The boundary between a model family and the family-independent programs.

A family (helios_ignition/families/) supplies one rank's geometry, its weight buffers
and the trunk of a forward pass: embedding, every layer and the final norm, recorded
against the builder. The programs (capture/programs.py: PREFILL, DECODE, SPECULATIVE,
RESTORE, the tuning producer) declare every other buffer, record the LM head, sampling,
logprobs, the draft head and transfers, and write the graph contracts. A second family
implements `Family`; it copies no program.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from ..checkpoint.geometry import VisionGeometry
from .builder import BufferTable, ProgramBuilder, View


class TensorParallelError(ValueError):
    """The model cannot be split between the asked number of ranks."""


@dataclass(frozen=True)
class Rows:
    """Where one pass's packed rows come from (views of the buffer table)."""

    tokens: View  # [T] i32 token ids
    positions: View  # [T] i32
    token_row: View  # [T] i32 submission row (< 0 padding)
    slot: View  # [R] i32 physical request rows
    attn_slot: View  # [T] i32 slot of each query row (decode-style attention)


@dataclass(frozen=True)
class ImageRows:
    """The image features a pass writes into its embedding rows: `features` [F, hidden]
    f32 (the connector's outputs) and `index` [T] i32 (per packed token, its feature row
    or -1)."""

    features: View
    index: View


@dataclass(frozen=True)
class Pass:
    """One forward pass a family records its trunk for: `tokens` (T) packed rows of
    `requests` (R) requests over paged caches of `page_tokens` (PT) tokens a page and
    `pages_per_request` (MP) pages a request.

    `decode_attention`: each row is one query attending to its slot's cache up to its own
    position (decode rows, verification rows), else attention is causal over a prefill
    chunk. `invariant`: products record `linear_invariant` and no fused SwiGLU, so every
    row's result is independent of T (decode and verification agree bit for bit).
    `tuned`: decode attention reads the tuned split count. `fold`: the family may fold
    norms and residual adds into its products (a family without such kernels ignores it).
    `images`: after embedding, the trunk writes these features into their token rows
    (``image_merge``).
    """

    rows: Rows
    tokens: int
    requests: int
    page_tokens: int
    pages_per_request: int
    decode_attention: bool
    invariant: bool
    tuned: bool = False
    fold: bool = False
    images: ImageRows | None = None


class Family(Protocol):
    """What the programs need from a model family (one rank's shapes under tensor
    parallelism: `heads`, `kv_heads` and the family's own widths are that rank's share,
    `vocab` and `hidden` the model's).

    The programs read these buffers the family declares: `embed` [vocab, hidden] (the
    draft head embeds with it), `rope_inv_freq` [head_dim / 2] f32 (the draft head's
    RoPE), `scratch.qkv` [tokens, qkv_width] (fused [q; k; v] rows, what paged attention
    reads), `scratch.attn` [tokens, heads x head_dim] (what it writes) and `scratch.h`
    [tokens, hidden] (the trunk's output: the final-norm hidden states, the LM head's
    input and the draft head's features). The K/V cache planes `L{i}.k_cache` /
    `L{i}.v_cache` [pages, page_tokens, kv_heads, head_dim] are the programs'.

    A family with mixture-of-experts layers also has `expert_geometry()` (the manifest's
    `ExpertGeometry`; capture copies it into the manifest, whose rules check every expert
    launch against it).
    """

    @property
    def vision(self) -> VisionGeometry | None:
        """The vision tower an image prefill program records (families/vision.py)."""
        ...
    @property
    def vocab(self) -> int: ...
    @property
    def hidden(self) -> int: ...
    @property
    def layers(self) -> int: ...
    @property
    def heads(self) -> int: ...
    @property
    def kv_heads(self) -> int: ...
    @property
    def head_dim(self) -> int: ...
    @property
    def rms_eps(self) -> float:
        """The norm epsilon the learned draft head uses."""
        ...
    @property
    def ranks(self) -> int: ...
    @property
    def qkv_width(self) -> int: ...
    @property
    def head_rows(self) -> int:
        """LM-head rows of one rank (ceil(vocab / ranks))."""
        ...

    def weight_layout(self) -> dict[str, tuple[int, ...]]:
        """Weight buffer name -> one rank's shape, in declaration order (vectors are
        stored f32, matrices in the core's weight dtype)."""
        ...

    def weight_split(self, name: str) -> int | None:
        """The axis tensor-parallel ranks split weight `name` along, or None (replicated)."""
        ...

    def head_buffer(self) -> str:
        """The LM head's weight buffer of a single-rank core ([vocab, hidden])."""
        ...

    def declare_scratch(self, t: BufferTable, tokens: int, weight_dtype: str) -> None:
        """Declare the trunk's activation scratch for up to `tokens` packed rows (at least
        `scratch.qkv`, `scratch.attn` and `scratch.h`)."""
        ...

    def trunk(self, b: ProgramBuilder, p: Pass) -> None:
        """Record embedding, every layer and the final norm over `p`'s rows, leaving the
        final-norm hidden states in `scratch.h` ([p.tokens, hidden])."""
        ...
