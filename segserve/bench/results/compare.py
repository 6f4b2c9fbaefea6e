"""`segserve bench compare OLD NEW`: join two result folders on run id and decide, from each point's measured
windows, whether its throughput changed (faster / slower / no detectable change / too noisy to tell).

Points measured differently (other load settings, inputs, archive recipe or server config) have other run
ids; when such a pair shares a place in the space (point_key) the comparison is refused, saying what differs.
"""

from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from urllib.parse import urlsplit

import numpy as np
import yaml

from segserve.bench.results.render import cell
from segserve.bench.results.stats import uncertainty
from segserve.bench.results.store import read_runs, read_summary
from segserve.errors import UsageError
from segserve.machine.identity import differences, identified, label, machines_of
from segserve.shown_text import for_terminal


def archive_targets(folder: Path) -> dict[str, str]:
    """The archive targets of the run's suite (its suite.yaml) → what changed when their run id did, in words.
    The members of a `members: true` .war are `<name>-<node>`: their key is the prefix `<name>-`."""
    path = Path(folder) / "suite.yaml"
    try:
        targets = (yaml.safe_load(path.read_text()) or {}).get("targets") or []
    except (OSError, yaml.YAMLError, AttributeError):
        return {}
    found = {}
    for target in targets:
        name, archive = (target.get("name"), target.get("archive")) if isinstance(target, dict) else (None, None)
        if isinstance(name, str) and isinstance(archive, str):
            war = PurePosixPath(urlsplit(archive).path).suffix == ".war"
            found[name] = f"{archive}{', or a .mar its nodes name,' if war else ''} is not the file it was"
            if target.get("members"):
                found[f"{name}-"] = f"the .mar of its node of {archive} is not the file it was"
    return found


def differing_parts(target: str, parts: list[str], archives: dict[str, str]) -> str:
    """What differs, in the user's words: an archive target's recipe is its archive, a member's inputs are what its
    parent node answers; a catalog target's parts as its setup names them."""
    member = next((what for name, what in archives.items() if name.endswith("-") and target.startswith(name)), None)
    archive = archives.get(target, member)
    if archive is None:
        return ", ".join(parts) or "settings"
    words = {
        "recipe": f"archive ({archive})",
        "inputs": "inputs (what its parent node answers: that node was measured differently)" if member else "inputs",
        "server": "server config (config.properties, core plan)",
    }
    return ", ".join(words.get(part, part) for part in parts) or "settings"


def measured_differently(old: list[dict], new: list[dict], archives: dict[str, str] | None = None) -> list[str]:
    """One line per point that both folders hold with another setup, naming the parts that differ."""
    old_by_key = {r["point_key"]: r for r in old if r.get("point_key")}
    lines = []
    for after in new:
        before = old_by_key.get(after.get("point_key"))
        if before is None or before["run_id"] == after["run_id"]:
            continue
        parts = sorted(
            k
            for k in set(before.get("setup") or {}) | set(after.get("setup") or {})
            if (before.get("setup") or {}).get(k) != (after.get("setup") or {}).get(k)
        )
        what = differing_parts(after["target"], parts, archives or {})
        lines.append(f"{after['target']} {before['run_id']} vs {after['run_id']}: measured with other {what}")
    return lines


ARCHIVE_CHANGED = (
    "an archive target's run ids hold its archive's digest, so a rebuilt .mar/.war is another setup, not another "
    "version of the code: to measure two builds against each other, give both as targets of one suite "
    "({name: old, archive: old/model.mar}, {name: new, archive: model.mar}) and read its report"
)


VERDICTS = ("slower", "faster", "no detectable change", "too noisy to tell")


@dataclass(frozen=True)
class Change:
    """New vs old mean window throughput: the relative change, its 95% interval (Welch) and what to conclude."""

    change: float | None
    low: float | None
    high: float | None
    verdict: str

    def uncertain(self) -> str | None:
        """Why new ÷ old is not printed as a number (its interval wider than ±15% of it), or None."""
        if self.change is None:
            return None
        return uncertainty(1 + self.change, (1 + self.low, 1 + self.high))

    def text(self) -> str:
        """The change and its interval, or only the interval where it is too wide for a number; the verdict
        judges the interval itself (a slowdown whose whole interval is below -min_effect is one, however wide)."""
        if self.change is None:
            return self.verdict
        if self.uncertain():
            return f"new ÷ old {self.uncertain()}; {self.verdict}"
        return f"{self.change:+.1%} [{self.low:+.1%}, {self.high:+.1%}] {self.verdict}"


