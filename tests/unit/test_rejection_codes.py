"""A rejection's code is the API's error code enum (or the internal one for a deposed leader,
never published), never a free string: the type checker then holds every code to the set the
API maps to an HTTP status."""

from __future__ import annotations

import ast
from pathlib import Path

from schedd.core.state import STALE_LEADER, Internal, Rejected, reject_code
from schedd.errors import HTTP_STATUS, Code

PACKAGE = Path(__file__).resolve().parents[2] / "schedd"


def _calls(tree: ast.AST) -> list[ast.Call]:
    """The calls in ``tree``, outside the variants scripts/mutants' copy of the tree adds
    (functions named ``*__mutmut_N``, which drop or change arguments on purpose)."""
    out: list[ast.Call] = []
    todo = [tree]
    while todo:
        node = todo.pop()
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and "__mutmut_" in node.name:
            continue
        if isinstance(node, ast.Call):
            out.append(node)
        todo.extend(ast.iter_child_nodes(node))
    return out


def test_no_rejection_is_built_with_a_string_literal_code() -> None:
    literal = []
    for path in PACKAGE.rglob("*.py"):
        for node in _calls(ast.parse(path.read_text(), str(path))):
            if (
                isinstance(node.func, ast.Name)
                and node.func.id == "Rejected"
                and node.args
                and isinstance(node.args[0], ast.Constant)
                and isinstance(node.args[0].value, str)
            ):
                literal.append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno}")
    assert not literal, literal


def test_every_public_code_has_a_status_and_the_internal_one_is_apart() -> None:
    assert set(HTTP_STATUS) == set(Code)
    assert STALE_LEADER is Internal.STALE_LEADER and STALE_LEADER.value not in set(Code)


def test_a_stored_code_reads_back_as_its_enum() -> None:
    assert reject_code("conflict") is Code.CONFLICT
    assert reject_code("stale_leader") is Internal.STALE_LEADER
    assert Rejected(Code.NOT_FOUND, "m") == Rejected(reject_code("not_found"), "m")
