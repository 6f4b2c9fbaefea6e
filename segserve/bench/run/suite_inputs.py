"""What a suite's points are sent and what their measurements depend on: the request bodies of each target and the
digests (load settings, inputs, archive recipe, server config) that go into its run ids."""

import hashlib
import json
import tempfile
from functools import cache
from pathlib import Path

from segserve.archives.catalog import Catalog
from segserve.bench.run.command import v2_binary_body
from segserve.bench.run.dag_requests import Failed, left_out, workflow_node_requests
from segserve.bench.run.inputs import Body, class_maps, request_bodies
from segserve.bench.suite.spec import Suite
from segserve.errors import RuntimeFailure


def digest(*parts) -> str:
    sha = hashlib.sha1()
    for part in parts:
        sha.update(part if isinstance(part, bytes) else json.dumps(part, sort_keys=True, default=str).encode())
    return sha.hexdigest()[:8]


class MemberBodies(list):
    """A workflow member's bodies: the rows that reach its node inside the workflow, and the workflow's inputs a node
    above it failed, which it never gets there (dag_requests.left_out; None: none)."""

    left_out: str | None = None

    def __reduce__(self):  # to a load process as a plain list: unpickling this class would import torch there
        return list, (list(self),)


def member_bodies(name: str, rows: list) -> MemberBodies:
    """The rows of `rows` (dag_requests.node_requests') that reach the member's node; a member none reaches fails
    alone, its siblings and the nodes above it measured."""
    bodies = MemberBodies(row for row in rows if not isinstance(row, Failed))
    bodies.left_out = left_out(rows)
    if not bodies:
        raise RuntimeFailure(f"{name}: none of the workflow's {len(rows)} inputs reaches it: {bodies.left_out}")
    return bodies


