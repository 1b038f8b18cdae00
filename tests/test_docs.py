"""The documentation site builds strictly, and its questions page follows cookiecutter.json."""

import importlib.util
import json
import shutil
import sys
from pathlib import Path

from helpers import REPO, run

HOOK = REPO / "docs" / "hooks" / "questions.py"
spec = importlib.util.spec_from_file_location("questions_page", HOOK)
questions_page = importlib.util.module_from_spec(spec)
spec.loader.exec_module(questions_page)


def mkdocs_build(root: Path, site: Path) -> tuple[int, str]:
    result = run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
        cwd=root,
        NO_MKDOCS_2_WARNING="1",
    )
    return result.returncode, result.stdout


def copy_docs_source(target: Path) -> Path:
    """What `mkdocs build` reads, copied to target: config, pages, hook, questions."""
    target.mkdir()
    for name in ("mkdocs.yml", "cookiecutter.json"):
        shutil.copy(REPO / name, target / name)
    shutil.copytree(REPO / "docs", target / "docs")
    return target


def test_site_builds_strictly(tmp_path: Path) -> None:
    code, output = mkdocs_build(REPO, tmp_path / "site")
    assert code == 0, output
    page = (tmp_path / "site" / "questions" / "index.html").read_text()
    for question in json.loads((REPO / "cookiecutter.json").read_text()):
        if not question.startswith("_"):
            assert f'id="{question}"' in page, f"the built questions page lacks {question}"


def test_broken_link_fails_the_build(tmp_path: Path) -> None:
    root = copy_docs_source(tmp_path / "source")
    with (root / "docs" / "index.md").open("a") as index:
        index.write("\nSee [the missing page](no-such-page.md).\n")
    code, output = mkdocs_build(root, tmp_path / "site")
    assert code != 0
    assert "no-such-page.md" in output


def test_questions_page_shows_every_question_prompt_and_answer() -> None:
    context = json.loads((REPO / "cookiecutter.json").read_text())
    page = questions_page.questions_markdown(REPO / "cookiecutter.json")
    for name, default in context.items():
        if name.startswith("_"):
            continue
        assert f"## `{name}`" in page
        prompt = context["__prompts__"][name]
        if isinstance(prompt, dict):
            assert prompt["__prompt__"] in page
            for value in default:
                assert f"| `{value}`" in page
                if prompt[value] != value:
                    assert prompt[value] in page
        else:
            assert prompt in page
            assert str(default) in page


def test_questions_page_follows_a_new_question(tmp_path: Path) -> None:
    context = json.loads((REPO / "cookiecutter.json").read_text())
    context["logger"] = ["tensorboard", "csv"]
    context["__prompts__"]["logger"] = {
        "__prompt__": "Where metrics go",
        "tensorboard": "TensorBoard event files",
        "csv": "one CSV file per run",
    }
    path = tmp_path / "cookiecutter.json"
    path.write_text(json.dumps(context))
    page = questions_page.questions_markdown(path)
    section = page.split("## `logger`")[1]
    assert "Where metrics go" in section
    assert "| `tensorboard` (default) | TensorBoard event files |" in section
    assert "| `csv` | one CSV file per run |" in section


def test_readme_table_lists_every_question_with_its_choices() -> None:
    rows = {
        line.split("|")[1].strip().strip("`"): line
        for line in (REPO / "README.md").read_text().splitlines()
        if line.startswith("| `")
    }
    for question, default in json.loads((REPO / "cookiecutter.json").read_text()).items():
        if question.startswith("_"):
            continue
        assert question in rows, f"README.md's question table misses {question}"
        for choice in default if isinstance(default, list) else []:
            assert choice in rows[question], f"README.md: {question} misses {choice}"
