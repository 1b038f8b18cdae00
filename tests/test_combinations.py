"""The computed answer combinations: every pair of values covered, every question read."""

import itertools
import json
from math import prod

import pytest

from combinations import (
    all_pairs,
    choice_questions,
    covering_set,
    missing_values,
    pairs_of,
    pairwise,
)
from helpers import COMBINATIONS, QUESTIONS

SHAPES = {
    "this-template": QUESTIONS,
    "with-a-logger": {**QUESTIONS, "logger": ["tensorboard", "csv", "mlflow", "wandb"]},
    "four-by-three": {name: ["x", "y", "z"] for name in "abcd"},
    "uneven": {"a": list("12345"), "b": ["yes", "no"], "c": list("1234"), "d": ["only"]},
    "seven-binary": {name: ["yes", "no"] for name in "abcdefg"},
}


def uncovered(questions, runs) -> set:
    covered = set().union(*(pairs_of(answers) for answers in runs))
    return all_pairs(questions) - covered


@pytest.mark.parametrize("questions", SHAPES.values(), ids=SHAPES.keys())
def test_pairwise_covers_every_pair(questions) -> None:
    runs = pairwise(questions)
    assert uncovered(questions, runs) == set()
    assert all(set(answers) == set(questions) for answers in runs)
    for answers in runs:
        for name, value in answers.items():
            assert value in questions[name]
    # Fewer renders than every combination, and no fewer than the two largest questions need.
    largest = sorted((len(values) for values in questions.values()), reverse=True)
    assert largest[0] * largest[1] <= len(runs) < prod(largest)


def test_pairwise_is_deterministic() -> None:
    assert pairwise(SHAPES["with-a-logger"]) == pairwise(SHAPES["with-a-logger"])


def test_every_combination_when_affordable() -> None:
    questions = {"a": ["1", "2", "3"], "b": ["yes", "no"], "c": ["on", "off"]}
    every = {tuple(values) for values in itertools.product(*questions.values())}
    runs = covering_set(questions, max_renders=12)
    assert sorted(tuple(answers.values()) for answers in runs) == sorted(every)
    # One render fewer allowed: the pairwise set instead.
    runs = covering_set(questions, max_renders=11)
    assert len(runs) < 12
    assert uncovered(questions, runs) == set()


def test_template_combinations_cover_every_pair() -> None:
    assert uncovered(QUESTIONS, COMBINATIONS.values()) == set()


def test_choice_questions_are_the_list_valued_answers(tmp_path) -> None:
    path = tmp_path / "cookiecutter.json"
    context = {
        "project_name": "Name",
        "dataset": ["digits", "mnist"],
        "flavour": ["{{ cookiecutter.project_name }}", "plain"],
        "_private": ["a", "b"],
        "__prompts__": {"dataset": {"__prompt__": "Dataset", "digits": "d", "mnist": "m"}},
    }
    path.write_text(json.dumps(context))
    assert choice_questions(path) == {"dataset": ["digits", "mnist"]}


def test_template_questions_are_read() -> None:
    # The four questions this template has had from the start; later ones add to them.
    assert {"python_version", "dataset", "license", "github_actions"} <= set(QUESTIONS)
    # The feature questions, default yes; test_template_combinations_cover_every_pair shows
    # each answered both ways with every value of every other question.
    for feature in ("deploy", "sweep", "cluster"):
        assert QUESTIONS[feature] == ["yes", "no"]


def test_missing_values_names_what_no_run_answers() -> None:
    questions = {"a": ["1", "2"], "b": ["yes", "no"]}
    assert missing_values(questions, [{"a": "1", "b": "yes"}, {"a": "1", "b": "no"}]) == {
        "a": {"2"}
    }
