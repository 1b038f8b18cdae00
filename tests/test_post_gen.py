"""The post-generation hook can run again on its own output and change nothing."""

import pytest
from cookiecutter.hooks import run_script_with_context

from helpers import CASES, REPO, render, tree


@pytest.mark.parametrize("case", CASES)
def test_post_gen_hook_is_idempotent(tmp_path, case: str) -> None:
    rendered = render(tmp_path, **CASES[case])
    before = tree(rendered.path)
    # Raises FailedHookException if the hook exits non-zero.
    run_script_with_context(REPO / "hooks" / "post_gen_project.py", rendered.path, rendered.context)
    assert tree(rendered.path) == before