def throughput_change(old_windows: list[float], new_windows: list[float], min_effect: float) -> Change:
    """Welch's t-test (scipy) over the windows of a point measured twice. A slowdown (or speed-up) is detected
    when the whole 95% interval is on one side of zero and the change is larger than `min_effect`; an interval
    inside ±min_effect is "no detectable change"; anything wider is "too noisy to tell"."""
    if len(old_windows) < 2 or len(new_windows) < 2 or not np.mean(old_windows):
        return Change(None, None, None, "too noisy to tell")
    from scipy import stats

    old, new = np.asarray(old_windows, dtype=float), np.asarray(new_windows, dtype=float)
    base = old.mean()
    change = new.mean() / base - 1
    if np.ptp(old) == 0 and np.ptp(new) == 0:
        low = high = change
    else:
        interval = stats.ttest_ind(new, old, equal_var=False).confidence_interval(0.95)
        low, high = interval.low / base, interval.high / base
    return Change(float(change), float(low), float(high), verdict_of(change, low, high, min_effect))


def paired_change(old_rounds: list[float], new_rounds: list[float], min_effect: float) -> Change:
    """The change of a point measured in rounds, old and new side by side in each (`bench ab`): the mean of the
    rounds' relative changes with its 95% interval (one-sample t over the rounds, scipy). Each round has fresh
    workers on both sides, so a worker that happens to run fast or slow for its whole life (measured: ±10% from
    one registration to the next on 2 cores) is one round's noise, not a difference between the versions."""
    pairs = [(old, new) for old, new in zip(old_rounds, new_rounds, strict=True) if old]
    if len(pairs) < 2:
        return Change(None, None, None, "too noisy to tell")
    return mean_change([new / old - 1 for old, new in pairs], min_effect)


def mean_change(values: list[float], min_effect: float) -> Change:
    """The mean of relative changes with its 95% interval (one-sample t, scipy) and the verdict."""
    from scipy import stats

    sample = np.asarray(values, dtype=float)
    mean = float(sample.mean())
    if np.ptp(sample) == 0:
        return Change(mean, mean, mean, verdict_of(mean, mean, mean, min_effect))
    interval = stats.ttest_1samp(sample, 0.0).confidence_interval(0.95)
    return Change(mean, float(interval.low), float(interval.high), verdict_of(mean, interval.low, interval.high, min_effect))


def verdict_of(change: float, low: float, high: float, min_effect: float) -> str:
    if high < 0 and change < -min_effect:
        return "slower"
    if low > 0 and change > min_effect:
        return "faster"
    if (low >= -min_effect and high <= min_effect) or high < 0 or low > 0:
        return "no detectable change"  # within the minimum effect, or a real change smaller than it
    return "too noisy to tell"


def overall_change(changes: list[Change], min_effect: float) -> Change:
    """The suite's verdict: the mean of the points' relative changes with its 95% interval (one-sample t over the
    points, scipy). A slow spell that hits one point's A or B measurement moves one change of many, while a
    slower handler moves them all, so the suite decides better than any one point; with one point, its own."""
    measured = [c for c in changes if c.change is not None]
    if len(measured) < 2:
        return measured[0] if measured else Change(None, None, None, "too noisy to tell")
    return mean_change([c.change for c in measured], min_effect)


def windows_of(record: dict) -> list[float]:
    return record.get("measured_window_throughputs_rps") or []


