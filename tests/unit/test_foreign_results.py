"""Result commands on archive targets, without a server: which checkout `bench ab`'s refs name and which config its
sides use from a user's folder, and what `bench compare` says of folders it cannot join."""

import pytest

from segserve.archives.foreign import ForeignArchive
from segserve.bench.ab import SideCatalog, project_root, users_config
from segserve.bench.results.compare import CompareRun, compare
from segserve.errors import UsageError
from tests.conftest import ROOT
from tests.unit.test_report import record, write_results


def test_ab_refs_name_segserves_checkout_from_a_folder_that_is_not_one(tmp_path):
    assert project_root(tmp_path) == ROOT  # a user's archives folder
    assert project_root(ROOT) == ROOT


def test_ab_sides_know_the_users_archives_and_use_the_users_config(tmp_path):
    archive = ForeignArchive("mine", tmp_path / "mine.mar", tmp_path)
    assert users_config(tmp_path, ROOT) is None  # no config.properties of the user's: each version's own
    (tmp_path / "config.properties").write_text("inference_address=http://127.0.0.1:8080\n")
    side = SideCatalog(ROOT, [archive], users_config(tmp_path, ROOT))
    assert side.foreign == {"mine": archive} and "mine" in side.targets
    assert side.config_template == tmp_path / "config.properties"
    assert SideCatalog(ROOT, [], users_config(ROOT, ROOT)).config_template == ROOT / "config.properties"


def test_compare_without_a_point_in_common_names_the_targets_of_each(tmp_path):
    old = write_results(tmp_path / "old", [record("mine-1", "mine", 100.0, 100.0)])
    new = write_results(tmp_path / "new", [record("theirs-1", "theirs", 100.0, 100.0)])
    with pytest.raises(UsageError, match="no point in common .*old measured mine; new measured theirs"):
        compare(CompareRun(old, new))
    same = write_results(tmp_path / "same", [record("mine-2", "mine", 100.0, 100.0)])
    with pytest.raises(UsageError, match=r"the same targets \(mine\) at other points of the space"):
        compare(CompareRun(old, same))


def test_compare_names_a_members_inputs_as_its_parents_answers(tmp_path):
    setup = {"load": "a", "inputs": "b", "recipe": "c", "server": "d"}
    suite = "targets: [{name: wf, archive: 's3://bucket/wf.war?x=1', members: true}]\n"
    rows = [record("wf-enc-1", "wf-enc", 100.0, 100.0, point_key="k", setup=setup)]
    old = write_results(tmp_path / "old", rows)
    new = write_results(tmp_path / "new", [{**rows[0], "run_id": "wf-enc-2", "setup": {**setup, "inputs": "e", "recipe": "f"}}])
    for folder in (old, new):
        (folder / "suite.yaml").write_text(suite)
    with pytest.raises(UsageError) as refused:
        compare(CompareRun(old, new))
    assert "wf-enc wf-enc-1 vs wf-enc-2: measured with other inputs (what its parent node answers" in str(refused.value)
    assert "archive (the .mar of its node of s3://bucket/wf.war?x=1 is not the file it was)" in str(refused.value)
