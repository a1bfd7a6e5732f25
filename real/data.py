"""GSM8K-style math word problems generated from a seed, and rule-based rewards.

``python -m real.data --n 256 --seed 0 --out real/data/gsm8k_style_256.jsonl`` writes the
shipped file; regenerating it gives identical bytes.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from hetrl.errors import require

SHIPPED = Path(__file__).with_name("data") / "gsm8k_style_256.jsonl"

_NAMES = ("Ava", "Ben", "Cleo", "Dev", "Emma", "Finn", "Gita", "Hugo", "Ines", "Jon", "Kai", "Lena")
_ITEMS = ("apples", "pencils", "stickers", "books", "oranges", "cards")


@dataclass(frozen=True)
class MathProblem:
    """A word problem and its integer answer."""

    question: str
    answer: int


def _shopping(rng: random.Random) -> MathProblem:
    name, item = rng.choice(_NAMES), rng.choice(_ITEMS)
    count, price = rng.randint(2, 9), rng.randint(1, 6)
    bill = rng.choice([b for b in (10, 20, 50, 100) if b >= count * price])
    return MathProblem(f"{name} buys {count} {item} at {price} dollars each and pays with a "
                       f"{bill}-dollar bill. How many dollars of change does {name} get?",
                       bill - count * price)


def _ages(rng: random.Random) -> MathProblem:
    name = rng.choice(_NAMES)
    age, gap, years = rng.randint(3, 15), rng.randint(1, 9), rng.randint(1, 10)
    return MathProblem(f"{name} is {age} years old. {name}'s cousin is {gap} years older. "
                       f"How old will the cousin be in {years} years?", age + gap + years)


def _rates(rng: random.Random) -> MathProblem:
    per_hour, hours = rng.randint(2, 12), rng.randint(2, 8)
    return MathProblem(f"A machine makes {per_hour} toys per hour. How many toys does it make "
                       f"in {hours} hours?", per_hour * hours)


def _sharing(rng: random.Random) -> MathProblem:
    name, item = rng.choice(_NAMES), rng.choice(_ITEMS)
    friends, each = rng.randint(2, 6), rng.randint(2, 9)
    return MathProblem(f"{name} has {friends * each} {item} and shares them equally among "
                       f"{friends} friends. How many {item} does each friend get?", each)


def _two_step(rng: random.Random) -> MathProblem:
    name = rng.choice(_NAMES)
    start, won = rng.randint(5, 30), rng.randint(1, 20)
    lost = rng.randint(1, start + won)
    return MathProblem(f"{name} had {start} marbles, won {won} more and then lost {lost}. "
                       f"How many marbles does {name} have now?", start + won - lost)


TEMPLATES: tuple[Callable[[random.Random], MathProblem], ...] = (
    _shopping, _ages, _rates, _sharing, _two_step)


def generate_problems(n: int, seed: int) -> list[MathProblem]:
    """``n`` problems drawn from :data:`TEMPLATES`; the same ``seed`` gives the same list."""
    require(isinstance(n, int) and n >= 0, "n", n, "must be an integer >= 0")
    rng = random.Random(seed)
    return [rng.choice(TEMPLATES)(rng) for _ in range(n)]


def write_jsonl(problems: list[MathProblem], path: str | Path) -> None:
    """Write one ``{"question", "answer"}`` object a line, atomically (temp file + rename)."""
    path = Path(path)
    text = "".join(json.dumps({"question": p.question, "answer": p.answer}) + "\n"
                   for p in problems)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, 0o644)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


def read_jsonl(path: str | Path) -> list[MathProblem]:
    """Problems written by :func:`write_jsonl`."""
    out = []
    for number, line in enumerate(Path(path).read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            out.append(MathProblem(str(row["question"]), int(row["answer"])))
        except (json.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"{path}:{number} = {line[:60]!r}: not a problem line ({exc})") from None
    return out


def prompt_text(problem: MathProblem) -> str:
    """The text the policy continues: ``"Q: <question>\\nA:"``."""
    return f"Q: {problem.question}\nA:"


_INTEGER = re.compile(r"-?\d[\d,]*")


def math_reward(response: str, problem: MathProblem) -> float:
    """1.0 if the last integer in ``response`` equals the answer; else 0.1 (format score) if
    any integer appears; else 0.0. Thousands separators (``1,000``) are accepted."""
    found = _INTEGER.findall(response)
    if not found:
        return 0.0
    return 1.0 if int(found[-1].replace(",", "")) == problem.answer else 0.1


def target_byte_reward(response: str, problem: MathProblem) -> float:
    """Fraction of the response's characters that are ``"7"`` (0.0 for an empty response).

    Ignores the problem: a trivially learnable test reward that a few RL iterations visibly
    raise, even for a tiny random model.
    """
    return response.count("7") / len(response) if response else 0.0


REWARDS: dict[str, Callable[[str, MathProblem], float]] = {
    "math": math_reward,
    "target-byte": target_byte_reward,
}


def reward_fn(name: str) -> Callable[[str, MathProblem], float]:
    """The reward registered as ``name`` in :data:`REWARDS`."""
    require(name in REWARDS, "reward", name, f"unknown reward; known: {', '.join(REWARDS)}")
    return REWARDS[name]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m real.data", description=__doc__.split("\n")[0])
    parser.add_argument("--n", type=int, default=256, help="number of problems")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=SHIPPED, help="JSONL file to write")
    args = parser.parse_args(argv)
    write_jsonl(generate_problems(args.n, args.seed), args.out)


if __name__ == "__main__":
    main()
