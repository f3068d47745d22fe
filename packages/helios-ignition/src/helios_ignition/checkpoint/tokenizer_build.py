"""Build a HF `tokenizers` JSON for a GPT-2 style byte-level BPE from its vocab and merges.

The pre-tokenizer is chosen by GGUF's `tokenizer.ggml.pre`. The SmolLM2 recipe
("smollm") matches transformers' GGUF tokenizer id for id on SmolLM2:
pre-tokenizer `Sequence([Digits(individual_digits=True), ByteLevel(add_prefix_space=False,
use_regex=True)])`, ByteLevel decoder, and the CONTROL tokens as special added tokens.
"""

from __future__ import annotations

from collections.abc import Sequence

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, processors

from .errors import MissingTokenizerError

# Llama 3's split regex (its tokenizer.json), applied before a regex-free ByteLevel.
_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
    r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)


def _pre_tokenizer(pre: str):
    """Pre-tokenizer for a `tokenizer.ggml.pre` value; unknown values are refused, not guessed."""

    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    if pre == "smollm":  # verified id for id against transformers
        return pre_tokenizers.Sequence(
            [pre_tokenizers.Digits(individual_digits=True), byte_level]
        )
    if pre in ("gpt2", "gpt-2", "default"):  # gpt-2: llama.cpp's name for GPT-2's split
        return byte_level
    if pre == "llama-bpe":  # from Llama 3's tokenizer.json; not checked against a real file here
        return pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(Regex(_LLAMA3_SPLIT), behavior="isolated", invert=False),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
            ]
        )
    raise MissingTokenizerError(
        f"unsupported tokenizer.ggml.pre {pre!r}; known: default, gpt-2, gpt2, llama-bpe, "
        "smollm"
    )


def bpe_tokenizer_json(
    tokens: Sequence[str],
    merges: Sequence[str],
    special_ids: Sequence[int],
    filler_vocab_size: int | None = None,
    pre: str = "smollm",
    plain_ids: Sequence[int] = (),
) -> str:
    """Return `tokenizer.json` text for a byte-level BPE.

    Args:
        tokens: id -> token string (byte-level alphabet), as in `tokenizer.ggml.tokens`.
        merges: "left right" strings in rank order, as in `tokenizer.ggml.merges`.
        special_ids: ids registered as special added tokens (never split, skippable).
        filler_vocab_size: when larger than `len(tokens)`, ids `len(tokens)..n-1` are added
            to the BPE vocab as `<|filler_{id}|>`: no merge produces them, so encoding never
            emits them, but they exist for decoding and for vocab-sized tables.
        pre: the GGUF `tokenizer.ggml.pre` name selecting the pre-tokenizer.
        plain_ids: ids registered as plain (not special) added tokens: matched whole
            before the BPE runs, kept when special tokens are skipped in decoding.

    Returns:
        The JSON text accepted by `tokenizers.Tokenizer.from_str`.

    Raises:
        MissingTokenizerError: `pre` names a pre-tokenizer this builder does not know.
    """

    vocab = {tok: i for i, tok in enumerate(tokens)}
    if filler_vocab_size is not None:
        for i in range(len(tokens), filler_vocab_size):
            vocab[f"<|filler_{i}|>"] = i
    pairs = [tuple(m.split(" ", 1)) for m in merges]
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=pairs, fuse_unk=False))
    tokenizer.pre_tokenizer = _pre_tokenizer(pre)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    tokenizer.add_special_tokens(
        [AddedToken(tokens[i], special=True, normalized=False) for i in special_ids]
    )
    if plain_ids:
        tokenizer.add_tokens(
            [AddedToken(tokens[i], special=False, normalized=False) for i in plain_ids])
    return tokenizer.to_str()
