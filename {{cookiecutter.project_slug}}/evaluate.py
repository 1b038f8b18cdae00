"""Test a checkpoint: `python evaluate.py --ckpt_path best|last|<file>`; metrics go to its run."""

from {{ cookiecutter.package_name }}.kit.evaluate import main
from {{ cookiecutter.package_name }}.kit.project import use
from {{ cookiecutter.package_name }}.project import project

if __name__ == "__main__":
    use(project)
    main()
