"""The bench's progress: one line per measured point, with a bar, an ETA and what went wrong."""

import time

from segserve.bench.run.failures import failure_line
from segserve.bench.suite.plan import Point
from segserve.shown_text import for_terminal


class Progress:
    """One line per finished point, with a bar and an ETA from the mean time per point so far."""

    def __init__(self, total: int, log):
        self.total, self.log, self.done, self.started = max(total, 1), log, 0, time.monotonic()

    def step(self, point: Point, record: dict, elapsed_s: float) -> None:
        self.done += 1
        eta_s = (time.monotonic() - self.started) / self.done * max(self.total - self.done, 0)
        bar = "#" * min(20, round(20 * self.done / self.total))
        params = " ".join(f"{k}={v}" for k, v in point.params.items())
        if record["error"]:
            outcome = f"FAILED {record['error']}"
        else:
            outcome = f"{record['throughput_rps']:.1f} req/s, p99 {record['latency_p99_ms'] or float('nan'):.0f} ms"
            if record.get("error_cause"):
                outcome += f", {record.get('requests_failed')} failed: {record['error_cause']}"
            if record.get("autoscale"):
                outcome += f", the autoscaler moved {record.get('autoscaler_moves')} worker(s)"
                outcome += f" (it died: {record['autoscaler_failure']})" if record.get("autoscaler_failure") else ""
            if record.get("pruned"):
                outcome += f", pruned after {record['windows']} window(s) (hopeless)"
            if record.get("windows_discarded"):
                outcome += f", {record['windows_discarded']} disturbed window(s) measured again"
            if record.get("stall_cause"):  # the server's own: a drop it explains is not others' doing
                outcome += f", STALLED ({record['stall_cause']})"
            elif record.get("lost_cause"):  # a stall's cause says it already
                outcome += f", ANSWERS LOST ({record['lost_cause']})"
            if record.get("disturbed"):
                outcome += f", DISTURBED (others took {record.get('others_cpu_pct') or 0:.0f}% of the machine)"
            if record.get("bare_disturbed"):
                outcome += f", its bare forward DISTURBED (others took {record.get('bare_others_cpu_pct') or 0:.0f}% of the machine)"
        # errors, causes and input names come from outside (workers, answers, files): shown, never obeyed (ANSI, CR)
        line = f"[{bar:<20}] {self.done}/{self.total} {point.target} {params}: {outcome} ({elapsed_s:.0f}s; ETA {eta_s / 60:.1f} min)"
        self.log(for_terminal(line))
        if failed := failure_line(point.run_id, record.get("failures")):
            self.log(for_terminal(failed))
