"""List, diff and compare runs. Run `python results.py --help` for the options."""

from {{ cookiecutter.package_name }}.results import main

if __name__ == "__main__":
    main()
