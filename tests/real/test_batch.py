"""RolloutBatch: right padding and masks by hand, shards, micro-batches and their weights."""

from __future__ import annotations

import pytest
import torch

from real.engines.base import make_batch, select_rows, split_indices, token_weights


def test_make_batch_by_hand():
    b = make_batch([[1, 10, 11], [1, 12]], [[20, 2], [21, 22, 23, 2]], pad=0)
    assert b.input_ids.tolist() == [[1, 10, 11, 20, 2, 0], [1, 12, 21, 22, 23, 2]]
    assert b.attention_mask.tolist() == [[1, 1, 1, 1, 1, 0], [1, 1, 1, 1, 1, 1]]
    assert b.response_mask.tolist() == [[0, 0, 0, 1, 1, 0], [0, 0, 1, 1, 1, 1]]
    assert b.response_mask.dtype == torch.float32
    assert b.position_ids.tolist() == [list(range(6))] * 2
    assert b.prompt_lens.tolist() == [3, 2] and b.lengths.tolist() == [5, 6]
    assert (b.size, b.num_response_tokens) == (2, 6)


def test_select_split_and_to():
    b = make_batch([[1, 5]] * 5, [[6] * k for k in range(1, 6)])
    sub = b.select([4, 0])
    assert sub.lengths.tolist() == [7, 3] and sub.input_ids.shape == (2, 7)
    parts = b.split(2)
    assert [p.lengths.tolist() for p in parts] == [[3, 4, 5], [6, 7]]
    assert b.to("cpu").input_ids is not None
    assert split_indices(7, 3) == [[0, 1, 2], [3, 4], [5, 6]]
    extras = {"advantages": torch.arange(5.0)[:, None].expand(5, 7)}
    assert select_rows(extras, [4, 0])["advantages"][:, 0].tolist() == [4.0, 0.0]


def test_token_weights_sum_token_means_to_the_batch_mean():
    b = make_batch([[1, 5]] * 3, [[6], [6, 6], [6, 6, 6]])
    parts = b.split(2)                     # 3 and 3 response tokens of 6
    assert token_weights(parts) == [0.5, 0.5]
    assert token_weights([b.select([0]), b.select([1, 2])]) == [1 / 6, 5 / 6]
    empty = make_batch([[1]] * 2, [[], []])
    assert token_weights(empty.split(2)) == [0.5, 0.5]


def test_errors():
    with pytest.raises(ValueError, match="responses = 1"):
        make_batch([[1], [1]], [[2]])
    with pytest.raises(ValueError, match=r"prompts\[1\]"):
        make_batch([[1], []], [[2], [2]])
    b = make_batch([[1]] * 2, [[2], [2]])
    with pytest.raises(ValueError, match="n = 3"):
        b.split(3)
    with pytest.raises(ValueError, match="indices"):
        b.select([2])
