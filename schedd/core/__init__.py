"""The rules: every state transition of jobs and runs, as pure functions of the state and a
command (time and identifiers are inputs), and the codecs of what is replicated.

Owns the model, the commands and their application, schedules and recurrence, retries,
dependencies, fairness and the timing wheel.  May import only ``schedd.errors``: no clock, no
I/O, nothing of the layers above (checked by ``tests/unit/test_architecture.py``).
"""
