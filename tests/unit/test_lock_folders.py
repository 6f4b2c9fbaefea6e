"""The claims of ports and worker-socket ranges live in a folder of the user's own in the shared /tmp: mode 0700,
and a link (in place of the folder or of a claim file) is refused, never followed."""

import os
import stat

import pytest

from segserve.errors import RuntimeFailure
from segserve.serving import ts_config


def test_port_claims_are_in_a_folder_of_the_users_own_with_mode_0700():
    ts_config.release_ports([ts_config.free_port()])
    for folder in (ts_config.PORT_CLAIMS_DIR.parent, ts_config.PORT_CLAIMS_DIR):
        found = os.lstat(folder)
        assert stat.S_ISDIR(found.st_mode) and found.st_uid == os.getuid(), folder
        assert stat.S_IMODE(found.st_mode) == 0o700, (folder, oct(found.st_mode))
    assert str(os.getuid()) in str(ts_config.PORT_CLAIMS_DIR)


def test_a_link_in_place_of_the_claims_folder_is_refused_not_followed(tmp_path, monkeypatch):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(mode=0o700)
    (tmp_path / "root").symlink_to(elsewhere)
    monkeypatch.setattr(ts_config, "PORT_CLAIMS_DIR", tmp_path / "root" / "ports")
    with pytest.raises(RuntimeFailure, match=r"root: expected a folder of user \d+ with mode 0700 \(got mode l"):
        ts_config.free_port()
    assert list(elsewhere.iterdir()) == []  # nothing was made through the link


def test_a_claims_folder_open_to_others_is_refused(tmp_path, monkeypatch):
    (tmp_path / "root").mkdir()
    os.chmod(tmp_path / "root", 0o777)
    monkeypatch.setattr(ts_config, "PORT_CLAIMS_DIR", tmp_path / "root" / "ports")
    with pytest.raises(RuntimeFailure, match=r"got mode drwxrwxrwx.*remove it"):
        ts_config.free_port()


def test_a_link_in_place_of_a_claim_file_is_refused_not_followed(tmp_path, monkeypatch):
    root, target = tmp_path / "root", tmp_path / "victim"
    (root / "worker-bases").mkdir(parents=True, mode=0o700)
    os.chmod(root, 0o700)
    target.write_text("kept")
    monkeypatch.setattr(ts_config, "WORKER_BASE_CLAIMS_DIR", root / "worker-bases")
    (root / "worker-bases" / "20000").symlink_to(target)
    with pytest.raises(RuntimeFailure, match=r"worker-bases/20000: Too many levels of symbolic links"):
        ts_config._claim(ts_config.WORKER_BASE_CLAIMS_DIR, 20000)
    assert target.read_text() == "kept"
