"""Convert a SentencePiece BPE vocabulary (GGUF `tokenizer.ggml.model == "llama"`) to a HF
`tokenizers` JSON.

SentencePiece BPE encodes by repeatedly merging the adjacent pair whose merged piece has
the highest score; a `tokenizers` BPE merges by rank. Ranking every split of every piece
into two pieces of the vocabulary by the merged piece's score (highest first) gives the
same merges (transformers' `SentencePieceExtractor` builds its merges the same way).
Around the BPE:

- normalizer: spaces become U+2581 ("▁"); a dummy prefix space only where the GGUF asks
  for one (`tokenizer.ggml.add_space_prefix`; Gemma 3: no).
- byte fallback: characters without a piece become their `<0xNN>` byte pieces.
- control pieces (`<bos>`, `<start_of_turn>`, ...) are special added tokens and
  user-defined pieces are added tokens: both are matched whole in the raw text before the
  BPE runs, as llama.cpp's tokenizer partitions them out.
- decoder: "▁" back to spaces, byte pieces back to bytes.
"""

from __future__ import annotations

from collections.abc import Sequence

from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers

from .errors import MissingTokenizerError

# GGUF tokenizer.ggml.token_type values (llama.cpp's llama_token_type).
TOKEN_NORMAL, TOKEN_UNKNOWN, TOKEN_CONTROL, TOKEN_USER_DEFINED, TOKEN_UNUSED, TOKEN_BYTE = (
    1, 2, 3, 4, 5, 6)
_SPACE = "\u2581"


def spm_merges(tokens: Sequence[str], scores: Sequence[float],
               token_types: Sequence[int]) -> list[tuple[str, str]]:
    """The BPE merges of a SentencePiece vocabulary: every split (left, right) of a normal
    piece into two pieces of the vocabulary, highest merged-piece score first (ties: the
    lower merged-piece id first, then the lower left and right ids).

    Args:
        tokens: id -> piece text.
        scores: id -> SentencePiece score (higher merges first).
        token_types: id -> GGUF token type; only normal pieces are merge results or parts.
    """
    vocab = {t: i for i, t in enumerate(tokens) if token_types[i] == TOKEN_NORMAL}
    found = []
    for piece, merged in vocab.items():
        for cut in range(1, len(piece)):
            left, right = piece[:cut], piece[cut:]
            lid, rid = vocab.get(left), vocab.get(right)
            if lid is not None and rid is not None:
                found.append((-float(scores[merged]), merged, lid, rid, left, right))
    found.sort()
    return [(left, right) for *_, left, right in found]


def spm_tokenizer_json(tokens: Sequence[str], scores: Sequence[float],
                       token_types: Sequence[int], unk_id: int,
                       add_space_prefix: bool) -> str:
    """`tokenizer.json` text for a SentencePiece BPE vocabulary (module docstring).

    Args:
        tokens: id -> piece text (`tokenizer.ggml.tokens`).
        scores: id -> score (`tokenizer.ggml.scores`).
        token_types: id -> GGUF token type (`tokenizer.ggml.token_type`).
        unk_id: the unknown piece's id.
        add_space_prefix: prepend "▁" to the text (SentencePiece's dummy prefix).

    Raises:
        MissingTokenizerError: the three lists differ in length, or `unk_id` is outside
            the vocabulary.
    """
    if not len(tokens) == len(scores) == len(token_types):
        raise MissingTokenizerError(
            f"SentencePiece vocabulary of {len(tokens)} pieces has {len(scores)} scores and "
            f"{len(token_types)} token types")
    if not 0 <= unk_id < len(tokens):
        raise MissingTokenizerError(f"unknown-token id {unk_id} is outside the vocabulary of "
                                    f"{len(tokens)} pieces")
    vocab = {t: i for i, t in enumerate(tokens)}
    model = models.BPE(vocab=vocab, merges=spm_merges(tokens, scores, token_types),
                       unk_token=tokens[unk_id], fuse_unk=True, byte_fallback=True)
    tokenizer = Tokenizer(model)
    steps = [normalizers.Replace(" ", _SPACE)]
    if add_space_prefix:
        steps.insert(0, normalizers.Prepend(_SPACE))
    tokenizer.normalizer = normalizers.Sequence(steps)
    tokenizer.decoder = decoders.Sequence(
        [decoders.Replace(_SPACE, " "), decoders.ByteFallback(), decoders.Fuse()])
    special = [AddedToken(tokens[i], special=True, normalized=False)
               for i, kind in enumerate(token_types) if kind == TOKEN_CONTROL or i == unk_id]
    user = [AddedToken(tokens[i], special=False, normalized=False)
            for i, kind in enumerate(token_types) if kind == TOKEN_USER_DEFINED]
    tokenizer.add_special_tokens(special)
    tokenizer.add_tokens(user)
    return tokenizer.to_str()
