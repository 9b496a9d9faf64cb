"""The worker protocol's frames: what a worker and the leader say over the websocket.

Pure: encoding and decoding only.  May import core (the shapes it reuses) and errors.
"""
