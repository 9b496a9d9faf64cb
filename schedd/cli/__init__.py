"""The programs: ``schedd`` (the daemon), ``schedctl`` (the CLI) and ``schedd-worker``.

Owns argument parsing, start-up checks and what a terminal shows.  May import anything but the
API's internals: it starts the daemon through the runtime and talks to a cluster over HTTP.
"""
