"""Evaluate one point of the search space as an Optuna trial.

Every point a strategy looks at becomes a trial carrying its parameters and the measurement as
user attributes (``autotune.search.strategies.record``: what a trial of a point holds), so the dashboard
tells the whole story; training-only trials go to the key's study, inference-only trials to its ``-infer``
study (one unit per study), joint trials (tpe) to the key's study.
A point already measured in the study is answered from it (resume, folds, reruns), and a point that ran out of
memory in training (a trial of ``kind: training``, ``autotune.search.storage.points``) is answered by that, whatever a
probe measured before;
a point that failed twice is taken as infeasible without a third try (a probe lost with its worker,
killed, stopped or hung, is not the point's failure, unless it happens ``MAX_LOST`` times).
Each point is a step of this worker's liveness (``autotune.search.storage.liveness``); a worker
whose trial was failed as stale meanwhile (it hung past its promise) gets ``TakenOver``.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from autotune.search.storage.liveness import TakenOver, owner_tag
from autotune.search.storage.points import TRAINING_KIND, point_id
from autotune.search.strategies.record import Evaluation, progress_line, record_result, trial_fits

if TYPE_CHECKING:  # pragma: no cover
    import optuna

    from autotune.search.curves.probers import Prober
    from autotune.search.storage.claims import ClaimStore
    from autotune.search.storage.liveness import Liveness

__all__ = ["Evaluation", "Evaluator", "point_id", "trial_fits", "MAX_FAILURES"]

MAX_FAILURES = 2
MAX_LOST = 4  # probes of a point lost with their worker before the point is taken as what kills workers


def _lost_with_worker(trial: Any) -> bool:
    """A FAIL trial whose worker stopped or was declared dead while probing it (not the point's own failure)."""
    return str(trial.user_attrs.get("fail_reason", "")).startswith(("stale: ", "interrupted: "))


class Evaluator:
    """Runs points through a prober and records each as a trial of ``study``.

    Args:
        study: the key's study.
        prober: real probes or estimates.
        budget_bytes: the usable memory: the limit less the margin (and allowances).
        distributions: Optuna distributions of the parameters (for the dashboard's plots).
        storage: the storage ``study`` was opened on (trials get their parameters through it).
        progress: called with one line per evaluated point.
        liveness: this worker's heartbeat, told of each step (None: a run nobody watches).
        claims: point claims when workers share the study (None: alone on it).
    """

    def __init__(
        self,
        study: optuna.Study,
        prober: Prober,
        budget_bytes: int,
        distributions: Mapping[str, Any],
        *,
        storage: optuna.storages.BaseStorage,
        progress: Callable[[str], None] | None = None,
        label: str = "",
        liveness: Liveness | None = None,
        claims: ClaimStore | None = None,
        poll_seconds: float = 1.0,
        objective: str = "max-batch",
        infer_study: optuna.Study | None = None,
    ) -> None:
        self.objective = objective
        self.infer_study = infer_study
        self.storage = storage
        self.liveness = liveness
        self._revivals = liveness.revivals if liveness is not None else 0
        self._study_ids: dict[str, int] = {}
        self.owner = liveness.owner if liveness is not None else owner_tag()
        self.claims = claims
        self.poll_seconds = float(poll_seconds)
        self.study = study
        self.prober = prober
        self.budget_bytes = int(budget_bytes)
        self.distributions = dict(distributions)
        self.progress = progress or (lambda _line: None)
        self.label = label
        self.probes = 0
        self.reused = 0
        self.trial_numbers: list[int] = []  # trials of ``study``
        self.infer_trial_numbers: list[int] = []  # trials of ``infer_study``

    # -- lookup ------------------------------------------------------------------------
    def study_for(self, phases: tuple[str, ...]) -> optuna.Study:
        """The study a point of ``phases`` is a trial of: inference-only points in the infer study."""
        if tuple(phases) == ("infer",) and self.infer_study is not None:
            return self.infer_study
        return self.study

    def _previous(self, pid: str, study: optuna.Study) -> tuple[optuna.trial.FrozenTrial | None, int]:
        from optuna.trial import TrialState

        done = None
        failures = lost = 0
        for trial in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.FAIL)):
            if trial.user_attrs.get("point_id") != pid:
                continue
            if trial.state == TrialState.COMPLETE and trial.user_attrs.get("kind") == TRAINING_KIND:
                done = trial  # training ran out of memory at this point (autotune.trainer.learn): that answers it
                break
            if trial.state == TrialState.COMPLETE and done is None:
                done = trial
            elif trial.state == TrialState.FAIL and _lost_with_worker(trial):
                lost += 1
            elif trial.state == TrialState.FAIL:
                failures += 1
        # a probe lost with its worker (killed, stopped, hung) says nothing of the point, unless it keeps happening
        return done, failures if lost < MAX_LOST else max(failures, MAX_FAILURES)

    def _skipped(self, pid: str, point: dict[str, Any], phases: tuple[str, ...]) -> Evaluation:
        from optuna.trial import TrialState

        failed = [t.number for t in self.study_for(phases).get_trials(deepcopy=False, states=(TrialState.FAIL,))
                  if t.user_attrs.get("point_id") == pid and "reused_trial" not in t.user_attrs]
        listed = ", ".join(f"#{n}" for n in failed)
        result = {"status": "skipped",
                  "error_tail": f"this point failed {len(failed)} times (trials {listed}); taken as infeasible, "
                                "not probed again"}
        return Evaluation(point, phases, "skipped", False, None, 0.0, failed[-1] if failed else None, True, result)

    def wait_for_others(self) -> None:
        """With workers sharing the study: wait until none of its trials runs, failing those of workers
        that are not live (each live one finishes within its promise; a hung one is stale a grace later)."""
        from optuna.trial import TrialState

        live = self.liveness
        if self.claims is None or live is None:
            return
        deadline = time.monotonic() + live.promise + 2 * live.stale_after
        while time.monotonic() < deadline and self.study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
            live.fail_stale_trials(self.storage, self.study)
            live.progress()
            time.sleep(self.poll_seconds)

    # -- evaluation --------------------------------------------------------------------
    def evaluate(self, point: Mapping[str, Any], phases: tuple[str, ...], trial: Any = None,
                 repeat: int = 0) -> Evaluation:
        """Evaluate ``point``: from the study when it is there, else with the prober.

        ``trial`` may be a trial already asked (the TPE strategy); otherwise one is made.
        ``repeat`` > 0 asks for a repeated measurement of a point (a point of its own in the study).
        """
        with self.liveness.busy() if self.liveness is not None else contextlib.nullcontext():
            if trial is not None:
                # a trial the sampler asked is RUNNING already: mark it as this worker's at once, so a worker
                # that stops at any moment leaves a trial its liveness answers for (autotune.search.storage.liveness)
                self._tag(trial)
            self._step()
            return self._evaluate(dict(point), phases, trial, repeat)

    def _tag(self, trial: Any) -> None:
        """Mark ``trial`` as this worker's: its ``owner`` tag and the id of its worker trial."""
        trial.set_user_attr("owner", self.owner)
        if self.liveness is not None:
            trial.set_user_attr("worker", self.liveness.worker_id)

    def _step(self) -> None:
        """Tell the liveness that this worker made a step (it keeps beating for another promise).

        Raises:
            TakenOver: this worker was declared dead since the search began (it made no progress within its
                promise and the grace): what it held is another's now, so its search stops here.
        """
        if self.liveness is not None:
            self.liveness.progress()
            if self.liveness.revivals != self._revivals:
                self._revivals = self.liveness.revivals
                raise TakenOver(f"this worker ({self.owner}) was declared dead while searching {self.study.study_name} "
                                "(no progress within its promise and the grace); another worker takes it over")

    def _known(self, pid: str, study: optuna.Study) -> tuple[optuna.trial.FrozenTrial | None, int, bool]:
        """(the point's finished trial, its failures, whether this worker holds its claim). With several
        workers a point is probed only while holding its claim; otherwise this waits for the holder's
        trial (or for its claim to go stale, then takes it over)."""
        previous, failures = self._previous(pid, study)
        first = True
        while self.claims is not None and previous is None and failures < MAX_FAILURES:
            # a point is rarely held by another (a key's points are its holder's): the first ask writes at once
            if self.claims.claim(study.study_name, "point:" + pid, look_first=not first):
                if self.claims.took_over and self.liveness is not None:
                    # the dead holder's trial fails before the look below: a late result of it is refused
                    self.liveness.fail_stale_trials(self.storage, study)
                previous, failures = self._previous(pid, study)  # it may have finished just before
                if previous is None and failures < MAX_FAILURES:
                    return None, failures, True
                self.claims.release(study.study_name, "point:" + pid)
                break
            first = False
            time.sleep(self.poll_seconds)
            self._step()
            previous, failures = self._previous(pid, study)
        return previous, failures, False

    def _answer_known(self, previous: Any, pid: str, point: dict[str, Any], phases: tuple[str, ...],
                      trial: Any) -> Evaluation:
        """A point the study answers: its finished trial, or infeasible after ``MAX_FAILURES`` failures."""
        if previous is not None:
            evaluation = Evaluation.from_trial(previous, point, phases, reused=True)
        else:  # failed MAX_FAILURES times: taken as infeasible, and the trial says so
            evaluation = self._skipped(pid, point, phases)
        if trial is not None:  # a sampler asked for a point we know: record the answer, no probe
            self._tell(trial, evaluation.result or {"status": evaluation.status}, phases, point, reused_from=evaluation)
        self.reused += 1
        self._report(evaluation, phases, reused=True)
        return evaluation

    def _new_trial(self, study: optuna.Study, point: dict[str, Any], phases: tuple[str, ...], pid: str,
                   repeat: int, trial: Any) -> Any:
        """The trial a probe of ``point`` is recorded in, tagged: made here with its parameters and tags in one
        write (no moment where a worker or a sweep sees it untagged), unless the sampler asked it."""
        tags: dict[str, Any] = {"point_id": pid, "phases": list(phases), **({"repeat": repeat} if repeat else {}),
                                "kind": getattr(self.prober, "kind", "probe" if self.prober.measured else "estimate"),
                                "budget_bytes": self.budget_bytes}
        if trial is not None:
            for name, value in tags.items():
                trial.set_user_attr(name, value)
            return trial
        import optuna

        from autotune.search.storage.liveness import running_template

        owner = {"owner": self.owner, **({"worker": self.liveness.worker_id} if self.liveness is not None else {})}
        template = running_template({**owner, **tags}, {})
        template.params = dict(point)
        template.distributions = {name: self.distributions[name] for name in point}
        if study.study_name not in self._study_ids:
            self._study_ids[study.study_name] = self.storage.get_study_id_from_name(study.study_name)
        created = self.storage.create_new_trial(self._study_ids[study.study_name], template)
        return optuna.trial.Trial(study, created)

    def _abandon(self, study: optuna.Study, trial: Any, exc: BaseException) -> None:
        """Fail the trial a probe was interrupted in (a signal, Ctrl-C, an error), so the study keeps no
        RUNNING trial of a process that is gone; a trial already failed as stale means ``TakenOver``."""
        import optuna
        from optuna.trial import TrialState

        if isinstance(exc, optuna.exceptions.UpdateFinishedTrialError):
            raise TakenOver(
                f"trial #{trial.number} of {study.study_name} was failed as stale while this worker was on "
                "it (no progress within its promise and the grace); another worker takes the work over"
            ) from exc
        try:
            trial.set_user_attr("fail_reason", f"interrupted: {type(exc).__name__} {exc}".strip()[:500])
            study.tell(trial, state=TrialState.FAIL)
        except Exception:  # noqa: BLE001 - the storage may be what failed; liveness fails the trial later
            pass

    def _evaluate(self, point: dict[str, Any], phases: tuple[str, ...], trial: Any, repeat: int) -> Evaluation:
        pid = point_id(point, phases) + (f"|repeat={repeat}" if repeat else "")
        study = self.study_for(phases)
        previous, failures, claimed = self._known(pid, study)
        if previous is not None or failures >= MAX_FAILURES:
            return self._answer_known(previous, pid, point, phases, trial)
        trial = self._new_trial(study, point, phases, pid, repeat, trial)
        started = time.perf_counter()
        try:
            result = self.prober.probe(point, phases)
            self._step()  # the probe came back (the runner bounds it by its timeout, the promise)
            result.setdefault("wall_seconds", time.perf_counter() - started)
            if self.prober.measured:
                self.probes += 1
            evaluation = self._tell(trial, result, phases, point)
        except BaseException as exc:
            if claimed:
                self.claims.release(study.study_name, "point:" + pid)
            self._abandon(study, trial, exc)
            raise
        if claimed:
            self.claims.release(study.study_name, "point:" + pid)
        self._report(evaluation, phases, reused=False)
        return evaluation

    def _tell(self, trial: Any, result: Mapping[str, Any], phases: tuple[str, ...], point: dict[str, Any],
              reused_from: Evaluation | None = None) -> Evaluation:
        """Record ``result`` as ``trial`` of the study ``phases`` go to (``record_result``), and count it as ours."""
        study = self.study_for(phases)
        (self.infer_trial_numbers if study is not self.study else self.trial_numbers).append(trial.number)
        return record_result(trial, study, result, phases, point, budget_bytes=self.budget_bytes,
                             objective=self.objective, reused_from=reused_from)

    def _report(self, evaluation: Evaluation, phases: tuple[str, ...], reused: bool) -> None:
        self.progress(progress_line(evaluation, phases, label=self.label, budget_bytes=self.budget_bytes,
                                    measured=self.prober.measured, reused=reused))
