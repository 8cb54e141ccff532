"""Text-side helpers of the HTTP API: stop sequences over streamed text, and each token's bytes for
logprobs."""

from __future__ import annotations

from functools import lru_cache


class StopText:
    """Finds the first stop sequence in text that arrives piece by piece. feed() returns the text
    that is safe to show and whether a stop sequence was reached (the text before it is shown;
    the sequence itself is not, as OpenAI does). Up to len(longest stop) - 1 characters are held
    back, since they may be the start of a stop sequence; flush() gives them at the end."""

    def __init__(self, stops: list[str]):
        self.stops = stops
        self.hold = max((len(s) for s in stops), default=1) - 1
        self.pending = ""  # text not shown yet: it may begin a stop sequence
        self.stopped = False

    def feed(self, piece: str) -> str:
        if self.stopped:
            return ""
        if not self.stops:
            return piece
        # only `pending` + piece can hold a match: everything shown before was checked with
        # `hold` characters of look-ahead
        text = self.pending + piece
        hits = [i for i in (text.find(s) for s in self.stops) if i >= 0]
        if hits:
            self.stopped = True
            self.pending = ""
            return text[: min(hits)]
        cut = max(len(text) - self.hold, 0)
        self.pending = text[cut:]
        return text[:cut]

    def flush(self) -> str:
        out, self.pending = ("" if self.stopped else self.pending), ""
        return out


def token_bytes(tokenizer):
    """A function: token id -> the bytes the token stands for (OpenAI's logprobs give a token as a
    string and as bytes, since a token may be part of a UTF-8 character). Byte-level BPE
    vocabularies (GPT-2's, SmolLM2's, Qwen's) spell bytes as characters; SentencePiece ones
    (Gemma's) have <0xNN> byte tokens and '▁' for a space; anything else is decoded."""
    from kwker.loading.tokenizer_classes import bytes_to_unicode

    byte_of = {c: b for b, c in bytes_to_unicode().items()}
    decoder = getattr(getattr(tokenizer, "backend_tokenizer", None), "decoder", None)
    byte_level = type(decoder).__name__ == "ByteLevel"

    @lru_cache(maxsize=65536)
    def of(token: int) -> bytes:
        piece = tokenizer.convert_ids_to_tokens(token)
        if isinstance(piece, str):
            if byte_level and all(c in byte_of for c in piece):
                return bytes(byte_of[c] for c in piece)
            if len(piece) == 6 and piece.startswith("<0x") and piece.endswith(">"):
                return bytes([int(piece[3:5], 16)])
            if not byte_level and "\u2581" in piece:  # SentencePiece's word start: a space
                return piece.replace("\u2581", " ").encode()
        return tokenizer.decode([token], skip_special_tokens=False).encode()

    return of
