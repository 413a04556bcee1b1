"""The balancer actor: a thin shell that feeds :class:`Balancer` and forwards its output.

Workers send it their step rows fire-and-forget (the same batches the metrics store
gets). Adopted plans go to the scheduler (``propose``), every decision row to the metrics
store. If the actor dies, Ray restarts it (``max_restarts``) and it reloads its state from
the newest checkpoint in the run directory; meanwhile the workers simply keep the plan
they have, since rank 0 only ever asks the scheduler.

What rank 0 tells it when a worker group starts — the ranks' memory caps and the run's
end step — is in no checkpoint the group may have made yet, and no worker says it again.
So it is kept in ``balancer_attempt.json`` in the run directory: a restarted balancer that
forgot the caps would propose shares above a device's largest batch (out of memory, on
every restart of the group), and one that forgot the end would adopt plans no step runs.
"""

from __future__ import annotations

import json
import logging
import os
from typing import Optional

from hetero_ray.planning.balancer import Balancer
from hetero_ray.planning.policies import PolicyConfig, make_policy
from hetero_ray.metrics.run_files import ATTEMPTS_FILE, BALANCER_ATTEMPT_FILE, read_json, write_json

logger = logging.getLogger(__name__)

BALANCER_STATE_FILE = "balancer_state.json"  # written into each checkpoint by rank 0


class BalancerActor:
    """Args:
        store, scheduler: handles of the experiment's metrics store and scheduler actors,
            handed in by :func:`hetero_ray.runtime.actors.start_balancer` (this module
            looks up no peer); a restart of this actor gets the same handles again.
    """

    def __init__(self, store, scheduler, run_dir: str, policy: str, policy_config: dict,
                 rebalance_interval: int):
        self._store = store
        self._scheduler = scheduler
        self._policy_name = policy
        self._policy_config = PolicyConfig(**policy_config)
        self.balancer = Balancer(self._make_policy(None), rebalance_interval)
        self._run_dir = run_dir
        self._restored_from: Optional[str] = None
        self._restore_from_latest_checkpoint()

    def _make_policy(self, num_workers: Optional[int], caps=None):
        return make_policy(self._policy_name, self._policy_config, caps=caps)

    def begin_attempt(self, attempt: int, num_workers: int, start_global_step: int,
                      caps: Optional[list] = None, end_global_step: Optional[int] = None) -> None:
        """A worker group starts; ``caps`` are its ranks' memory caps (from profiling),
        ``end_global_step`` where the run ends. Both are kept for a restart of this actor."""
        self._begin(attempt, num_workers, start_global_step, caps, end_global_step)
        path = os.path.join(self._run_dir, BALANCER_ATTEMPT_FILE)
        try:
            write_json(path, {"attempt": attempt, "num_workers": num_workers, "start_global_step": start_global_step,
                              "caps": caps, "end_global_step": end_global_step})
        except OSError as e:  # balancing goes on; only a restart of this actor would forget them
            logger.warning("balancer could not save %s (%s)", path, e.strerror or e)

    def _begin(self, attempt: int, num_workers: int, start_global_step: int, caps: Optional[list],
               end_global_step: Optional[int]) -> None:
        if num_workers != self.balancer.num_workers or caps is not None:
            state = self.balancer.policy.state_dict()
            self.balancer.policy = self._make_policy(num_workers, caps)
            self.balancer.policy.load_state_dict(state)
        self.balancer.begin_attempt(attempt, num_workers, start_global_step, end_global_step)

    def add_steps(self, rows: list[dict]) -> None:
        output = self.balancer.add_steps(rows)
        for plan in output.new_plans:
            self._scheduler.propose.remote(plan.to_dict())
        for row in output.decision_rows:
            self._store.add_decision.remote(row)

    def state_dict(self) -> dict:
        return self.balancer.state_dict()

    def info(self) -> dict:
        """Where this incarnation stands (for the dashboard and tests)."""
        return {"policy": self._policy_name, "attempt": self.balancer.attempt,
                "num_workers": self.balancer.num_workers, "caps": self.balancer.policy.caps,
                "end_global_step": self.balancer.end_global_step, "restored_from": self._restored_from}

    def close(self) -> None:
        """End of the run: emit decision rows still waiting for their outcome."""
        for row in self.balancer.flush():
            self._store.add_decision.remote(row)

    def _restore_from_latest_checkpoint(self) -> None:
        """After a restart of this actor (or a --resume): the newest checkpoint's state, and
        the attempt in progress with its caps and end step, so that the records arriving now
        are used within the same bounds."""
        from hetero_ray.runtime.checkpoints import latest_checkpoint_dir

        from hetero_ray.training.reporting import BALANCER_STATE_FILE as API_STATE_FILE, STATE_DIR

        directory = latest_checkpoint_dir(self._run_dir)
        # Built-in runs keep it at the checkpoint's top level; user loops beside their files.
        candidates = [os.path.join(directory, BALANCER_STATE_FILE),
                      os.path.join(directory, STATE_DIR, API_STATE_FILE)] if directory else []
        path = next((p for p in candidates if os.path.exists(p)), None)
        if path:
            try:
                with open(path) as f:
                    self.balancer.load_state_dict(json.load(f))
                self._restored_from = path
                logger.warning("balancer restored from %s", path)
            except Exception as e:  # noqa: BLE001 - start fresh rather than not at all
                logger.warning("balancer could not restore %s (%s); starting fresh", path, e)
        attempts = read_json(os.path.join(self._run_dir, ATTEMPTS_FILE), []) or []
        if not attempts:
            return
        last = attempts[-1]
        try:
            saved = read_json(os.path.join(self._run_dir, BALANCER_ATTEMPT_FILE), {}) or {}
        except ValueError:  # not JSON (edited by hand?): start without them rather than not at all
            saved = {}
        if saved.get("attempt") != last["attempt"]:
            # The group's start reached the store, not yet this actor: the call that tells
            # it (caps and end included) is still on its way and will be retried here.
            saved = {}
        self._begin(last["attempt"], last["num_workers"], last["start_global_step"], saved.get("caps"),
                    saved.get("end_global_step"))
