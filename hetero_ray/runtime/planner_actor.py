"""The planner actor: a thin shell that holds the run's :class:`Planner` and keeps its state.

Rank 0 asks it for the plan at every rebalance point (``plan_for``); the workers send it
their step rows fire-and-forget (the same batches the metrics store gets); the driver's
node profiling hands it the profiles. Every decision row the planner returns goes to the
metrics store.

If the actor dies, Ray restarts it (``max_restarts``) and it continues where it stopped;
meanwhile rank 0 keeps the plan it has. What the planner cannot learn again — the plan in
force (a plan it adopted that rank 0 has not fetched yet is in no table), the version
counter, the caps, the node profiles, the scripted changes still to come, the worker group
it serves and the run's end, the decision whose outcome is still being measured (its row
would never reach the decisions table) and the caps rollbacks taught — is written to
``planner_state.json`` in the run directory whenever it changes, and read back when the
actor starts; the estimates and the policy's state come back from the newest checkpoint. So
a restarted planner (or the one of a ``--resume``) serves the plan in force with versions
that keep increasing, never proposes a share above a device's largest batch, and never
adopts a plan no step runs.
"""

from __future__ import annotations

import json
import logging
import os
from typing import Optional

from hetero_ray.planning.planner import Planner
from hetero_ray.runs.checkpoint_names import BALANCER_STATE_FILE, STATE_DIR
from hetero_ray.runs.checkpoints import latest_checkpoint_dir
from hetero_ray.runs.run_files import ATTEMPTS_FILE, PLANNER_STATE_FILE, read_json, write_json

logger = logging.getLogger(__name__)


class PlannerActor:
    """Args:
        store: the handle of the experiment's metrics store, handed in by
            :func:`hetero_ray.runtime.actors.start_planner` (this module looks up no peer);
            a restart of this actor gets the same handle again.
        run_dir: where its state is kept; None keeps it in memory only.
        launch_id, first_plan: the driver's ``fit()`` and where its first plan comes from
            (:meth:`Planner.start_launch`): given at the start, so that no call the
            driver makes waits for this actor's process, and applied once per launch
            (a restart within it keeps what its saved state says).
        planner_kwargs: the arguments of :class:`Planner` (the same on every restart).
    """

    def __init__(self, store, run_dir: Optional[str], launch_id: Optional[str] = None,
                 first_plan: Optional[str] = None, **planner_kwargs):
        self._store = store
        self._run_dir = run_dir
        self._planner = Planner(**planner_kwargs)
        self._state_path = os.path.join(run_dir, PLANNER_STATE_FILE) if run_dir else None
        self._saved: Optional[str] = None
        self._restored_from: list[str] = []
        self._restore()
        if launch_id is not None:
            self._planner.start_launch(launch_id, first_plan)
            self._save()

    # ------------------------------------------------------------------ the driver
    def set_capabilities(self, nodes: list[dict]) -> None:
        self._planner.set_capabilities(nodes)
        self._save()

    # ------------------------------------------------------------------ rank 0
    def plan_for(self, *args, **kwargs) -> dict:
        """:meth:`Planner.plan_for`."""
        reply = self._planner.plan_for(*args, **kwargs)
        self._save()
        return reply

    def resume_from(self, plan: dict) -> None:
        self._planner.resume_from(plan)
        self._save()

    def begin_attempt(self, attempt: int, num_workers: int, start_global_step: int,
                      end_global_step: Optional[int] = None) -> None:
        self._planner.begin_attempt(attempt, num_workers, start_global_step, end_global_step)
        self._save()

    def checkpoint_state(self) -> dict:
        """What rank 0 writes into each checkpoint (estimates, the policy's state)."""
        return self._planner.checkpoint_state()

    # ------------------------------------------------------------------ the workers
    def add_steps(self, rows: list[dict]) -> None:
        for row in self._planner.add_steps(rows):
            self._store.add_decision.remote(row)
        self._save()

    def close(self) -> None:
        """End of the run: emit decision rows still waiting for their outcome."""
        for row in self._planner.close():
            self._store.add_decision.remote(row)

    def info(self) -> dict:
        """Where this incarnation stands (for the dashboard, tests and operators)."""
        return {**self._planner.info(), "restored_from": list(self._restored_from)}

    # ------------------------------------------------------------------ its state on disk
    def _save(self) -> None:
        """Writes the planner's state when it changed since the last write."""
        if self._state_path is None:
            return
        state = self._planner.state_dict()
        text = json.dumps(state, sort_keys=True, default=str)
        if text == self._saved:
            return
        try:
            write_json(self._state_path, state)
            self._saved = text
        except OSError as e:  # planning goes on; only a restart of this actor would lose the plan
            logger.warning("planner state not saved to %s (%s)", self._state_path, e.strerror or e)

    def _restore(self) -> None:
        """After a restart of this actor (or a --resume): the newest checkpoint's estimates,
        then the state saved last, so that records arriving now are used within the same
        bounds. Whatever cannot be read is started fresh rather than not at all."""
        if self._run_dir is None:
            return
        path = _checkpoint_state_path(self._run_dir)
        if path:
            try:
                with open(path) as f:
                    self._planner.load_checkpoint_state(json.load(f))
                self._restored_from.append(path)
            except Exception as e:  # noqa: BLE001 - start fresh rather than not at all
                logger.warning("planner could not restore the estimates of %s (%s); starting fresh", path, e)
        try:
            state = read_json(self._state_path)
            if state:
                self._planner.load_state_dict(state)
                self._saved = json.dumps(self._planner.state_dict(), sort_keys=True, default=str)
                self._restored_from.append(self._state_path)
        except (OSError, ValueError, AttributeError, KeyError, TypeError) as e:
            logger.warning("planner could not restore %s (%s); starting fresh", self._state_path, e)
        self._begin_group_the_store_knows()
        if self._restored_from:
            logger.warning("planner restored from %s: %s", ", ".join(self._restored_from), self._planner.info())

    def _begin_group_the_store_knows(self) -> None:
        """A worker group whose start reached the store, not yet this actor: the call that
        tells it (with the end step) is still on its way and will be retried here; until
        then the group's records are used within the bounds known."""
        attempts = read_json(os.path.join(self._run_dir, ATTEMPTS_FILE), []) or []
        if not attempts:
            return
        last = attempts[-1]
        if self._planner.balancer.attempt != last["attempt"]:
            self._planner.begin_attempt(last["attempt"], last["num_workers"], last["start_global_step"])


def _checkpoint_state_path(run_dir: str) -> Optional[str]:
    """The planner's part of the newest checkpoint: at its top level (built-in runs) or
    beside a user loop's files."""
    directory = latest_checkpoint_dir(run_dir)
    if not directory:
        return None
    candidates = [os.path.join(directory, BALANCER_STATE_FILE), os.path.join(directory, STATE_DIR, BALANCER_STATE_FILE)]
    return next((p for p in candidates if os.path.exists(p)), None)
