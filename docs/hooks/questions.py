"""MkDocs hook: the page of questions, written from cookiecutter.json at every build.

The page is never stored, so it cannot drift from the questions cookiecutter asks.
"""

import json
from pathlib import Path
from typing import Any

from mkdocs.config.defaults import MkDocsConfig
from mkdocs.structure.files import File, Files

PAGE = "questions.md"
COOKIECUTTER_JSON = Path(__file__).resolve().parents[2] / "cookiecutter.json"

INTRO = """\
# The questions

Cookiecutter (or `cruft create`) asks these questions in this order; `--no-input` takes every
default, and `name=value` arguments answer on the command line:

```bash
cookiecutter --no-input <template> dataset=cifar10 license=Apache-2.0
```

A bad answer stops the render before anything is written: the pre-generation hook prints one
line that names the question, the value and what is accepted. A default written as an
expression is derived from earlier answers. This page is built from the template's
`cookiecutter.json`, the file cookiecutter reads.
"""


def prompt_of(prompts: dict[str, Any], name: str) -> tuple[str, dict[str, str]]:
    """The question's prompt, and the help text of each choice (if any)."""
    prompt = prompts.get(name, name)
    if isinstance(prompt, dict):
        choices = {value: text for value, text in prompt.items() if value != "__prompt__"}
        return prompt.get("__prompt__", name), choices
    return prompt, {}


def questions_markdown(cookiecutter_json: Path) -> str:
    """The questions page, as Markdown, for the given cookiecutter.json."""
    context = json.loads(cookiecutter_json.read_text())
    prompts = context.get("__prompts__", {})
    sections = [INTRO]
    for name, default in context.items():
        if name.startswith("_"):
            continue
        prompt, help_texts = prompt_of(prompts, name)
        lines = [f"## `{name}`", "", prompt, ""]
        if isinstance(default, list):
            lines += ["| Answer | Meaning |", "| --- | --- |"]
            for index, value in enumerate(default):
                meaning = help_texts.get(value, "")
                mark = " (default)" if index == 0 else ""
                # Help that only repeats the answer says nothing more.
                meaning = "" if meaning == value else meaning.replace("|", "\\|")
                lines.append(f"| `{value}`{mark} | {meaning} |")
        elif "{{" in str(default):
            lines.append(f"Default, derived: `{default}`")
        else:
            lines.append(f"Default: `{default}`")
        sections.append("\n".join(lines) + "\n")
    return "\n".join(sections)


def on_files(files: Files, config: MkDocsConfig) -> Files:
    files.append(File.generated(config, PAGE, content=questions_markdown(COOKIECUTTER_JSON)))
    return files
