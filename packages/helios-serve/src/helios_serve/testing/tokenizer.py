"""A tiny byte-level BPE tokenizer whose multi-character tokens a test chooses.

Every byte has its own token, so any text encodes (prompts come out one token per
byte); the extra pieces exist so a scripted output can be written as a list of chosen
token strings ("Look", " there") and decode exactly as a real byte-level tokenizer
would. Special tokens are single ids and delimit chat messages.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from tokenizers import Tokenizer, decoders, models, pre_tokenizers

SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
EOS_ID = 2  # <|im_end|>

# A ChatML template (the SmolLM2 shape) for tests.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

DEFAULT_PIECES = (
    "Letters",
    ":",
    " H",
    "IJ",
    "K",
    "LM",
    "NOP",
    " KL",
    "MN",
    "OP",
    "Look",
    " there",
    " t",
    "here",
    "Hello",
    " Hello",
    ",",
    " world",
    "!",
    " The",
    " capital",
    " of",
    " France",
    " is",
    " Paris",
    ".",
    "\u00e9",
    " caf",
    "\u00e9\u00e9",
)


def _byte_level(text: str) -> str:
    table = _bytes_to_unicode()
    return "".join(table[b] for b in text.encode("utf-8"))


def _bytes_to_unicode() -> dict[int, str]:
    # GPT-2's reversible byte -> printable character map (what ByteLevel uses).
    bs = (
        list(range(ord("!"), ord("~") + 1))
        + list(range(ord("\u00a1"), ord("\u00ac") + 1))
        + list(range(ord("\u00ae"), ord("\u00ff") + 1))
    )
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, (chr(c) for c in cs), strict=True))


class TinyTokenizer:
    """Wraps a HF `tokenizers.Tokenizer`; `ids(...)` spells scripted outputs.

    Ids: 0..2 special tokens, 3..258 the 256 bytes, then the chosen pieces in order.
    """

    def __init__(self, pieces: Iterable[str] = DEFAULT_PIECES) -> None:
        table = _bytes_to_unicode()
        vocab: dict[str, int] = {tok: i for i, tok in enumerate(SPECIAL_TOKENS)}
        for b in range(256):
            vocab[table[b]] = len(vocab)
        for piece in pieces:
            vocab.setdefault(_byte_level(piece), len(vocab))
        tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
        tok.decoder = decoders.ByteLevel()
        tok.add_special_tokens(list(SPECIAL_TOKENS))
        self.tokenizer = tok
        self.vocab = vocab

    @property
    def vocab_size(self) -> int:
        return len(self.vocab)

    def to_json(self) -> str:
        return self.tokenizer.to_str()

    def ids(self, pieces: Sequence[str]) -> list[int]:
        """The ids of the given pieces (each must be a special token, a byte or a piece)."""
        out = []
        for piece in pieces:
            key = piece if piece in SPECIAL_TOKENS else _byte_level(piece)
            if key not in self.vocab:
                raise KeyError(f"{piece!r} is not one token of the tiny tokenizer")
            out.append(self.vocab[key])
        return out

    def byte_ids(self, data: bytes) -> list[int]:
        """One id per byte (for partial UTF-8 scripts)."""
        table = _bytes_to_unicode()
        return [self.vocab[table[b]] for b in data]

    def decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=False)
