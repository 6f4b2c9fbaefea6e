"""A study shared by several searches (as bench processes share one through --storage), the heartbeat hand-over,
the pruner, `bench collect`, and storage errors. Real Optuna storages (journal file, SQLite); no server."""

import time

from segserve.bench.search import study
from tests.unit.test_search import record, space
from tests.unit.test_study import shared  # noqa: F401 (fixtures among them)


def test_a_dead_process_hands_its_point_to_another_through_the_heartbeat(tmp_path):
    """A search that stops beating (its process died mid-point) has its trial failed once the grace period is over
    and retried: the next search proposes that very point."""
    url = f"sqlite:///{tmp_path / 'study.db'}"
    points = space()[:6]
    dying = shared(study.open_storage(url, None, heartbeat_s=1), 0, points, limit=6, name="heartbeat")
    lost = dying.ask()
    dying.heartbeat.stop()  # killed: no tell, no close
    time.sleep(3 * 1 + 1.5)  # the grace period is 3 heartbeats
    other = shared(study.open_storage(url, None, heartbeat_s=1), 5, points, limit=6, name="heartbeat")
    proposed = other.ask()
    assert proposed.run_id == lost.run_id
    other.tell(proposed, record(proposed))
    other.close()
    assert [r["run_id"] for r in study.study_records(other.study)] == [lost.run_id]
