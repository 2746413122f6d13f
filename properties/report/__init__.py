"""Every text the harness shows a user about a failure: the report as a value and
its rendering (report.py), how it is built from a case and an outcome (build.py),
the things it describes (describe.py), and the plug-in's frames of an exception
(frames.py). Built once where the failure is found, rendered only at the edge."""
