"""A workflow spec's `dag:` section, checked and ordered: one root, no joins, no cycles.

Light on purpose (no torch): the fused pipeline runs it in a worker and segserve's catalog checks every
workflow YAML with it before anything is built or started.
"""

from typing import NamedTuple


class Dag(NamedTuple):
    order: list[str]  # topological: every node after its parent
    children: dict[str, list[str]]
    root: str
    leaves: list[str]  # in spec order: the keys of a multi-leaf response


def parse_dag(dag: dict) -> Dag:
    """The spec's `dag:` section checked and ordered; ValueError says what the fused pipeline cannot run."""
    bad = {node: targets for node, targets in dag.items() if not (targets is None or isinstance(targets, list))}
    bad |= {node: targets for node, targets in dag.items() if isinstance(targets, list) and not all(isinstance(t, str) for t in targets)}
    if bad or not all(isinstance(node, str) for node in dag):
        raise ValueError(f"each node maps to a list of node names, like `seg: [jpeg]` (got {bad or dag})")
    children = {node: list(targets or []) for node, targets in dag.items()}
    nodes = list(dict.fromkeys([*children, *(c for targets in children.values() for c in targets)]))
    parents = {node: [p for p, targets in children.items() if node in targets] for node in nodes}
    joins = {n: parents[n] for n in nodes if len(parents[n]) > 1}
    if joins:
        raise ValueError(f"the fused pipeline does not join inputs; node(s) with several parents: {joins}")
    roots = [n for n in nodes if not parents[n]]
    if len(nodes) < 2:
        raise ValueError(f"a DAG of one node ({nodes}) needs no pipeline: register that model itself")
    if len(roots) != 1:
        raise ValueError(f"the fused pipeline needs exactly one root node that takes the request; this DAG has {roots or 'none (a cycle)'}")
    order = [roots[0]]
    for node in order:  # breadth first; with one parent per node and a root, each is reached once
        order += children.get(node, [])
    if len(order) != len(nodes):  # a cycle apart from the root: its nodes each have a parent, none is reached
        raise ValueError(f"the DAG has a cycle: {sorted(set(nodes) - set(order))} cannot be reached from {roots[0]!r}")
    return Dag(order, children, roots[0], [n for n in nodes if not children.get(n)])
