"""Engine conformance harness: the engines' own exporters replay simulator timelines.

Not part of the kvwatch package. ``conformance/regenerate`` builds one venv per engine
version (cached outside the repository), runs a driver inside it and rewrites the
fixtures under ``tests/fixtures/conformance/`` that the CI tests read.
"""
