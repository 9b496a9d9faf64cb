"""The replicated state on disk: the SQLite state the log is applied to, its schema and
migrations, snapshots (copies) of it, and the API's read connections.

May import: core and the foundation modules.
"""
