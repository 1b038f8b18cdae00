"""Test a checkpoint: `python evaluate.py --ckpt_path best|last|<file>`; metrics go to its run."""

from {{ cookiecutter.package_name }}.evaluate import main

if __name__ == "__main__":
    main()
