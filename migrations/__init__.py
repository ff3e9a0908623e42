"""Alembic migrations for taskline's schema; `taskline migrate` runs them under an advisory lock."""
