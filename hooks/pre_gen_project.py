"""Validate the answers before cookiecutter writes anything.

A bad answer exits with status 1 and one line naming the question, the value and
what is accepted; cookiecutter then removes the output folder it created.
"""

import keyword
import re
import sys

# fmt: off
ANSWERS = {
    "project_name": {{ cookiecutter.project_name | tojson }},
    "project_slug": {{ cookiecutter.project_slug | tojson }},
    "package_name": {{ cookiecutter.package_name | tojson }},
    "author_email": {{ cookiecutter.author_email | tojson }},
    "python_version": {{ cookiecutter.python_version | tojson }},
    "dataset": {{ cookiecutter.dataset | tojson }},
    "license": {{ cookiecutter.license | tojson }},
    "github_actions": {{ cookiecutter.github_actions | tojson }},
    "logger": {{ cookiecutter.logger | tojson }},
    "deploy": {{ cookiecutter.deploy | tojson }},
    "sweep": {{ cookiecutter.sweep | tojson }},
    "cluster": {{ cookiecutter.cluster | tojson }},
}
# fmt: on

CHOICES = {
    "python_version": ("3.10", "3.11", "3.12", "3.13"),
    "dataset": ("digits", "mnist", "fashion_mnist", "cifar10", "image_folder"),
    "license": ("MIT", "Apache-2.0", "BSD-3-Clause", "none"),
    "github_actions": ("yes", "no"),
    "logger": ("tensorboard", "csv", "mlflow", "wandb"),
    "deploy": ("yes", "no"),
    "sweep": ("yes", "no"),
    "cluster": ("yes", "no"),
}

# Modules the generated project imports, or whose names its tools treat specially (the entry
# scripts too: `python sweep.py` would import itself as a package named sweep).
TAKEN = {
    "lightning", "pytorch_lightning", "torch", "torchvision", "torchmetrics",
    "tensorboard", "sklearn", "numpy", "PIL", "yaml", "jsonargparse", "pytest",
    "ruff", "matplotlib", "mlflow", "wandb", "test", "tests", "src", "data",
    "train", "configs", "runs", "onnx", "onnxruntime", "onnxscript", "litserve",
    "fastapi", "pydantic", "optuna", "optuna_integration", "evaluate", "export", "predict",
    "serve", "sweep",
}  # fmt: skip


def problem(answers: dict[str, str]) -> str | None:
    """Return a one-line description of the first bad answer, or None."""
    slug = answers["project_slug"]
    if not re.fullmatch(r"[a-z0-9]+(-[a-z0-9]+)*", slug):
        return (
            f"project_slug {slug!r} is not valid: use lowercase ASCII letters, "
            f"digits and single '-' between them (derived from project_name "
            f"{answers['project_name']!r})"
        )
    package = answers["package_name"]
    if not re.fullmatch(r"[a-z][a-z0-9_]*", package):
        return (
            f"package_name {package!r} is not an importable name: start with a "
            f"lowercase ASCII letter, then letters, digits or '_'"
        )
    if keyword.iskeyword(package) or keyword.issoftkeyword(package):
        return f"package_name {package!r} is a Python keyword; choose another name"
    if package in TAKEN or package in sys.stdlib_module_names:
        return (
            f"package_name {package!r} would shadow the module of that name "
            f"that the project imports; choose another name"
        )
    email = answers["author_email"]
    if not re.fullmatch(r"[^@\s]+@[^@\s]+\.[^@\s.]+", email):
        return f"author_email {email!r} is not an e-mail address like name@example.org"
    for question, accepted in CHOICES.items():
        if answers[question] not in accepted:
            return f"{question} {answers[question]!r} is not one of: {', '.join(accepted)}"
    return None


if __name__ == "__main__":
    message = problem(ANSWERS)
    if message:
        print(f"error: {message}", file=sys.stderr)
        sys.exit(1)
