"""`segserve results query RESULTS... --where 'latency_p99_ms<50' --sort -throughput_rps --limit 10`: one table
of the rows of any number of result folders (their summary.jsonl: one row per point; with --pipelines their
pipelines.jsonl: one row per pipeline of the efficiency table), each row with the suite and timestamp of its
run, filtered, sorted and cut; as a table, CSV or JSON (a list of row objects)."""

import csv
import io
import json
import operator
import re
import tempfile
from pathlib import Path

from segserve.archives.catalog import unknown
from segserve.bench.results.render import render_table
from segserve.bench.results.store import read_pipelines, read_summary
from segserve.bench.suite.params import PARAMS
from segserve.errors import UsageError

# longest first, so that `<=` is not read as `<`
OPERATORS = {"<=": operator.le, ">=": operator.ge, "!=": operator.ne, "<": operator.lt, ">": operator.gt, "=": operator.eq}
CONDITION = re.compile(r"^\s*([A-Za-z_][\w.]*)\s*(<=|>=|!=|<|>|=)\s*(.*?)\s*$")
RUN_KEYS = ("suite", "timestamp")  # what each row gets from the folder it came from


def result_folders(paths: list[str], downloads: Path | None = None, endpoint_url: str | None = None) -> list[Path]:
    """Result folders from the arguments: a folder with summary.jsonl, any folder above such folders (results/,
    results/<suite>/), searched below, or an s3:// prefix that `--export` wrote to (its summary.jsonl and
    pipelines.jsonl files are downloaded into `downloads`)."""
    found = []
    for text in paths:
        path = Path(text)
        if text.startswith("s3://"):
            from segserve.bench.results.export import download_summaries

            found += download_summaries(text, downloads / str(len(found)), endpoint_url)
            continue
        if (path / "summary.jsonl").is_file():
            found.append(path)
        elif path.is_dir():
            below = sorted(p.parent for p in path.rglob("summary.jsonl"))
            if not below:
                raise UsageError(f"{path}: no result folder (summary.jsonl) in it")
            found += below
        else:
            raise UsageError(f"{path}: no such folder")
    return list(dict.fromkeys(found))


def rows_of(folders: list[Path], read=read_summary) -> list[dict]:
    """Each run's rows (read: read_summary, or read_pipelines) once: a run given twice (its local folder and its
    export to S3) is one run."""
    rows, seen = [], set()
    for folder in folders:
        suite, timestamp = folder.parent.name, folder.name  # results/<suite>/<timestamp>/
        if (suite, timestamp) not in seen:
            seen.add((suite, timestamp))
            rows += [{"suite": suite, "timestamp": timestamp, **row} for row in read(folder)]
    return rows


def unknown_column(column: str, columns: list[str]) -> str:
    """No such column; for a parameter (`batch_size`, a node's `tiny_workers`) also why: a summary has a column for
    a parameter only where the run swept it (more than one value)."""
    text = unknown("column", column, columns)
    if any(column == name or column.endswith(f"_{name}") for name in PARAMS):
        text += (
            f"; a run has a {column} column only where its suite swept it (more than one value): one value is in "
            "its suite.yaml and runs/*.json"
        )
    return text


def _number(text: str):
    try:
        return float(text)
    except ValueError:
        return None


def parse_condition(text: str, columns: list[str]):
    """'latency_p99_ms<50' → a test of a row; numbers compare as numbers, anything else as text."""
    match = CONDITION.match(text)
    if not match:
        raise UsageError(f"--where {text!r}: give COLUMN OP VALUE with OP one of {', '.join(OPERATORS)} (latency_p99_ms<50)")
    column, op, wanted = match.groups()
    if columns and column not in columns:  # no rows at all (no run measured a pipeline): nothing to check against
        raise UsageError(f"--where {text!r}: {unknown_column(column, columns)}")
    compare, number = OPERATORS[op], _number(wanted)

    def test(row: dict) -> bool:
        value = row.get(column)
        if value is None:
            return op == "!="  # a missing value differs from any value, and meets no other condition
        if number is not None and isinstance(value, int | float) and not isinstance(value, bool):
            return compare(value, number)
        if isinstance(value, bool):
            return compare(str(value).lower(), wanted.lower())
        return compare(str(value), wanted)

    return test


def query(
    paths: list[str],
    where: list[str],
    sort: str | None,
    limit: int | None,
    endpoint_url: str | None = None,
    pipelines: bool = False,
) -> tuple[list[dict], list[str]]:
    """(the matching rows, their columns: suite and timestamp first, then every column in first-seen order);
    the rows are the points (summary.jsonl), or with `pipelines` the efficiency table's rows (pipelines.jsonl)."""
    with tempfile.TemporaryDirectory(prefix="segserve-query-") as downloads:
        rows = rows_of(result_folders(paths, Path(downloads), endpoint_url), read_pipelines if pipelines else read_summary)
    columns = list(dict.fromkeys(key for row in rows for key in row))
    tests = [parse_condition(text, columns) for text in where]
    chosen = [row for row in rows if all(test(row) for test in tests)]
    if sort:
        column, descending = sort.lstrip("-+"), sort.startswith("-")
        if columns and column not in columns:
            raise UsageError(f"--sort {sort!r}: {unknown_column(column, columns)}")
        present = [r for r in chosen if r.get(column) is not None]
        missing = [r for r in chosen if r.get(column) is None]  # last, whichever the direction
        present.sort(key=lambda r: (isinstance(r[column], str), r[column]), reverse=descending)
        chosen = present + missing
    if limit is not None:
        if limit < 1:
            raise UsageError(f"--limit must be ≥ 1 (got {limit})")
        chosen = chosen[:limit]
    return chosen, columns


# what a table shows by default: the run, the point and the headline metrics (csv and json carry every column)
TABLE_COLUMNS = (
    "suite",
    "timestamp",
    "run_id",
    "target",
    "workers",
    "batch_size",
    "max_batch_delay_ms",
    "concurrency",
    "throughput_rps",
    "latency_p50_ms",
    "latency_p99_ms",
    "requests_failed",
    "error",
)
# the same for --pipelines: each pipeline's rate, its bounds and the ratios (a withheld ratio shows its note)
PIPELINE_TABLE_COLUMNS = (
    "suite",
    "timestamp",
    "pipeline",
    "pipeline_rps",
    "feasible",  # no: its best served point, flagged (a workflow that stalled or lost answers keeps its row)
    "lost_answers",
    "members",
    "shared_bound_rps",
    "ratio_shared",
    "disjoint_bound_rps",
    "ratio_disjoint",
    "ratio_bare",
)


def render(rows: list[dict], columns: list[str], fmt: str, where: list[str], sort: str | None, pipelines: bool = False) -> str:
    if fmt == "json":
        return json.dumps(rows, default=str)
    if fmt == "csv":
        out = io.StringIO()
        writer = csv.DictWriter(out, fieldnames=columns, restval="", extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)
        return out.getvalue().rstrip("\n")
    if not rows and pipelines and not columns:  # not one pipeline in any folder: say where they come from
        return "no pipeline row: a run has one only where it measured a DAG target and each of its members (the report's efficiency table)"
    named = [CONDITION.match(c).group(1) for c in where] + [(sort or "").lstrip("-+")]  # conditions parsed already
    shown = [c for c in dict.fromkeys([*(PIPELINE_TABLE_COLUMNS if pipelines else TABLE_COLUMNS), *named]) if c in columns]
    return render_table(rows, shown) if rows else "no row matches"
