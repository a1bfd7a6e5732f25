"""A byte-level tokenizer: no vocabulary file, so the tiny models need nothing downloaded."""

from __future__ import annotations

from dataclasses import dataclass

PAD = 0
BOS = 1
EOS = 2
SPECIALS = 3


@dataclass(frozen=True)
class ByteTokenizer:
    """Ids: PAD=0, BOS=1, EOS=2 and byte ``b`` -> ``b + 3`` (UTF-8 bytes); 259 ids in all."""

    pad_id: int = PAD
    bos_id: int = BOS
    eos_id: int = EOS
    vocab_size: int = SPECIALS + 256

    def encode(self, text: str, bos: bool = True) -> list[int]:
        """The UTF-8 bytes of ``text`` as ids, after BOS when ``bos``."""
        ids = [b + SPECIALS for b in text.encode("utf-8")]
        return [self.bos_id, *ids] if bos else ids

    def decode(self, ids: list[int]) -> str:
        """Text of the byte ids; special ids are skipped, invalid UTF-8 becomes U+FFFD."""
        for i in ids:
            if not 0 <= i < self.vocab_size:
                raise ValueError(f"ids = {i!r}: must be in [0, {self.vocab_size})")
        return bytes(i - SPECIALS for i in ids if i >= SPECIALS).decode("utf-8", errors="replace")
