"""Render the template and add the library's tests, for the CI jobs that run them under another
Python or on the lowest versions: `python tests/render_with_library_tests.py OUTPUT [key=value]...`
writes OUTPUT/<project_slug>, as `cookiecutter --no-input --output-dir OUTPUT . key=value` does."""

import sys
from pathlib import Path

from cookiecutter.generate import generate_context
from cookiecutter.main import cookiecutter
from cookiecutter.prompt import prompt_for_config

from helpers import REPO, Render, add_library_tests


def main(output: str, *given: str) -> None:
    answers = dict(answer.split("=", 1) for answer in given)
    project = Path(cookiecutter(str(REPO), no_input=True, extra_context=answers, output_dir=output))
    # The answers the render was made with, the derived ones filled in, as a replay file has them.
    context = generate_context(str(REPO / "cookiecutter.json"), extra_context=answers)
    added = add_library_tests(Render(project, {"cookiecutter": prompt_for_config(context, True)}))
    print(f"{project}: {len(added)} test files of the library added")


if __name__ == "__main__":
    main(*sys.argv[1:])
