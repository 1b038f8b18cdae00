"""What this project hands the library (kit/): its model class, imported when a run first needs
it (predicting with an exported file imports neither Lightning nor the model). The data
module's class is the config's (data.class_path); kit/project.py lists what the library
expects of them.
{%- if cookiecutter.deploy == "yes" %} Its inputs module (inputs.py, by name) reads inputs outside
training.
{%- endif %}"""

from .kit.project import Project


def project() -> Project:
    from .model import ImageClassifier

{%- if cookiecutter.deploy == "yes" %}

    return Project(model=ImageClassifier, inputs=f"{__package__}.inputs")
{%- else %}

    return Project(model=ImageClassifier)
{%- endif %}
