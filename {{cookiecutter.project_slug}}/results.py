"""List, diff and compare runs. Run `python results.py --help` for the options."""

from {{ cookiecutter.package_name }}.kit.results import main

if __name__ == "__main__":
    main()
