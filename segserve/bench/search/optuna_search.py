"""optuna: Optuna's GP or TPE sampler over the grid's lists (numbers as ordered indices, the rest as
categories); the suite's constraints as Optuna constraints (Trial.set_constraint), so infeasible points
steer the search; one objective, or two for a Pareto front. With `batch` > 1 it proposes that many points
at a time, measured in the grid's order, so that server restarts and re-registrations stay rare."""

import random
import time
import warnings

from segserve.bench.search.interface import Search, ordered, sorted_values
from segserve.bench.suite.columns import METRICS
from segserve.bench.suite.plan import Point


def constraint_violations(record: dict, constraints: dict[str, dict]) -> dict[str, float]:
    """Optuna's form of the suite's constraints: one value per bound (`latency_p99_ms_max`), ≤ 0 when it is met."""
    values = {}
    for tag, bounds in constraints.items():
        value = record.get(tag)
        for side, sign in (("max", 1.0), ("min", -1.0)):
            if side in bounds:
                values[f"{tag}_{side}"] = 1.0 if value is None else sign * (value - bounds[side])
    return values


class Space:
    """The grid's lists as Optuna parameters: numbers as indices into their sorted values (so the sampler sees
    their order), anything else as a category; with several targets, the target first, then the parameters it
    has (a conditional space). A suggestion the grid does not hold maps to the nearest point it does."""

    def __init__(self, points: list[Point]):
        self.targets = list(dict.fromkeys(p.target for p in points))
        self.points = {t: [p for p in points if p.target == t] for t in self.targets}
        self.values: dict[str, dict[str, list]] = {}
        for target, members in self.points.items():
            names = dict.fromkeys(name for p in members for name in p.params)
            self.values[target] = {name: sorted_values({p.params.get(name) for p in members}) for name in names}
        # a parameter with the same values in every target that has it is one Optuna parameter, so a sampler that
        # models only what all trials share (GP) learns it across targets; others are the target's own
        lists: dict[str, list] = {}
        for values in self.values.values():
            for param, options in values.items():
                lists.setdefault(param, []).append(options)
        self.shared = {param for param, options in lists.items() if all(o == options[0] for o in options)}

    def name(self, target: str, param: str) -> str:
        return param if param in self.shared else f"{target}.{param}"

    def suggest(self, trial) -> Point:
        target = self.targets[0] if len(self.targets) == 1 else trial.suggest_categorical("target", self.targets)
        chosen = {}
        for param, values in self.values[target].items():
            if len(values) == 1:
                chosen[param] = values[0]
            elif ordered(values):
                chosen[param] = values[trial.suggest_int(self.name(target, param), 0, len(values) - 1)]
            else:
                chosen[param] = trial.suggest_categorical(self.name(target, param), values)
        return min(self.points[target], key=lambda p: self.distance(target, p.params, chosen))

    def trial_params(self, point: Point) -> dict:
        """The parameters a trial must have to suggest this point (for enqueue_trial)."""
        params = {} if len(self.targets) == 1 else {"target": point.target}
        for param, values in self.values[point.target].items():
            if len(values) > 1:
                value = point.params.get(param)
                params[self.name(point.target, param)] = values.index(value) if ordered(values) else value
        return params

    def distance(self, target: str, params: dict, chosen: dict) -> float:
        total = 0.0
        for param, values in self.values[target].items():
            a, b = params.get(param), chosen.get(param)
            total += abs(values.index(a) - values.index(b)) if ordered(values) else float(a != b)
        return total


