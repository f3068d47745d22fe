"""IncrementalDetokenizer with ByteLevelPieces (byte-level BPE: window decodes done on
bytes) emits exactly what the tokenizer-decoding path emits, piece for piece, on random
id sequences of a byte-level test tokenizer and of SmolLM2's real tokenizer (partial
UTF-8 pieces, special tokens, invalid bytes, ids without known bytes)."""

from __future__ import annotations

import random

import pytest
from helios_serve.frontend.detokenizer import IncrementalDetokenizer
from helios_serve.frontend.testing import ScriptTokenizer
from helios_serve.frontend.vocab import ByteLevelPieces


def _both(tokenizer, prompt: list[int], ids: list[int],
          pieces: ByteLevelPieces | None = None) -> tuple[list[str], list[str]]:
    """(bytes path, tokenizer path) pieces; `pieces`: the tokenizer's table, built once
    per tokenizer as OutputPipeline builds it (ByteLevelPieces.of reads the tokenizer's
    whole JSON: 60 ms for SmolLM2's)."""
    pieces = pieces or ByteLevelPieces.of(tokenizer)
    assert pieces is not None
    fast = IncrementalDetokenizer(tokenizer, prompt, pieces)
    slow = IncrementalDetokenizer(tokenizer, prompt)
    out_fast = [fast.push(i) for i in ids] + [fast.flush()]
    out_slow = [slow.push(i) for i in ids] + [slow.flush()]
    return out_fast, out_slow


def test_byte_tokens_split_characters_and_invalid_bytes_match_the_tokenizer():
    st = ScriptTokenizer(["<|eos|>", "<think>"], ["Hello", " wörld", "👋", "é"])
    rng = random.Random(3)
    vocab = st.tokenizer.get_vocab_size()
    for trial in range(300):
        ids = [rng.randrange(vocab) for _ in range(rng.randrange(1, 40))]
        if trial % 3 == 0:  # mostly valid text: whole characters, some split over tokens
            ids = [b for ch in rng.choices("ab é€👋\n", k=20) for b in ch.encode()]
        prompt = [rng.randrange(vocab) for _ in range(rng.randrange(0, 8))]
        fast, slow = _both(st.tokenizer, prompt, ids)
        assert fast == slow, (prompt, ids)
        if trial % 3 == 0:  # valid UTF-8: the pieces are the whole text
            assert "".join(fast) == st.tokenizer.decode(ids, skip_special_tokens=False)


def test_the_emoji_split_over_byte_tokens_waits_for_its_last_byte():
    st = ScriptTokenizer(["<|eos|>"])
    fast, _ = _both(st.tokenizer, [], list("Hi 👋!".encode()))
    assert fast == ["H", "i", " ", "", "", "", "👋", "!", ""]


def test_a_tokenizer_whose_decoder_is_not_byte_level_has_no_pieces():
    from tokenizers import Tokenizer, decoders, models

    tok = Tokenizer(models.WordLevel({"a": 0, "[UNK]": 1}, unk_token="[UNK]"))
    tok.decoder = decoders.WordPiece()
    assert ByteLevelPieces.of(tok) is None


@pytest.fixture(scope="module")
def smollm2_tokenizer(smollm2_checkpoint):
    from helios_tools.frontend_assets import load_tokenizer

    return load_tokenizer(smollm2_checkpoint.tokenizer_json)


def test_smollm2_random_and_text_sequences_match_the_tokenizer(smollm2_tokenizer):
    tok = smollm2_tokenizer
    rng = random.Random(11)
    vocab = tok.get_vocab_size()
    text = "Grüße, 世界! 👋🏽 naïve café — “quotes” \n\tcode: x = {'a': 1}\n"
    text_ids = tok.encode(text * 3, add_special_tokens=False).ids
    pieces = ByteLevelPieces.of(tok)
    for trial in range(400):
        if trial % 2:
            ids = [rng.randrange(vocab) for _ in range(rng.randrange(1, 60))]
        else:
            start = rng.randrange(len(text_ids))
            ids = text_ids[start:start + rng.randrange(1, 80)]
            ids += [rng.randrange(20)] if trial % 4 == 0 else []  # a special token
        prompt = [rng.randrange(vocab) for _ in range(rng.randrange(0, 8))]
        fast, slow = _both(tok, prompt, ids, pieces)
        assert fast == slow, (prompt, ids)


def test_whole_character_tokens_take_the_per_token_path_and_split_ones_the_window():
    """Streaming text: each whole-character id returns its cached text without a window
    decode, a character split over ids waits for its last byte, a literal U+FFFD piece is
    held as the window path holds it, an invalid byte goes through the tokenizer and the
    valid text after it is still the tokenizer's. Same pieces as the tokenizer path."""
    st = ScriptTokenizer(["<|eos|>"], ["Hello", " wörld", "👋", "\ufffd"])
    tok = st.tokenizer
    pieces = ByteLevelPieces.of(tok)
    vocab = tok.get_vocab()
    word, world, wave, fffd = (vocab[t] for t in ("Hello", "Ġw" + "Ã¶" + "rld",
                                                   "ðŁĳĭ", "ï¿½"))
    split = list("👋".encode())  # byte-level: one id per byte
    invalid = [0xFF]
    cases = [
        [word, world, wave, word],
        [word, *split, world],
        [fffd, word, fffd],
        [word, *invalid, world, word, *split[:2], world],
    ]
    for ids in cases:
        fast, slow = _both(tok, [], ids, pieces)
        assert fast == slow, ids
    fast, _ = _both(tok, [], [word, world, wave, word], pieces)
    assert fast == ["Hello", " wörld", "👋", "Hello", ""]
    assert pieces.text_alone(split[0]) is None and pieces.text_alone(wave) == "👋"
