"""The catalog: every target from the project's YAML; broken workflow YAMLs refused before anything starts; and a
new DAG, added as YAML only, built, served, predicted and benchmarked."""

import json
import textwrap

from segserve.cli import main
from segserve.serving.ts_config import free_port_base
from tests.unit.test_catalog import BROKEN, PROJECT_PARTS, copy_project  # noqa: F401 (fixtures among them)


def test_a_new_dag_is_yaml_only_and_is_built_served_predicted_and_benchmarked(tmp_path, monkeypatch, trained_weights, capsys):
    project = copy_project(tmp_path / "project")
    (project / "workflows" / "seg_areas.yaml").write_text(
        # timeout-ms and retry-attempts as the shipped workflows set them: TorchServe 0.12 can lose a node's answer
        # under load, and asks again only after timeout-ms (docs/serving.md, "The workflow loses responses")
        "models:\n  min-workers: 1\n  max-workers: 1\n  batch-size: 4\n  max-batch-delay: 5\n  timeout-ms: 10000\n  retry-attempts: 1\n"
        "  seg: {url: seg.mar}\n  areas: {url: areas.mar}\ndag:\n  seg: [areas]\n"
    )
    monkeypatch.chdir(project)
    store, run_dir, weights = project / "model_store", project / ".segserve", str(trained_weights)
    assert main(["build", "--model-store", str(store), "--weights", weights]) == 0
    assert {"seg_areas.war", "seg_areas_fused.mar"} <= {p.name for p in store.iterdir()}
    common = ["--model-store", str(store), "--run-dir", str(run_dir)]
    assert main(["serve", *common, "--targets", "seg_areas,seg_areas_fused", "--port-base", str(free_port_base())]) == 0
    try:
        for target in ("seg_areas", "seg_areas_fused"):
            out = tmp_path / target
            assert main(["predict", str(project / "samples" / "shapes_0.jpg"), *common, "--target", target, "--out", str(out)]) == 0
            answer = json.loads((out / "shapes_0.json").read_text())
            height, width = answer["map_size"]
            assert sum(answer["pixels"]) == height * width and answer["boxes"], answer
        workflow, fused = (json.loads((tmp_path / t / "shapes_0.json").read_text()) for t in ("seg_areas", "seg_areas_fused"))
        assert workflow == fused  # the same DAG in one worker answers the same
    finally:
        assert main(["serve", *common, "--stop"]) == 0
    suite = project / "areas.yaml"
    suite.write_text(
        textwrap.dedent(
            f"""
            targets: [seg_areas, seg_areas_fused]
            inputs: [{{images: ["{project / "samples" / "shapes_0.jpg"}"]}}]
            grid: {{load: {{concurrency: [2]}}}}
            load: {{warmup_s: 0.5, window_s: 1.0, stable_windows: 2, max_windows: 3, stability_tolerance: 0.5, bare_forward_s: 0.6,
                    max_others_share: 1.0}}
            """
        )
    )
    # max_others_share 1.0: beside make test's other process every window and bare-forward slice counts as disturbed
    # and is measured again (up to max_windows more) otherwise: seconds that nothing here reads
    assert main(["bench", str(suite), "--results", str(tmp_path / "results"), "--weights", weights]) == 0
    (folder,) = (tmp_path / "results" / "areas").iterdir()
    rows = [json.loads(line) for line in (folder / "summary.jsonl").read_text().splitlines()]
    assert [r["target"] for r in rows] == ["seg_areas", "seg_areas_fused"]
    outcomes = [{k: r.get(k) for k in ("target", "error", "requests_ok", "requests_failed", "failures_by_status")} for r in rows]
    assert all(r["error"] is None and r["requests_ok"] > 0 and r["requests_failed"] == 0 for r in rows), outcomes
    assert (folder / "best" / "seg_areas.yaml").is_file()
