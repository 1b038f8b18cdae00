"""The post-generation hook can run again on its own output and change nothing.

cruft runs the hooks again on every update; every case and combination is checked.
"""

import pytest
from cookiecutter.hooks import run_script_with_context

from helpers import RENDERS, REPO, render, tree


@pytest.mark.parametrize("case", RENDERS)
def test_post_gen_hook_is_idempotent(tmp_path, case: str) -> None:
    rendered = render(tmp_path, **RENDERS[case])
    before = tree(rendered.path)
    # Raises FailedHookException if the hook exits non-zero.
    run_script_with_context(REPO / "hooks" / "post_gen_project.py", rendered.path, rendered.context)
    assert tree(rendered.path) == before
