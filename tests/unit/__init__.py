"""Test package (lets tests import tests.helpers)."""
