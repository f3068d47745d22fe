"""Scripted token sources for tests: a byte-level tokenizer whose declared delimiters are
single special tokens, and every chunking of a scripted output into tokens.

A script is a sequence of `Special(marker)` items (one token each) and text segments.
Chunkings split the text segments into tokens: whole segments, every split of one segment
into two tokens, one character per token, and one UTF-8 byte per token (partial
characters). Ids 0..255 are the 256 single bytes, so any text is representable.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from functools import lru_cache

from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

from .pipeline import Frontend


@lru_cache(maxsize=1)
def _byte_chars() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character map (the ByteLevel alphabet)."""
    bs = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    cs = list(bs)
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs, strict=True)}


def _byte_level(text: str) -> str:
    chars = _byte_chars()
    return "".join(chars[b] for b in text.encode("utf-8"))


@dataclass(frozen=True, slots=True)
class Special:
    """A script item generated as one special token."""

    marker: str


Script = Sequence[Special | str]
Chunk = Special | str  # one token: a special, or the text of one ordinary token


class ScriptTokenizer:
    """A `tokenizers.Tokenizer` with byte ids 0..255, one id per ordinary piece, and one
    special token per marker.

    Args:
        specials: markers that become single special tokens (EOS included).
        pieces: texts that become single ordinary tokens.
    """

    def __init__(self, specials: Iterable[str], pieces: Iterable[str] = ()) -> None:
        chars = _byte_chars()
        vocab = {chars[b]: b for b in range(256)}
        for piece in pieces:
            key = _byte_level(piece)
            if key not in vocab:
                vocab[key] = len(vocab)
        tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
        tok.decoder = decoders.ByteLevel()
        tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in specials])
        self.tokenizer = tok
        self._vocab = vocab

    def piece_id(self, text: str) -> int:
        """Id of an ordinary piece (or a single byte)."""
        return self._vocab[_byte_level(text)]

    def special_id(self, marker: str) -> int:
        tid = self.tokenizer.token_to_id(marker)
        if tid is None:
            raise KeyError(marker)
        return tid

    def ids(self, chunks: Sequence[Chunk]) -> list[int]:
        """Token ids of a chunking; byte chunks are spelled as `bytes` of length one."""
        out = []
        for c in chunks:
            if isinstance(c, Special):
                out.append(self.special_id(c.marker))
            elif isinstance(c, bytes):
                out.append(self._vocab[_byte_chars()[c[0]]])
            else:
                out.append(self.piece_id(c))
        return out


def chunkings(script: Script) -> Iterator[tuple[str, list]]:
    """Every chunking of `script`: (name, chunks). Chunks are Special, str or 1-byte bytes."""
    texts = [i for i, item in enumerate(script) if isinstance(item, str) and item]

    def build(split: dict[int, list]) -> list:
        out: list = []
        for i, item in enumerate(script):
            if isinstance(item, Special):
                out.append(item)
            elif item:
                out.extend(split.get(i, [item]))
        return out

    yield "whole", build({})
    for i in texts:
        text = script[i]
        for j in range(1, len(text)):
            yield f"split[{i}:{j}]", build({i: [text[:j], text[j:]]})
    yield "chars", build({i: list(script[i]) for i in texts})
    yield "bytes", build({i: [bytes([b]) for b in script[i].encode()] for i in texts})


def script_tokenizer(scripts: Iterable[Script], specials: Iterable[str]) -> ScriptTokenizer:
    """A tokenizer holding every ordinary piece of every chunking of `scripts`."""
    pieces: list[str] = []
    for script in scripts:
        for _, chunks in chunkings(script):
            pieces.extend(c for c in chunks if isinstance(c, str))
    return ScriptTokenizer(specials, dict.fromkeys(pieces))


def counter_ids(prefix: str = "call_") -> Iterator[str]:
    """Deterministic call ids for comparing runs: call_0, call_1, ..."""
    n = 0
    while True:
        yield f"{prefix}{n}"
        n += 1


def drive(
    syntax,
    script: Script,
    *,
    specials: Iterable[str],
    eos: str = "<|eos|>",
    end: str = "eos",
    **pipeline_kwargs,
) -> Iterator[tuple[str, list, object]]:
    """Run `script` through a real `OutputPipeline` for every chunking.

    Args:
        syntax: the `FrontendSyntax`.
        script: the scripted output (without EOS).
        specials: markers that are single special tokens.
        eos: the EOS special token appended after the script when `end` is "eos".
        end: "eos" (feed EOS) or "length" (`finish("length")`).
        **pipeline_kwargs: passed to `Frontend.output_pipeline`.

    Yields:
        (chunking name, streamed deltas, final ChatResult).
    """
    st = script_tokenizer([script], [*specials, eos])
    frontend = Frontend(syntax, st.tokenizer, [st.special_id(eos)])
    for name, chunks in chunkings(script):
        ids = counter_ids()
        pipeline = frontend.output_pipeline(call_id=lambda ids=ids: next(ids), **pipeline_kwargs)
        deltas: list = []
        for tid in st.ids(chunks):
            deltas += pipeline.feed(tid)
            if pipeline.finished:
                break
        if not pipeline.finished:
            deltas += pipeline.feed(st.special_id(eos)) if end == "eos" else pipeline.finish(end)
        yield name, deltas, pipeline.result()
