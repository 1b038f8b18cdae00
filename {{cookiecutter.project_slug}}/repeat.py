"""Train one configuration over seeds or folds. Run `python repeat.py --help` for the options."""

from {{ cookiecutter.package_name }}.repeat import run

if __name__ == "__main__":
    run()