class SuiteInputs:
    """Request bodies per target and what, besides a point's parameters, changes its measurement: the load
    settings, the inputs, the archive recipe (node configs, DAG spec, weights) and the server config."""

    def __init__(self, suite: Suite, catalog: Catalog, weights: Path):
        self.suite, self.catalog, self.weights = suite, catalog, weights
        # (archive target, bodies) → what it answers to each, registered alone: the deployment's `answers`, set
        # before measuring (a .war's members are sent what its nodes answer)
        self.capture = None

    @cache  # noqa: B019 (one per run)
    def images(self, phase: str | None = None) -> tuple[bytes, ...]:
        """The suite's inputs, or a load phase's (its own, else the suite's)."""
        given = next((p.inputs for p in self.suite.load.phases or [] if p.name == phase), None)
        return tuple(request_bodies(given or self.suite.inputs))

    @cache  # noqa: B019
    def bodies_for(self, name: str, phase: str | None = None) -> list[bytes]:
        member = self.catalog.foreign.get(name)
        if member is not None and member.workflow is not None:  # a node of a user's workflow: what the DAG sends it
            return member_bodies(name, self.node_requests(member.workflow, phase)[member.node])
        archive = self.suite.archive_targets.get(name)
        if archive is not None and archive.inputs:  # a user's archive: what it is sent, its own (phases too)
            return request_bodies(archive.inputs)
        command = self.suite.command_targets.get(name)
        if command is not None and command.protocol == "kserve-v2-binary":  # the images inside v2 requests
            wrapped = [v2_binary_body(body, command.v2_input, command.v2_output) for body in self.images(phase)]
            return [Body(body, "application/octet-stream") for body in wrapped]
        target = self.catalog.targets.get(name)
        if target is None or archive is not None or target.takes == "image":
            return list(self.images(phase))
        # class maps: what the model that turns images into class maps answers for the images
        return class_maps(list(self.images(phase)), self.weights, self.producer(target.takes).config)

    @cache  # noqa: B019 (the DAG evaluated once per phase, whichever member asks first)
    def node_requests(self, workflow: str, phase: str | None = None) -> dict[str, list[bytes]]:
        """What each node of a user's .war is sent for the .war's inputs: its model nodes' answers captured by
        registering each alone on a server (`capture`), its function nodes run in processes of their own with the
        environment its workers get, a scratch HOME of their own (dag_requests.workflow_node_requests)."""
        if self.capture is None:
            raise RuntimeFailure(f"{workflow}: its members' inputs are what its nodes answer, captured on a server (none here)")
        from segserve.serving.server import archive_environment, scratch_home

        with tempfile.TemporaryDirectory(prefix="segserve-archive-home-") as folder:  # removed with what they kept there
            env = archive_environment(self.suite.archive_targets[workflow].worker_env, scratch_home(Path(folder) / "home"))
            return workflow_node_requests(self.catalog.foreign[workflow], self.bodies_for(workflow, phase), self.capture, env)

    def all_images(self) -> tuple[bytes, ...]:
        """Every body the suite sends, its phases' too (what its measurements depend on)."""
        return self.images() + tuple(body for phase in self.suite.load.phases or [] for body in self.images(phase.name))

    def producer(self, kind: str):
        """The node model that turns images into this kind of body (seg: class maps)."""
        return next(m for m in self.catalog.models.values() if m.takes == "image" and m.gives == kind)

    @cache  # noqa: B019 (read once per run, not once per target)
    def weightsdigest(self) -> str:
        return digest(self.weights.read_bytes()) if self.weights.exists() else ""  # --dry-run may come before training

    def parts(self, name: str) -> dict[str, str]:
        """Digests of what changes a target's measurement besides its parameters. The code (handlers/, segserve/)
        is left out on purpose: `bench compare` compares two versions of it; records keep the git sha."""
        suite = self.suite
        # the bare forward's length changes no served measurement: left out, so run ids stay those of older runs
        load = suite.load.model_dump(exclude_none=True, exclude={"bare_forward_s"})
        parts = {"load": digest(load), "inputs": digest(*self.all_images())}
        http = suite.http_targets.get(name)
        if http is not None:
            return {**parts, "recipe": digest(http.url, sorted(http.headers))}
        command = suite.command_targets.get(name)
        if command is not None:  # how it is started and spoken to (its own values are the point's parameters)
            recipe = command.model_dump(include={"command", "path", "health", "protocol", "v2_input", "v2_output", "env"})
            return {**parts, "recipe": digest(recipe)}
        server = [path.read_bytes() for path in (self.catalog.config_template, Path(suite.core_plan or "")) if path.is_file()]
        foreign = self.catalog.foreign.get(name)
        if foreign is not None:  # the user's archive and its node archives, as they are now
            archive = suite.archive_targets[name]
            inputs = request_bodies(archive.inputs) if archive.inputs else self.all_images()
            recipe = [path.read_bytes() for path in foreign.files() if path.is_file()]
            if foreign.workflow is not None:  # its inputs: what the .war and its node archives make of the .war's inputs
                inputs = [digest(self.parts(foreign.workflow)).encode()]
            return {**parts, "inputs": digest(*inputs), "recipe": digest(*recipe), "server": digest(*server)}
        target = self.catalog.targets[name]
        if target.takes != "image":  # its inputs are what the producer model makes of the images
            producer = self.producer(target.takes)
            parts["inputs"] = digest(*self.all_images(), producer.config.read_bytes(), self.weightsdigest())
        files = {node.model.config for node in target.nodes}
        if target.dag:
            dag = self.catalog.dags[target.dag]
            files |= {dag.spec_path, dag.fused_config}
        recipe = [path.read_bytes() for path in sorted(files) if path.exists()]
        if target.weights_node is not None:
            recipe.append(self.weightsdigest())
        return {**parts, "recipe": digest(*recipe), "server": digest(*server)}

    def digests(self) -> dict[str, str]:
        return {name: digest(self.parts(name)) for name in self.suite.target_names}
