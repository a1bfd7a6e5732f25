"""Byte tokenizer: fixed special ids, byte offset 3, lossless round trips."""

from __future__ import annotations

import pytest

from real.tokenizer import BOS, EOS, PAD, ByteTokenizer


def test_ids_and_round_trip():
    tok = ByteTokenizer()
    assert (tok.pad_id, tok.bos_id, tok.eos_id, tok.vocab_size) == (PAD, BOS, EOS, 259) == (0, 1, 2, 259)
    assert tok.encode("A7") == [1, ord("A") + 3, ord("7") + 3] == [1, 68, 58]
    assert tok.encode("A7", bos=False) == [68, 58]
    text = "héllo 7\n"
    assert tok.decode(tok.encode(text)) == text


def test_decode_skips_specials_and_replaces_bad_bytes():
    tok = ByteTokenizer()
    assert tok.decode([BOS, 68, PAD, EOS, 58]) == "A7"
    assert tok.decode([0xFF + 3, 68]) == "\ufffdA"


def test_decode_rejects_out_of_range_ids():
    with pytest.raises(ValueError, match="259"):
        ByteTokenizer().decode([259])