class OptunaSearch(Search):
    """Optuna's sampler over the grid's lists, told through an Optuna study, which may live in a shared storage
    (segserve/bench/search/study.py): then several bench processes ask the same study. Each point a trial proposes is
    claimed in the study (user attribute "point") before it is measured; a point another process has claimed is
    left to it, one it has measured is answered from its record, so no point is measured twice."""

    CLAIM_SETTLE_S = 0.5  # a shared study: how long another process may take between its ask and its claim
    MAX_REPEATS = 50  # suggestions of already-measured points before a random unmeasured one is taken
    PRUNE_AFTER_TRIALS = 5  # the pruner compares a point's windows with this many finished points at least

    def __init__(
        self,
        points: list[Point],
        limit: int | None = None,
        minutes: float | None = None,
        seed: int = 0,
        objectives: list[str] = ("throughput_rps",),
        constraints: dict | None = None,
        sampler: str = "tpe",
        storage=None,
        study_name: str | None = None,
        batch: int = 1,
    ):
        import optuna

        from segserve.bench.search.study import Heartbeat

        super().__init__(points, limit, minutes)
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        self.objectives, self.constraints = list(objectives), dict(constraints or {})
        self.space = Space(self.points)
        self.waiting: dict[str, list] = {}  # run id → this process's trials that proposed it, told when it is measured
        directions = ["maximize" if METRICS[o].higher_is_better else "minimize" for o in self.objectives]
        # hopeless points stop early: a point whose windows so far are below the median of the finished points' at the
        # same window (single objective only: Optuna prunes no multi-objective study)
        pruner = optuna.pruners.MedianPruner(n_startup_trials=self.PRUNE_AFTER_TRIALS, n_warmup_steps=1)
        storage = storage or optuna.storages.InMemoryStorage()
        self.study = optuna.create_study(directions=directions, storage=storage, study_name=study_name, load_if_exists=True, pruner=pruner)
        # a second process on a shared study must not propose the first one's random points in the same order
        self.sampler_name, self.seed = sampler, seed + len(self.study.get_trials(deepcopy=False))
        self.reseed(0)
        self.records: dict[str, dict] = {}  # run id → record, measured by any process of the study
        self.claimed: set[str] = set()  # run ids other processes are measuring now
        # Optuna's Trial has no public id; its storage needs one for heartbeats
        self.heartbeat = Heartbeat(storage, lambda: [t._trial_id for ts in self.waiting.values() for t in ts])
        self.queue: list[Point] = []
        self.backed_off = False  # the last batch lost a point to another process
        self.batch = batch  # points proposed at a time, measured in the grid's order: fewer restarts, less guidance
        self.refresh()

    def kept_study(self):
        return self.study

    def reseed(self, extra: int) -> None:
        """Seed the sampler with seed + extra: processes sharing a study pass their pid, so that they do not walk
        the same random points in step."""
        self.rng = random.Random(self.seed + extra)
        self.study.sampler = self.make_sampler(self.sampler_name, self.seed + extra, self.limit)

    @staticmethod
    def make_sampler(name: str, seed: int, limit: int | None):
        import optuna

        startup = max(3, min(10, (limit or 30) // 3))  # random trials before the model; a small budget needs a model early
        if name == "gp":
            return optuna.samplers.GPSampler(seed=seed, n_startup_trials=startup, warn_independent_sampling=False)
        with warnings.catch_warnings():  # group: "experimental" since 2.8, what conditional spaces need
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            return optuna.samplers.TPESampler(seed=seed, n_startup_trials=startup, multivariate=True, group=True, constant_liar=True)

    def refresh(self) -> None:
        """What the study knows now: the points measured (by any process) and the ones claimed by others."""
        from optuna.exceptions import ExperimentalWarning
        from optuna.storages import fail_stale_trials
        from optuna.trial import TrialState

        if self.heartbeat.interval_s:  # a process that stopped beating: its trials fail and are asked again
            with warnings.catch_warnings():  # "experimental" since 2.9
                warnings.simplefilter("ignore", ExperimentalWarning)
                fail_stale_trials(self.study)
        mine = {t._trial_id for ts in self.waiting.values() for t in ts}
        self.claimed = set()
        for trial in self.study.get_trials(deepcopy=False):
            record, point = trial.user_attrs.get("record"), trial.user_attrs.get("point")
            if record is not None:  # keyed by the point the trial claimed (a record's own run id may differ: replay)
                self.records.setdefault(point or record["run_id"], record)
            elif trial.state == TrialState.RUNNING and point and trial._trial_id not in mine:
                self.claimed.add(point)

    def used(self) -> int:
        return len({p.run_id for p in self.asked} | set(self.records) | self.claimed)

    def abandon_running(self) -> None:
        """Fail the trials an earlier process left running (a storage only this process uses: the result folder's
        journal on --resume, which has no heartbeat), so that their points are proposed again."""
        from optuna.trial import TrialState

        for trial in self.study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
            self.study.tell(trial.number, state=TrialState.FAIL)
        self.refresh()

    def propose(self) -> Point | None:
        for _ in range(self.MAX_REPEATS):  # a batch left to another process (both claimed it): ask again
            if self.queue or self.spent():
                break
            self.backed_off = False
            self.queue = self.next_batch()
            if not self.queue and not self.backed_off:
                break
        return self.queue.pop(0) if self.queue else None

    def answer(self, run_id: str) -> dict | None:
        return self.told.get(run_id) or self.records.get(run_id)

    def next_batch(self) -> list[Point]:
        from optuna.trial import TrialState

        self.refresh()
        room = self.batch if self.limit is None else min(self.batch, self.limit - self.used())
        taken = {p.run_id for p in self.asked}
        fresh: dict[str, Point] = {}
        repeats = 0
        while len(fresh) < room and repeats < self.MAX_REPEATS:
            trial = self.ask_trial()
            point = self.space.suggest(trial)
            known = self.answer(point.run_id)
            if known is not None:  # measured already: its answer, at no cost
                self.finish(trial, known)
                repeats += 1
                continue
            if point.run_id in self.claimed:  # another process measures it: its trial is told there
                self.study.tell(trial, state=TrialState.FAIL)
                repeats += 1
                continue
            self.waiting.setdefault(point.run_id, []).append(trial)  # told when the point is measured
            if point.run_id in taken or point.run_id in fresh:
                repeats += 1
                continue
            fresh[point.run_id] = point
        if not fresh and room > 0:  # the sampler keeps to measured points: take an unmeasured one, through the study
            rest = [p for p in self.unasked() if p.run_id not in self.records and p.run_id not in self.claimed]
            if not rest:
                return []
            point = self.rng.choice(rest)
            self.study.enqueue_trial(self.space.trial_params(point))
            trial = self.ask_trial()
            fresh[point.run_id] = self.space.suggest(trial)
            self.waiting.setdefault(point.run_id, []).append(trial)
        return self.in_grid_order(self.claim(fresh))

    def ask_trial(self):
        with warnings.catch_warnings():  # heartbeats outside Study.optimize: this search records them itself (Heartbeat)
            warnings.filterwarnings("ignore", message="Heartbeat of storage")
            trial = self.study.ask()
        self.heartbeat.now(trial._trial_id)
        return trial

    def claim(self, fresh: dict[str, Point]) -> list[Point]:
        """Mark each proposed point as this process's in the study, then look again: where another process
        claimed the same point meanwhile, both leave it (it is proposed again later), so none is measured twice."""
        from optuna.trial import TrialState

        for run_id in fresh:
            for trial in self.waiting[run_id]:
                trial.set_user_attr("point", run_id)
        if self.heartbeat.interval_s:  # shared: let a process that asked just before us write its claim too
            time.sleep(self.CLAIM_SETTLE_S)
        self.refresh()
        allowed = self.first_points()
        kept = []
        for run_id, point in fresh.items():
            taken = run_id in self.claimed or run_id in self.records
            if taken or run_id not in allowed:
                self.backed_off = self.backed_off or taken  # only over the budget: nothing to ask again
                for trial in self.waiting.pop(run_id):
                    self.study.tell(trial, state=TrialState.FAIL)
            else:
                kept.append(point)
        return kept

    def first_points(self) -> set[str]:
        """The points within the budget, in the order their trials were asked (by any process): two processes
        that each took the last slot between a look at the study and their claim keep only the earlier one
        (measured: 5 points of a budget of 4 without it)."""
        from optuna.trial import TrialState

        order: list[str] = []
        for trial in sorted(self.study.get_trials(deepcopy=False), key=lambda t: t.number):
            record = trial.user_attrs.get("record")
            point = trial.user_attrs.get("point") or (record or {}).get("run_id")
            if point and (record is not None or trial.state != TrialState.FAIL) and point not in order:
                order.append(point)
        return set(order if self.limit is None else order[: self.limit]) | {p.run_id for p in self.asked}

    def pruner_for(self, point: Point):
        """check(window rates so far) → True when the point is hopeless (reported to its trial, judged by the pruner)."""
        trials = self.waiting.get(point.run_id)
        if len(self.objectives) > 1 or self.objectives[0] != "throughput_rps" or not trials:
            return None
        trial, reported = trials[0], []

        def check(rates: list[float]) -> bool:
            for step in range(len(reported), len(rates)):
                trial.report(rates[step], step)
                reported.append(rates[step])
            return bool(trial.should_prune())

        return check

    def learn(self, point: Point, record: dict) -> None:
        from segserve.bench.search.study import record_for_storage

        for index, trial in enumerate(self.waiting.pop(point.run_id, [])):
            if index == 0:  # the trial that measured it keeps the record (collect writes the results from these)
                trial.set_user_attr("record", record_for_storage(record))
            self.finish(trial, record)

    def finish(self, trial, record: dict) -> None:
        from optuna.trial import TrialState

        values = [record.get(tag) for tag in self.objectives]
        if record.get("error") or any(v is None for v in values):
            self.study.tell(trial, state=TrialState.FAIL)
            return
        for name, value in constraint_violations(record, self.constraints).items():
            trial.set_constraint(name, value)  # the samplers keep to points where every value is ≤ 0
        if record.get("pruned"):
            self.study.tell(trial, state=TrialState.PRUNED)
            return
        self.study.tell(trial, values if len(values) > 1 else values[0])

    def close(self) -> None:
        """Stop beating; trials of points proposed but not measured fail, and their points go back to the study
        (another process, or this one resumed, asks them first)."""
        from optuna.trial import TrialState

        self.heartbeat.stop()
        left = list(self.waiting.items())
        self.waiting.clear()
        for run_id, trials in left:
            for trial in trials:
                self.study.tell(trial, state=TrialState.FAIL)
            self.study.enqueue_trial(self.space.trial_params(self.points[self.order[run_id]]))

    def plan(self) -> list[Point]:
        return []  # known only as results come in
