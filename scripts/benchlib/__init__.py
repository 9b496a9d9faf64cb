"""Helpers for scripts/bench.py: process control with timeouts, the pysyncobj ceiling, the peers
(Huey with SQLite, Celery 5 with Redis) in their own environments, and the schedd bench tasks."""
