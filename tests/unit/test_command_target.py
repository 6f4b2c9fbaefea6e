"""Command targets (peer servers the suite starts): their validation, their points, the v2 request body, the
side-by-side table."""

import json
import textwrap

import pytest

from segserve.archives.catalog import Catalog
from segserve.bench.results.analysis import side_by_side
from segserve.bench.run.command import V2_HEADER_BYTES, v2_binary_body
from segserve.bench.suite import plan
from segserve.bench.suite.spec import load_suite
from segserve.errors import UsageError
from tests.conftest import ROOT

CATALOG = Catalog(ROOT)
SAMPLES = str(ROOT / "samples" / "*.jpg")


def suite(tmp_path, targets: str, grid: str = "{load: {concurrency: [4, 8]}}"):
    path = tmp_path / "peers.yaml"
    entries = textwrap.indent(textwrap.dedent(targets).strip(), "  ")
    path.write_text(f"targets:\n{entries}\ninputs: [{{images: ['{SAMPLES}']}}]\ngrid: {grid}\n")
    return load_suite(path, Catalog(ROOT))


def test_every_combination_of_a_commands_own_params_is_a_point_after_torchserves_and_each_is_one_start(tmp_path):
    loaded = suite(
        tmp_path,
        """
        - seg_jpeg_fused
        - name: lit
          command: [python, app.py, --port, "{port}", --max-batch-size, "{max_batch_size}", --workers, "{workers_per_device}"]
          params: {max_batch_size: [1, 8], workers_per_device: [1, 2]}
        """,
        "{archive: {batch_size: [1, 4]}, load: {concurrency: [4, 8]}}",  # swept for segserve's targets: allowed beside a peer
    )
    points = plan.expand(loaded, CATALOG)
    lit = [p for p in points if p.target == "lit"]
    assert len(lit) == 8 and all(p.archive == p.runtime == () for p in lit)
    assert points[-8:] == lit  # after the TorchServe points: no restart of TorchServe in between
    assert sorted({p.server for p in lit}) == [
        (("max_batch_size", 1), ("workers_per_device", 1)),
        (("max_batch_size", 1), ("workers_per_device", 2)),
        (("max_batch_size", 8), ("workers_per_device", 1)),
        (("max_batch_size", 8), ("workers_per_device", 2)),
    ]
    spec = loaded.command_targets["lit"]
    assert spec.argv(4100, dict(lit[0].server))[3:] == ["4100", "--max-batch-size", "1", "--workers", "1"]
    cost = plan.cost(loaded, lit)
    assert (cost.restarts, cost.registrations) == (4, 0)  # one start per setting; the loads share it


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ("{name: p, command: [python, app.py]}", "command: give the server its port as {port}"),
        ('{name: p, command: [python, "--port={port}", "{batch}"]}', "command: {batch} is neither {port} nor one of params (none)"),
        ('{name: p, command: ["{port}"], params: {workers: [1, 2]}}', "params: workers is a segserve name"),
        ('{name: p, command: ["{port}"], health: ready}', "health: 'ready': a path starts with '/'"),
        ('{name: p, command: ["{port}"], protocol: triton}', "protocol: Input should be 'plain' or 'kserve-v2-binary'"),
        ('{name: p, command: ["{port}"], helth: /ready}', "unknown key — did you mean 'health'?"),
        ('{name: seg, command: ["{port}"]}', "'seg' is a catalog target: give the command target another name"),
    ],
)
def test_a_wrong_command_target_gets_one_line_naming_the_problem(tmp_path, entry, message):
    with pytest.raises(UsageError) as error:
        suite(tmp_path, f"- {entry}")
    assert message in str(error.value), str(error.value)
    assert len(str(error.value).splitlines()) == 1


def test_the_v2_body_is_a_padded_json_header_then_one_length_prefixed_bytes_element():
    jpeg = b"\xff\xd8" + bytes(range(256)) * 3
    body = v2_binary_body(jpeg, "image", "jpeg")
    header = json.loads(body[:V2_HEADER_BYTES])
    assert header["inputs"] == [{"name": "image", "shape": [1, 1], "datatype": "BYTES", "parameters": {"binary_data_size": 4 + len(jpeg)}}]
    assert header["outputs"] == [{"name": "jpeg", "parameters": {"binary_data": True}}]
    assert body[V2_HEADER_BYTES:] == len(jpeg).to_bytes(4, "little") + jpeg
    with pytest.raises(Exception, match="longer than 256 bytes"):
        v2_binary_body(jpeg, "x" * 300, "jpeg")


def winner(target, rps, windows, kind=None, **extra):
    record = {"target": target, "run_id": f"{target}-1", "throughput_rps": rps, "measured_window_throughputs_rps": windows, **extra}
    # as the command targets' kind (bench/run/targets/command_targets.py) marks its records
    return record | ({"target_kind": kind, "peer_server": kind == "command"} if kind else {})


def test_side_by_side_divides_by_segserves_best_and_prints_a_wide_ratio_as_uncertain():
    rows = side_by_side(
        {
            "seg_jpeg": winner("seg_jpeg", 60.0, [59.0, 60.0, 61.0, 60.0]),
            "seg_jpeg_fused": winner("seg_jpeg_fused", 100.0, [99.0, 100.0, 101.0, 100.0], server_cpu_pct=190.0),
            "litserve": winner("litserve", 80.0, [79.0, 80.0, 81.0, 80.0], "command", server_rss_mb=900.0),
            "ray": winner("ray", 50.0, [20.0, 50.0, 80.0, 50.0], "command"),
            "stock": None,  # no point met the constraints
        }
    )
    by_target = {row["target"]: row for row in rows}
    assert [row["target"] for row in rows] == ["seg_jpeg_fused", "litserve", "seg_jpeg", "ray"]
    assert by_target["seg_jpeg_fused"]["vs_segserve_best"] == 1.0
    assert by_target["litserve"]["vs_segserve_best"] == 0.8 and by_target["litserve"]["server"] == "command"
    assert by_target["litserve"]["rss_mb"] == 900.0 and by_target["seg_jpeg_fused"]["cpu_pct"] == 190.0
    assert by_target["ray"]["vs_segserve_best"].startswith("uncertain (")
    assert by_target["seg_jpeg"]["interval_rps"] is not None


def test_side_by_side_is_empty_without_a_command_target():
    assert side_by_side({"seg_jpeg": winner("seg_jpeg", 60.0, [60.0, 61.0])}) == []
