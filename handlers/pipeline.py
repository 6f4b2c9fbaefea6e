"""The fused pipeline: the workflow's DAG run inside one worker, results handed over in process.

Reads the same spec as the TorchServe workflow (workflows/seg_jpeg.yaml, shipped in the archive),
builds each node's handler with that node's own settings (nodes/<name>.yaml in the archive:
precision, quality, device …) and runs the chain: the first node decodes the request, every node
hands its result to the next without bytes in between (a class map stays a tensor, on the GPU when
the model runs there), and the last node encodes the response. Per-request status is kept end to
end: a bad image gets its 400 here, not a 500. Micro-batches overlap as in every handler: the last
node's work runs in the encode stage, while the next micro-batch is in the model.

Chains only: a DAG where a node has several children or parents is refused at load, with the reason.
"""

import types
from pathlib import Path

import yaml

from handlers.base import SegserveHandler, entry_point
from handlers.jpeg import JpegHandler
from handlers.segmentation import SegmentationHandler

# A node's handler, by the archive its spec entry names (url: seg.mar → seg).
NODE_HANDLERS = {"seg": SegmentationHandler, "jpeg": JpegHandler}


def chain_order(dag: dict) -> list[str]:
    """Node names from root to leaf; ValueError for anything but a single chain."""
    children = {node: list(targets or []) for node, targets in dag.items()}
    nodes = set(children) | {c for targets in children.values() for c in targets}
    parents = {node: [p for p, targets in children.items() if node in targets] for node in nodes}
    roots = [n for n in nodes if not parents[n]]
    branching = [n for n in nodes if len(children.get(n, [])) > 1 or len(parents[n]) > 1]
    if len(roots) != 1 or branching:
        raise ValueError(f"the fused pipeline runs chains only; this DAG has roots {sorted(roots)} and branching nodes {sorted(branching)}")
    order = [roots[0]]
    while children.get(order[-1]):
        order.append(children[order[-1]][0])
        if len(order) > len(nodes):
            raise ValueError("the DAG has a cycle")
    return order


class PipelineHandler(SegserveHandler):
    def load(self, model_dir: str, settings: dict, manifest: dict) -> None:
        spec_name = settings.pop("spec", "seg_jpeg.yaml")
        if settings:
            raise ValueError(f"handler: unknown setting(s) {sorted(settings)} for the pipeline (only 'spec')")
        spec = yaml.safe_load((Path(model_dir) / spec_name).read_text())
        models = spec["models"]
        self.nodes: list[SegserveHandler] = []
        for name in chain_order(spec["dag"]):
            stem = Path(models[name]["url"]).stem
            if stem not in NODE_HANDLERS:
                raise ValueError(f"node {name!r}: no in-process handler for {models[name]['url']!r} (known: {sorted(NODE_HANDLERS)})")
            node = NODE_HANDLERS[stem]()
            node_config = yaml.safe_load((Path(model_dir) / "nodes" / f"{stem}.yaml").read_text()) or {}
            # Each node keeps its own handler settings; runs in this worker's stage threads, not its own.
            node_settings = {**node_config.get("handler", {}), "overlap": False, "micro_batch_size": 0}
            context = types.SimpleNamespace(
                system_properties={"model_dir": model_dir, "gpu_id": self.gpu_id},
                manifest={"model": {"serializedFile": f"{stem}.pt"}},
                model_yaml_config={"handler": node_settings},
                metrics=None,
            )
            node.initialize(context)
            self.nodes.append(node)

    def initialize(self, context) -> None:
        self.gpu_id = context.system_properties.get("gpu_id")
        super().initialize(context)
        self.content_type = self.nodes[-1].content_type

    def decode(self, body: bytes):
        return self.nodes[0].decode(body)

    def predict(self, items: list) -> list:
        """Every node but the last, batched; the last node runs per row in the encode stage."""
        if len(self.nodes) == 1:
            return self.nodes[0].predict(items)
        _, results = self.nodes[0].infer(items)
        for previous, node in zip(self.nodes, self.nodes[1:-1], strict=False):
            _, results = node.infer([hand_over(previous, node, r) for r in results])
        return results

    def encode(self, result) -> bytes:
        last = self.nodes[-1]
        if len(self.nodes) == 1:
            return last.encode(result)
        return last.encode(last.predict([hand_over(self.nodes[-2], last, result)])[0])


def hand_over(previous: SegserveHandler, node: SegserveHandler, result):
    """In process when the node takes the object (a class map tensor), else through the bytes a workflow would send."""
    item = node.accept(result)
    return item if item is not NotImplemented else node.decode(previous.encode(result))


handle = entry_point(PipelineHandler)
