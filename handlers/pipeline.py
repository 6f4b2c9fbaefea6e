"""The fused pipeline: the workflow's DAG run inside one worker, results handed over in process.

Reads the same spec as the TorchServe workflow (e.g. workflows/seg_jpeg.yaml, shipped in the
archive), builds each node's handler with that node's own settings (nodes/<archive>.yaml in the
archive: precision, quality, device …) and runs the DAG in topological order: the root decodes the
request, every node hands its result to its children without bytes in between (a class map stays
a tensor, on the GPU when the model runs there), and the leaves encode the response, a micro-batch in one call. Per-request
status is kept end to end: a bad image gets its 400 here, not a 500. Micro-batches overlap as in
every handler: the leaves' work runs in the encode stage, while the next micro-batch is in the model.

DAGs as TorchServe runs them: a chain answers with its leaf's bytes; a fan-out to several leaves
answers one JSON object keyed by leaf name, each value the leaf's own JSON object (TorchServe's
WorkflowManager parses every leaf's output as a JSON object, so such leaves must answer JSON; this
is checked at load). A node with several parents (fan-in) is refused at load: TorchServe would hand
it one request with a parameter per parent, and no segserve handler joins inputs.
"""

import importlib
import json
import types
from pathlib import Path

import yaml

from handlers.base import SegserveHandler, entry_point
from handlers.dag import parse_dag

# A node's counters that are the pipeline's too (the rest of its stage times run inside the pipeline's own stages):
# JPEGs its decoder left to the CPU, and the copies and forward pass inside the pipeline's predict stage.
NODE_COUNTERS = ("decode_fallbacks", "copy_ms", "forward_ms")


def node_handler(module: str) -> SegserveHandler:
    """A fresh handler of the module a node config names (`segserve: {handler: areas}` → handlers/areas.py)."""
    if not module.isidentifier():
        raise ValueError(f"handler {module!r} is not a module name")
    entry = getattr(importlib.import_module(f"handlers.{module}"), "handle", None)
    if not hasattr(entry, "service"):
        raise ValueError(f"handlers/{module}.py has no segserve entry point `handle = entry_point(...)`")
    return type(entry.service)()


class PipelineHandler(SegserveHandler):
    def load(self, model_dir: str, settings: dict, manifest: dict) -> None:
        spec_name = settings.pop("spec", "seg_jpeg.yaml")
        if settings:
            raise ValueError(f"handler: unknown setting(s) {sorted(settings)} for the pipeline (only 'spec')")
        spec = yaml.safe_load((Path(model_dir) / spec_name).read_text())
        models = spec["models"]
        self.dag = parse_dag(spec["dag"])
        self.nodes: dict[str, SegserveHandler] = {}
        for name in self.dag.order:
            stem = Path(models[name]["url"]).stem
            node_config = yaml.safe_load((Path(model_dir) / "nodes" / f"{stem}.yaml").read_text()) or {}
            node = node_handler((node_config.get("segserve") or {}).get("handler", ""))
            # Each node keeps its own handler settings; runs in this worker's stage threads, not its own, and with
            # this worker's torch threads: torch's thread count is per process, so a node's `threads` (areas: 1)
            # would set it for every node (measured: the fan-out twin at one core's worth, 38.7 vs 50.7 req/s).
            node_settings = {**node_config.get("handler", {}), "overlap": False, "micro_batch_size": 0, "threads": 0}
            # the node that carries the weights reads the archive's serialized file (the weights, or an int8 program)
            serialized = manifest["model"].get("serializedFile") if (node_config.get("segserve") or {}).get("weights") else None
            context = types.SimpleNamespace(
                system_properties={"model_dir": model_dir, "gpu_id": self.gpu_id, "batch_size": self.max_rows},
                manifest={"model": {"serializedFile": serialized or f"{stem}.pt"}},
                model_yaml_config={"handler": node_settings},
                metrics=None,
            )
            node.initialize(context)
            self.nodes[name] = node
        if len(self.dag.leaves) > 1:
            answers = {leaf: self.nodes[leaf].content_type for leaf in self.dag.leaves}
            not_json = {leaf: kind for leaf, kind in answers.items() if kind != "application/json"}
            if not_json:
                raise ValueError(
                    f"a DAG with several leaves answers one JSON object made of each leaf's JSON (as TorchServe does); "
                    f"leaves that do not answer JSON: {not_json}"
                )

    def initialize(self, context) -> None:
        self.gpu_id = context.system_properties.get("gpu_id")
        super().initialize(context)
        leaves = self.dag.leaves
        self.content_type = self.nodes[leaves[0]].content_type if len(leaves) == 1 else "application/json"

    def decode(self, body: bytes):
        return self.nodes[self.dag.root].decode(body)

    def report_metrics(self, context, response_bytes: int, requests: int) -> None:
        """The bytes the nodes moved between host and device are the pipeline's (a leaf's JPEG copied to the host,
        the root's batch copied to the device), and so are the root's JPEGs decoded on the CPU for the GPU's decoder:
        counted here, or TorchServe would never see them."""
        for node in self.nodes.values():
            for name, value in node.stages.times.drain().items():
                if name.endswith("_bytes") or name in NODE_COUNTERS:
                    self.stages.times.add(name, value)
        super().report_metrics(context, response_bytes, requests)

    def prepare(self, items: list, position: int):
        return self.nodes[self.dag.root].prepare(items, position)

    def predict(self, prepared) -> list[dict]:
        """Every inner node batched, in DAG order; per row, what each leaf takes (leaves run in the encode stage)."""
        inputs = {self.dag.root: prepared}  # the root's micro-batch as its prepare() left it
        for name in self.dag.order:
            node, children = self.nodes[name], self.dag.children.get(name)
            if not children:
                continue
            _, results = node.infer(inputs.pop(name))
            for child in children:
                inputs[child] = [hand_over(node, self.nodes[child], r) for r in results]
        rows = len(inputs[self.dag.leaves[0]])
        return [{leaf: inputs[leaf][row] for leaf in self.dag.leaves} for row in range(rows)]

    def encode(self, leaf_inputs: dict) -> bytes:
        return self.encode_many([leaf_inputs])[0]

    def encode_many(self, rows: list[dict]) -> list[bytes]:
        """Each leaf runs the micro-batch's rows in one call (the JPEG leaf: one nvJPEG or libjpeg call, as the jpeg
        model does for its batch); a row that breaks it is run alone (the StageRunner's fallback to encode())."""
        outputs = {leaf: self.run_leaf(leaf, [row[leaf] for row in rows]) for leaf in self.dag.leaves}
        if len(outputs) == 1:
            return next(iter(outputs.values()))
        return [torchserve_json({leaf: json.loads(outputs[leaf][i]) for leaf in self.dag.leaves}) for i in range(len(rows))]

    def run_leaf(self, name: str, items: list) -> list[bytes]:
        node = self.nodes[name]
        return [node.encode(result) for result in node.predict(items)]


def torchserve_json(answer: dict) -> bytes:
    """Bytes as TorchServe's frontend writes a multi-leaf workflow answer (Gson pretty printing without
    HTML escapes, measured): 2-space indent, UTF-8 unescaped, then a newline."""
    return (json.dumps(answer, indent=2, ensure_ascii=False) + "\n").encode()


def hand_over(previous: SegserveHandler, node: SegserveHandler, result):
    """In process when the node takes the object (a class map tensor), else through the bytes a workflow would send."""
    item = node.accept(result)
    return item if item is not NotImplemented else node.decode(previous.encode(result))


handle = entry_point(PipelineHandler)
