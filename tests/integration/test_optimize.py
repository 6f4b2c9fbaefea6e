"""Model optimisations (#15): compiled networks at fixed batch buckets, int8 PT2E programs, the accuracy gate,
`segserve optimize`, and the bench's optimize axis. Timings are never asserted: only what each variant answers."""

import json
import logging
import zipfile
from pathlib import Path

import pytest
import yaml
from torchvision.io import encode_jpeg

from handlers.segmentation import SegmentationHandler
from segserve.model.quantize import quantize_int8
from segserve.model.synthetic import make_sample
from segserve.model.worker_context import worker_context
from tests.conftest import ROOT
from tests.unit.test_optimize import SMALL  # noqa: F401 (fixtures among them)


@pytest.fixture(scope="module")
def int8_program(tmp_path_factory, trained_weights) -> Path:
    return quantize_int8(trained_weights, SMALL, tmp_path_factory.mktemp("int8") / "seg-int8.pt2", images=8)


def test_int8_program_serves_batches_of_every_size_without_compiling_again(int8_program, caplog):
    """The handler compiles its buckets at load; a real batch of any size then runs a compiled graph (dynamo guards
    on the tensor's kind: a warm-up on the wrong kind of tensor left every real batch to compile again)."""
    from torch._dynamo.utils import counters

    from handlers.optimize import int8_kernels

    handler = SegmentationHandler()
    # batch size 2: buckets 1 and 2. Each bucket is one cold compile of about 70 C++ kernels (35–60 s on 2 cores
    # with an empty inductor cache, as on CI); the bucket arithmetic itself is tests/unit/test_optimize.py's
    context = worker_context(int8_program.parent, {"optimize": "int8", **SMALL}, int8_program.name, rows=2)
    before = int8_kernels()["int8_convolutions"]
    with caplog.at_level(logging.INFO, logger="handlers.segmentation"):
        handler.initialize(context)
    assert handler.buckets == (1, 2)
    # the worker runs int8 kernels, not its (de)quantize ops around fp32 ones: inductor matched int8 convolutions
    # in each compiled bucket (counted by its pattern passes), and the worker's log says how many
    assert int8_kernels()["int8_convolutions"] - before >= len(handler.buckets), int8_kernels()
    assert any(r.getMessage().startswith("int8: {'int8_convolutions': ") and r.levelno == logging.INFO for r in caplog.records)
    graphs = counters["stats"]["unique_graphs"]
    bodies = [encode_jpeg(make_sample(seed, 64, 96)[0]).numpy().tobytes() for seed in range(2)]
    for rows in (2, 1, 2):
        out = handler.handle([{"body": b} for b in bodies[:rows]], worker_context(None, {}, rows=rows))
        assert len(out) == rows and all(isinstance(o, bytes) for o in out)
    assert counters["stats"]["unique_graphs"] == graphs


def test_an_int8_fused_archive_ships_the_quantised_program_and_a_longer_startup_timeout(tmp_path, trained_weights):
    from segserve.archives.build import COMPILED_STARTUP_TIMEOUT_S, Recipe
    from segserve.archives.catalog import Catalog

    catalog = Catalog(ROOT)
    recipe = Recipe(catalog, trained_weights, tmp_path / "store", tmp_path / "staging", log=lambda _: None)
    (tmp_path / "store").mkdir()
    archive = recipe.fused_archive(catalog.dags["seg_jpeg"], "fused-int8", {"seg": {"optimize": "int8", **SMALL}}, {})
    with zipfile.ZipFile(archive) as zipped:
        manifest = json.loads(zipped.read("MAR-INF/MANIFEST.json"))
        program = manifest["model"]["serializedFile"]
        inside = zipfile.ZipFile(zipped.open(program)).namelist()
        assert program.endswith(".pt2") and any(name.endswith("/archive_format") for name in inside)
        assert yaml.safe_load(zipped.read(manifest["model"]["configFile"]))["startupTimeout"] == COMPILED_STARTUP_TIMEOUT_S
        assert yaml.safe_load(zipped.read("nodes/seg.yaml"))["handler"]["optimize"] == "int8"


def test_an_int8_archive_without_its_program_is_refused_at_load(trained_weights):
    handler = SegmentationHandler()
    context = worker_context(trained_weights.parent, {"optimize": "int8", **SMALL}, trained_weights.name, rows=1)
    with pytest.raises(ValueError, match="needs a quantised program"):
        handler.initialize(context)
