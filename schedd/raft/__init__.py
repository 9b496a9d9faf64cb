"""Replication: the Raft node (pysyncobj), its durable journal, snapshots of the state database,
and every patch of pysyncobj (``patches.py``).

The only package that imports pysyncobj.  May import: core, storage, and the foundation
modules; never the leader, the API or the runtime.
"""
