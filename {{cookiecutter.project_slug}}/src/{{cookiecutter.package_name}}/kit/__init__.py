"""The machinery that trains, resumes, repeats, searches, exports and serves the project's model.

It imports nothing of the project: the entry scripts hand over the model class
(project.use), the config names the data module's class. Edit the project's code, not this
package; `cruft update` brings its new versions.
"""
