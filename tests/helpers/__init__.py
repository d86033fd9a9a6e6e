"""Helpers that more than one test module uses (not collected: no test_ names).

Import them as ``from helpers.cli import cli``: tests/ is on sys.path, since
tests/conftest.py lives there. A test module never imports another test module
(their folders are not on each other's sys.path).
"""
