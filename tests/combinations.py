"""Which answer combinations the template's tests render, computed from cookiecutter.json.

A question added to cookiecutter.json joins the combinations without any edit here.
"""

import itertools
import json
from collections.abc import Iterable, Mapping, Sequence
from math import prod
from pathlib import Path

Questions = Mapping[str, Sequence[str]]
Answers = dict[str, str]
Pair = tuple[tuple[str, str], tuple[str, str]]

# Every combination is rendered while there are at most this many; past it, a set
# in which every pair of answer values appears at least once.
MAX_RENDERS = 40


def choice_questions(cookiecutter_json: Path) -> dict[str, list[str]]:
    """The multiple-choice questions: list-valued keys that are neither private nor derived."""
    context = json.loads(cookiecutter_json.read_text())
    return {
        name: values
        for name, values in context.items()
        if isinstance(values, list)
        and not name.startswith("_")
        and not any("{{" in str(value) or "{%" in str(value) for value in values)
    }


def pairs_of(answers: Mapping[str, str]) -> set[Pair]:
    """Every pair of (question, value) that one set of answers holds, in question order."""
    items = sorted(answers.items())
    return set(itertools.combinations(items, 2))


def all_pairs(questions: Questions) -> set[Pair]:
    """Every pair of values of two different questions."""
    found: set[Pair] = set()
    for first, second in itertools.combinations(sorted(questions), 2):
        for a, b in itertools.product(questions[first], questions[second]):
            found.add(((first, a), (second, b)))
    return found


def all_combinations(questions: Questions) -> list[Answers]:
    names = list(questions)
    return [
        dict(zip(names, values, strict=True))
        for values in itertools.product(*(questions[name] for name in names))
    ]


def pairwise(questions: Questions) -> list[Answers]:
    """A small set of answers covering every pair of values (greedy, deterministic).

    Each new set of answers starts from the first pair not yet covered, then gives
    every other question the value that covers the most uncovered pairs with the
    answers already chosen (the first such value on a tie).
    """
    # The questions with most values first: their pairs are the hardest to cover.
    order = sorted(questions, key=lambda name: -len(questions[name]))
    uncovered = all_pairs(questions)
    chosen: list[Answers] = []
    while uncovered:
        (first, a), (second, b) = min(uncovered, key=lambda pair: _rank(pair, order, questions))
        answers = {first: a, second: b}
        for name in order:
            if name not in answers:
                answers[name] = max(
                    questions[name],
                    key=lambda value, name=name: _gain(answers, name, value, uncovered),
                )
        uncovered -= pairs_of(answers)
        chosen.append({name: answers[name] for name in questions})
    return chosen


def _rank(pair: Pair, order: list[str], questions: Questions) -> tuple[int, ...]:
    """Sort key for pairs: by question order, then by value order, as cookiecutter.json has it."""
    (first, a), (second, b) = pair
    return (
        order.index(first),
        order.index(second),
        questions[first].index(a),
        questions[second].index(b),
    )


def _gain(answers: Answers, name: str, value: str, uncovered: set[Pair]) -> int:
    """How many uncovered pairs the answers cover once `name` is given `value`."""
    return len(pairs_of({**answers, name: value}) & uncovered)


def covering_set(questions: Questions, max_renders: int = MAX_RENDERS) -> list[Answers]:
    """Every combination when that is at most max_renders renders, else a pairwise set."""
    if prod(len(values) for values in questions.values()) <= max_renders:
        return all_combinations(questions)
    return pairwise(questions)


def missing_values(questions: Questions, runs: Iterable[Mapping[str, str]]) -> dict[str, set[str]]:
    """Values of each question that no run answers with (empty sets left out)."""
    missing = {name: set(values) for name, values in questions.items()}
    for answers in runs:
        for name in missing:
            missing[name].discard(answers[name])
    return {name: values for name, values in missing.items() if values}


def case_id(answers: Mapping[str, str]) -> str:
    return "-".join(f"{name}={value}" for name, value in answers.items())
