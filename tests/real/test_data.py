"""Generated word problems: deterministic, answers re-derived from the questions, rewards."""

from __future__ import annotations

import re

import pytest

from real.data import (
    REWARDS,
    SHIPPED,
    MathProblem,
    generate_problems,
    main,
    math_reward,
    prompt_text,
    read_jsonl,
    reward_fn,
    target_byte_reward,
    write_jsonl,
)


def _derive(question: str) -> int:
    """The answer from the numbers in the question, by template phrase."""
    a = [int(x) for x in re.findall(r"\d+", question)]
    if "change" in question:
        return a[2] - a[0] * a[1]
    if "years old" in question:
        return sum(a)
    if "per hour" in question:
        return a[0] * a[1]
    if "equally" in question:
        assert a[0] % a[1] == 0
        return a[0] // a[1]
    if "marbles" in question:
        return a[0] + a[1] - a[2]
    raise AssertionError(question)


def test_generation_is_deterministic_and_answers_are_right():
    problems = generate_problems(256, seed=0)
    assert problems == generate_problems(256, seed=0)
    assert problems != generate_problems(256, seed=1)
    for p in problems:
        assert p.answer == _derive(p.question) >= 0
    kinds = {next(k for k in ("change", "years old", "per hour", "equally", "marbles")
                  if k in p.question) for p in problems}
    assert len(kinds) == 5


def test_shipped_file_regenerates_identically(tmp_path):
    out = tmp_path / "regen.jsonl"
    main(["--n", "256", "--seed", "0", "--out", str(out)])
    assert out.read_bytes() == SHIPPED.read_bytes()
    assert read_jsonl(SHIPPED) == generate_problems(256, seed=0)


def test_write_is_atomic_and_round_trips(tmp_path):
    path = tmp_path / "p.jsonl"
    problems = generate_problems(5, seed=3)
    write_jsonl(problems, path)
    assert read_jsonl(path) == problems
    assert [f.name for f in tmp_path.iterdir()] == ["p.jsonl"]


def test_read_rejects_bad_lines(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"question": "q", "answer": 1}\n{"question": "q"}\n')
    with pytest.raises(ValueError, match="bad.jsonl:2"):
        read_jsonl(path)


def test_generate_rejects_negative_n():
    with pytest.raises(ValueError, match="n = -1"):
        generate_problems(-1, seed=0)


def test_prompt_text():
    assert prompt_text(MathProblem("What is 2 + 3?", 5)) == "Q: What is 2 + 3?\nA:"


def test_math_reward():
    p = MathProblem("q", 1200)
    assert math_reward("It is 3, no: 1200", p) == 1.0
    assert math_reward("about 1,200", p) == 1.0
    assert math_reward("1200 or 5", p) == 0.1          # last integer counts
    assert math_reward("no idea", p) == 0.0
    assert math_reward("-4", MathProblem("q", -4)) == 1.0


def test_target_byte_reward_and_registry():
    p = MathProblem("q", 0)
    assert target_byte_reward("7a77", p) == 0.75
    assert target_byte_reward("", p) == 0.0
    assert REWARDS["target-byte"] is target_byte_reward and reward_fn("math") is math_reward
    with pytest.raises(ValueError, match="unknown reward"):
        reward_fn("nope")


def test_tiny_presets_prompt_lengths_match_the_shipped_problems():
    """The tiny workloads' prompt length distribution is the shipped set's under the tokenizer."""
    from hetrl.spec.presets import TINY_PROMPT_LENGTH
    from real.data import SHIPPED, prompt_text, read_jsonl
    from real.tokenizer import ByteTokenizer

    lengths = [len(ByteTokenizer().encode(prompt_text(p))) for p in read_jsonl(SHIPPED)]
    assert (min(lengths), max(lengths)) == (TINY_PROMPT_LENGTH.min, TINY_PROMPT_LENGTH.max)
    assert sum(lengths) / len(lengths) == pytest.approx(TINY_PROMPT_LENGTH.mean, abs=0.05)