def machine_lines(old_runs: dict, new_runs: dict, across_machines: bool) -> list[str]:
    """[] when both folders were measured on one machine; else what differs, or UsageError unless asked: a
    configuration that wins on one CPU (int8 with VNNI) may lose on another, so a change between machines is not
    a change of the code."""
    old, new = machines_of(old_runs.values()), machines_of(new_runs.values())
    if not old or not new:
        return []
    differ = sorted({key for a in old for b in new for key in differences(a, b)})
    if not differ:
        unknown = [side for side, machines in (("old", old), ("new", new)) if not all(identified(m) for m in machines)]
        # a folder from before the CPU was identified: the same CPU name and cores is all that can be told
        return [f"note: {' and '.join(unknown)} recorded no CPU identity: compared by CPU name and cores only"] if unknown else []
    lines = [f"old measured on {', '.join(label(m) for m in old)}", f"new measured on {', '.join(label(m) for m in new)}"]
    if not across_machines:
        raise UsageError("\n".join([f"cannot compare: the two runs come from different machines ({', '.join(differ)} differ)", *lines,
                                     "pass --across-machines to compare them anyway"]))  # fmt: skip
    return [f"ACROSS MACHINES ({', '.join(differ)} differ): a change here is the machine's as much as the code's", *lines]


def targets_of(old_rows: list[dict], new_rows: list[dict]) -> str:
    """Which targets each folder measured, or that they are the same ones at other parameter values."""
    old, new = (list(dict.fromkeys(r.get("target") for r in rows)) for rows in (old_rows, new_rows))
    if set(old) == set(new):
        return f"the same targets ({', '.join(map(str, old))}) at other points of the space"
    return f"old measured {', '.join(map(str, old))}; new measured {', '.join(map(str, new))}"


@dataclass(frozen=True)
class CompareRun:
    """`segserve bench compare OLD NEW`'s options."""

    old_dir: Path
    new_dir: Path
    min_effect: float = 0.05  # a change smaller than this share is "no detectable change"
    across_machines: bool = False  # compare folders measured on different machines (else refused)


def compare(run: CompareRun) -> tuple[str, bool]:
    """Join two result folders on run id and judge each point's throughput change from its windows, then the
    suite's (overall_change); the second value is True only on a detected slowdown of the suite larger than
    min_effect, or a point that now fails. Folders from different machines are refused unless across_machines."""
    old_dir, new_dir, min_effect, across_machines = run.old_dir, run.new_dir, run.min_effect, run.across_machines
    old_rows, new_rows = read_summary(old_dir), read_summary(new_dir)
    archives = archive_targets(old_dir) | archive_targets(new_dir)
    differently = measured_differently(old_rows, new_rows, archives)
    if differently:
        hint = [ARCHIVE_CHANGED] if any("measured with other archive" in line for line in differently) else []
        raise UsageError("\n".join(["cannot compare: points were measured differently", *differently, *hint]))
    old = {r["run_id"]: r for r in old_rows}
    new = {r["run_id"]: r for r in new_rows}
    if old and new and not set(old) & set(new):
        raise UsageError(
            f"{old_dir} and {new_dir} have no point in common (other suites, or run ids from before 3851533, which "
            f"changed their form): nothing to compare; {targets_of(old_rows, new_rows)}"
        )
    old_runs, new_runs = read_runs(old_dir), read_runs(new_dir)  # the windows and the machine live in the run JSONs
    lines, slower, changes = machine_lines(old_runs, new_runs, across_machines), False, []
    for run_id in [i for i in old if i in new]:
        before, after = old[run_id], new[run_id]
        if after.get("error") and not before.get("error"):
            # a point that used to work and now fails is the worst regression there is
            slower = True
            lines.append(f"{run_id}: now failing: {for_terminal(after['error'])} REGRESSED")  # a worker's words, shown
            continue
        change = throughput_change(windows_of(old_runs.get(run_id, {})), windows_of(new_runs.get(run_id, {})), min_effect)
        changes.append(change)
        a, b = before.get("throughput_rps"), after.get("throughput_rps")
        p99 = f"; latency_p99_ms {cell(before.get('latency_p99_ms'))} → {cell(after.get('latency_p99_ms'))}"
        lines.append(f"{run_id}: throughput_rps {cell(a)} → {cell(b)} {change.text()}{p99}")
    lines += [f"{run_id}: only in old ({old_dir})" for run_id in old if run_id not in new]
    lines += [f"{run_id}: only in new ({new_dir})" for run_id in new if run_id not in old]
    overall = overall_change(changes, min_effect)
    lines.append(f"overall ({len(changes)} point(s), min effect {min_effect:.0%}): {overall.text()}")
    return "\n".join(lines), slower or overall.verdict == "slower"
