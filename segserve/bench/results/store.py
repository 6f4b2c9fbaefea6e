"""Result folders on disk: summary.csv / summary.jsonl (one row per point), pipelines.jsonl (one row per pipeline
of the efficiency table) and the per-point run JSONs.

The one reader of results: the report, `bench compare`, `pin --plan-from` and the sinks go through it.
"""

import csv
import json
from pathlib import Path

from segserve.bench.suite.columns import BASE_COLUMNS, EXTRA_COLUMNS

# In summary.jsonl besides the columns: what `bench compare` needs to tell points measured differently apart.
IDENTITY_KEYS = ("point_key", "setup")


def summary_columns(swept: list[str]) -> list[str]:
    fixed = BASE_COLUMNS + EXTRA_COLUMNS
    return BASE_COLUMNS + [p for p in dict.fromkeys(swept) if p not in fixed] + EXTRA_COLUMNS


def write_summary(out_dir: Path, records: list[dict], swept: list[str]) -> None:
    """summary.csv (fixed columns, one row per record, None → empty cell) and summary.jsonl (same keys, and
    the point's identity: point_key and setup)."""
    columns = summary_columns(swept)
    with open(out_dir / "summary.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=columns, restval="", extrasaction="ignore")
        writer.writeheader()
        # the csv module writes None as an empty cell; a mapping (lost_answers) as JSON, not Python's repr
        writer.writerows({k: json.dumps(v) if isinstance(v, dict) else v for k, v in record.items()} for record in records)
    with open(out_dir / "summary.jsonl", "w") as f:
        for record in records:
            f.write(_json_line({c: record.get(c) for c in [*columns, *IDENTITY_KEYS]}))


def _json_line(row: dict) -> str:
    # numpy scalars may slip into records; a crash here would lose a finished benchmark
    return json.dumps(row, default=lambda v: v.item() if hasattr(v, "item") else str(v)) + "\n"


def read_summary(result_dir: Path) -> list[dict]:
    """The rows of a results folder's summary.jsonl (or of that file, given itself)."""
    path = Path(result_dir) if Path(result_dir).is_file() else Path(result_dir) / "summary.jsonl"
    if not path.is_file():
        raise FileNotFoundError(
            f"{path}: no summary.jsonl here; pass a results folder written by `segserve bench` (results/<suite>/<timestamp>/)"
        )
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def write_pipelines(out_dir: Path, rows: list[dict]) -> None:
    """pipelines.jsonl: the efficiency table's rows (Analysis.efficiency) with every key as it is: the bounds,
    the ratios, their intervals and the notes of those withheld as uncertain. Written also when empty, so that
    a run without pipelines is told apart from one older than this file."""
    with open(out_dir / "pipelines.jsonl", "w") as f:
        f.writelines(_json_line(row) for row in rows)


def read_pipelines(result_dir: Path) -> list[dict]:
    """The rows of a results folder's pipelines.jsonl; none where it has no such file (a run from before it)."""
    path = Path(result_dir) / "pipelines.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.is_file() else []


def read_runs(out_dir: Path) -> dict[str, dict]:
    """The run JSONs of a results folder by run id (what --resume keeps)."""
    return {path.stem: json.loads(path.read_text()) for path in sorted((Path(out_dir) / "runs").glob("*.json"))}
