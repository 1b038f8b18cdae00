"""Keep only the files of the options chosen.

Safe to run twice on the same folder (cruft re-runs hooks): every step checks
what is there before it moves or removes anything. No network, no prompts.
"""

import shutil
from pathlib import Path

DATASET = "{{ cookiecutter.dataset }}"
LICENSE = "{{ cookiecutter.license }}"
GITHUB_ACTIONS = "{{ cookiecutter.github_actions }}"
LOGGER = "{{ cookiecutter.logger }}"
PACKAGE = Path("src") / "{{ cookiecutter.package_name }}"
KIT = PACKAGE / "kit"  # the library: copied as it is, its feature modules removed here
FEATURES = {
    "deploy": "{{ cookiecutter.deploy }}",
    "sweep": "{{ cookiecutter.sweep }}",
    "cluster": "{{ cookiecutter.cluster }}",
}

# The torchvision datasets share one loader file; the others have their own.
VARIANT = {"mnist": "torchvision", "fashion_mnist": "torchvision", "cifar10": "torchvision"}
VARIANT_FILES = {
    PACKAGE / "data.py": PACKAGE / "datasets",
    Path("tests") / "fake_data.py": Path("tests") / "datasets",
}
# mlflow and wandb get a test of their own.
LOGGER_FILES = {
    Path("tests") / "test_logger.py": (Path("tests") / "logger_tests", LOGGER),
}

# What each optional feature adds: its entry scripts, library modules and configs. The
# README, pyproject.toml and the shared tests mention a feature only inside Jinja conditionals.
FEATURE_FILES = {
    "deploy": [
        Path("export.py"), Path("predict.py"), Path("serve.py"),
        KIT / "export.py", KIT / "predict.py", KIT / "serve.py",
        KIT / "inference.py", PACKAGE / "inputs.py",
    ],
    "sweep": [
        Path("sweep.py"), KIT / "sweep.py", KIT / "search_space.py",
        Path("configs") / "sweep",
    ],
    "cluster": [Path("scripts") / "slurm"],
}  # fmt: skip

SHARDS_FILES = [Path("convert.py"), PACKAGE / "shards.py", Path("configs") / "data"]
# How an image folder's files are read (its loader workers import it without Lightning).
FOLDER_FILES = [PACKAGE / "image_files.py"]


def remove(path: Path) -> None:
    """Remove a file or a folder, if it is there."""
    if path.is_dir():
        shutil.rmtree(path)
    else:
        path.unlink(missing_ok=True)


def choose(target: Path, variants: Path, name: str) -> None:
    """Move variants/<name>.py to target, then remove the variants folder."""
    chosen = variants / f"{name}.py"
    if chosen.exists():
        chosen.replace(target)
    shutil.rmtree(variants, ignore_errors=True)


def main() -> None:
    for target, variants in VARIANT_FILES.items():
        choose(target, variants, VARIANT.get(DATASET, DATASET))
    for target, (variants, name) in LOGGER_FILES.items():
        choose(target, variants, name)

    if DATASET == "image_folder":
        # Images read from disk keep the per-image path; the batch augmentations are for
        # datasets held in memory.
        for path in (PACKAGE / "batch_augment.py", Path("tests") / "test_batch_augment.py"):
            path.unlink(missing_ok=True)
    else:
        # Shards are for image folders too large to list and read file by file.
        for path in [*SHARDS_FILES, *FOLDER_FILES]:
            remove(path)

    licenses = Path("licenses")
    if licenses.exists():
        if LICENSE != "none":
            (licenses / LICENSE).replace("LICENSE")
        shutil.rmtree(licenses)

    if GITHUB_ACTIONS != "yes":
        shutil.rmtree(".github", ignore_errors=True)

    for feature, paths in FEATURE_FILES.items():
        if FEATURES[feature] != "yes":
            for path in paths:
                remove(path)


if __name__ == "__main__":
    main()
