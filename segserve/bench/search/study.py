"""Where an optuna search keeps its trials (an Optuna storage), so that several `segserve bench` processes, each
with its own TorchServe, share one study; and `segserve bench collect`, one result folder from all of them.

- no --storage: an embedded journal file in the result folder (`study.log`, nothing to start; one process);
- a database URL (`postgresql://user:password@host/db`, `sqlite:///path`): Optuna's RDBStorage, with heartbeats
  so that a trial whose process died is failed and handed to another process (RetryFailedTrialCallback);
- anything else: a journal file at that path (processes on one machine).

Every measured trial carries its whole record (user attribute "record") and the point it measured ("point"), so
the study alone is enough to write the collected results.
"""

import json
import threading
import time
import warnings
from pathlib import Path

from segserve.archives.archive_urls import masked_text
from segserve.errors import UsageError

OPEN_ATTEMPTS = 3  # a database storage is opened this many times before it counts as unreachable
HEARTBEAT_S = 20  # a trial's process records it this often; one silent for 3 intervals is failed and retried
STUDY_FILE = "study.log"


def is_database(url: str) -> bool:
    return "://" in url


def display_url(url: str) -> str:
    """The URL with its password left out (errors and logs)."""
    if not is_database(url):
        return url
    from sqlalchemy.engine import make_url

    try:
        return make_url(url).render_as_string(hide_password=True)
    except Exception:  # not a URL SQLAlchemy reads: keep only the scheme and what follows the last @
        scheme, rest = url.split("://", 1)
        return f"{scheme}://***@{rest.rsplit('@', 1)[-1]}" if "@" in rest else url


def open_storage(url: str | None, out_dir: Path | None, heartbeat_s: int = HEARTBEAT_S):
    """The Optuna storage a search keeps its trials in; a database that cannot be reached is refused here,
    before any server starts (out_dir None: in memory, as --dry-run checks)."""
    import optuna
    from optuna.storages import JournalStorage, RDBStorage, RetryHeartbeatStaleTrialCallback
    from optuna.storages.journal import JournalFileBackend

    if url is None:
        return JournalStorage(JournalFileBackend(str(out_dir / STUDY_FILE))) if out_dir else optuna.storages.InMemoryStorage()
    if not is_database(url):
        path = Path(url)
        if not path.parent.is_dir():
            raise UsageError(f"--storage {url}: the folder {path.parent} does not exist")
        return JournalStorage(JournalFileBackend(str(path)))
    connect = {"connect_timeout": 10} if url.startswith("postgresql") else {}
    attempt = 0
    while True:
        try:
            with warnings.catch_warnings():  # heartbeats and their retry callback are "experimental" in Optuna 5
                warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
                return RDBStorage(
                    url,
                    engine_kwargs={"connect_args": connect, "pool_pre_ping": True},
                    heartbeat_interval=heartbeat_s,
                    grace_period=3 * heartbeat_s,
                    heartbeat_stale_trial_callback=RetryHeartbeatStaleTrialCallback(max_retry=2),
                )
        except Exception as error:
            attempt += 1
            # two processes starting on an empty database both create Optuna's tables and one loses with a unique
            # violation: the tables exist now, so the next attempt opens them (a refused connection is final)
            if attempt < OPEN_ATTEMPTS and "refused" not in str(error).lower():
                time.sleep(attempt)
                continue
            reason = str(error).splitlines()[0] if str(error) else type(error).__name__
            password = _password(url)
            if password:  # a driver's message can quote the URL: never print its password
                reason = reason.replace(password, "***")
            raise UsageError(f"--storage {display_url(url)}: cannot open the study storage ({reason})") from None


def _password(url: str) -> str | None:
    from sqlalchemy.engine import make_url

    try:
        return make_url(url).password
    except Exception:
        return None


class Heartbeat:
    """Records a heartbeat for each trial this process has running, every interval, from a daemon thread (what
    Optuna's optimize() does for its own trials; a search that asks and tells needs it too)."""

    def __init__(self, storage, trial_ids):
        self.storage, self.trial_ids = storage, trial_ids  # trial_ids(): the ids running now
        self.interval_s = storage.get_heartbeat_interval() if hasattr(storage, "get_heartbeat_interval") else None
        self.stopped = threading.Event()
        self.thread = None
        if self.interval_s:
            self.thread = threading.Thread(target=self.beat, name="segserve-heartbeat", daemon=True)
            self.thread.start()

    def beat(self) -> None:
        while not self.stopped.wait(self.interval_s):
            for trial_id in self.trial_ids():
                try:
                    self.storage.record_heartbeat(trial_id)
                except Exception:  # the database away for a moment: the next beat tries again
                    pass

    def now(self, trial_id: int) -> None:
        """A first heartbeat for a trial just asked (a trial without one is never counted stale)."""
        if self.interval_s:
            self.storage.record_heartbeat(trial_id)

    def stop(self) -> None:
        self.stopped.set()


def study_records(study) -> list[dict]:
    """The records the study's trials measured, one per point (the first finished one), in trial order."""
    from optuna.trial import TrialState

    records: dict[str, dict] = {}
    for trial in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL)):
        record = trial.user_attrs.get("record")
        if record is not None and record["run_id"] not in records:
            records[record["run_id"]] = record
    return list(records.values())


def save_suite(study, suite_path: Path) -> None:
    """The suite a study measures, kept in the study (collect writes the folder from it)."""
    if "suite_yaml" not in study.user_attrs:
        study.set_user_attr("suite_yaml", masked_text(suite_path.read_text()))  # no URL's credentials in a shared database


def record_for_storage(record: dict) -> dict:
    """A record as JSON keeps it (what runs/*.json hold)."""
    return json.loads(json.dumps(record, default=str))
