"""Build a HF `tokenizers` JSON for a GPT-2 style byte-level BPE from its vocab and merges.

The recipe (DESIGN §8) matches transformers' GGUF tokenizer id for id on SmolLM2:
pre-tokenizer `Sequence([Digits(individual_digits=True), ByteLevel(add_prefix_space=False,
use_regex=True)])`, ByteLevel decoder, and the CONTROL tokens as special added tokens.
"""

from __future__ import annotations

from collections.abc import Sequence


def bpe_tokenizer_json(
    tokens: Sequence[str],
    merges: Sequence[str],
    special_ids: Sequence[int],
    filler_vocab_size: int | None = None,
) -> str:
    """Return `tokenizer.json` text for a byte-level BPE.

    Args:
        tokens: id -> token string (byte-level alphabet), as in `tokenizer.ggml.tokens`.
        merges: "left right" strings in rank order, as in `tokenizer.ggml.merges`.
        special_ids: ids registered as special added tokens (never split, skippable).
        filler_vocab_size: when larger than `len(tokens)`, ids `len(tokens)..n-1` are added
            to the BPE vocab as `<|filler_{id}|>`: no merge produces them, so encoding never
            emits them, but they exist for decoding and for vocab-sized tables.

    Returns:
        The JSON text accepted by `tokenizers.Tokenizer.from_str`.
    """
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors

    vocab = {tok: i for i, tok in enumerate(tokens)}
    if filler_vocab_size is not None:
        for i in range(len(tokens), filler_vocab_size):
            vocab[f"<|filler_{i}|>"] = i
    pairs = [tuple(m.split(" ", 1)) for m in merges]
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=pairs, fuse_unk=False))
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        ]
    )
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    tokenizer.add_special_tokens(
        [AddedToken(tokens[i], special=True, normalized=False) for i in special_ids]
    )
    return tokenizer.to_str()
