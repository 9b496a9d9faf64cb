"""The node's HTTP surface: the JSON API, the worker websocket endpoint, the OpenAPI document.

Owns the request handlers, their views of jobs and runs, and the ports (``ports.py``): what the
API uses of the rest of the node, one narrow typed interface per service, handed in by the
runtime.  May import: core, protocol, storage (the read side), leader (the worker connection
type), metrics, config, auth, and the foundation modules; never raft, runtime or cli.
"""
