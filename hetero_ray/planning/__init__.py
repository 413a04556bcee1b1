"""Planning, in pure Python and numpy: the plan, and how it is made and changed (the actor
:mod:`hetero_ray.runtime.planner_actor` is a thin shell around :class:`~hetero_ray.planning.planner.Planner`).

* :mod:`~hetero_ray.planning.plan` — the plan: each rank's share of the global batch;
* :mod:`~hetero_ray.planning.cost_model` — ``t_i(b) = max(τ_i, α_i + β_i·b)`` and its robust fit;
* :mod:`~hetero_ray.planning.estimates` — sliding-window per-rank estimates from step records;
* :mod:`~hetero_ray.planning.capacity` — each rank's curve and memory cap from the node profiles;
* :mod:`~hetero_ray.planning.solver` — the split minimising ``max_i t_i(b_i)``;
* :mod:`~hetero_ray.planning.subset` — the group and split minimising ``max_{i∈G} t_i(b_i) + c(G)``;
* :mod:`~hetero_ray.planning.policies` — static, proportional, dynamic, optimal; the registry;
* :mod:`~hetero_ray.planning.policy_module` — a user's module of policies, by name or file;
* :mod:`~hetero_ray.planning.moves` — how far one move may take a rank beyond its known shares;
* :mod:`~hetero_ray.planning.balancer` — step records in, decisions at rebalance points out;
* :mod:`~hetero_ray.planning.planner` — the one planning authority: first plan, versions, caps, end;
* :mod:`~hetero_ray.planning.simulation` — a simulated cluster to drive policies without Ray.
"""

from hetero_ray.planning.cost_model import CurveFit, fit_curve
from hetero_ray.planning.decision import Decision, PolicyConfig
from hetero_ray.planning.estimates import ClusterEstimates, Estimates, RankEstimate
from hetero_ray.planning.plan import Plan
from hetero_ray.planning.policies import (
    DEFAULT_POLICY,
    DynamicPolicy,
    OptimalPolicy,
    Policy,
    ProportionalPolicy,
    StaticPolicy,
    make_policy,
    policy_class,
    policy_names,
    register_policy,
)
from hetero_ray.planning.simulation import SimulatedCluster, SimulationResult, run_policy
from hetero_ray.planning.solver import continuous_split, predicted_step_time_s, solve_split
from hetero_ray.planning.subset import SubsetSplit, solve_subset_split

__all__ = [
    "ClusterEstimates",
    "DEFAULT_POLICY",
    "Decision",
    "DynamicPolicy",
    "Estimates",
    "CurveFit",
    "OptimalPolicy",
    "Plan",
    "Policy",
    "PolicyConfig",
    "ProportionalPolicy",
    "RankEstimate",
    "SimulatedCluster",
    "SimulationResult",
    "StaticPolicy",
    "SubsetSplit",
    "continuous_split",
    "fit_curve",
    "make_policy",
    "policy_class",
    "policy_names",
    "predicted_step_time_s",
    "register_policy",
    "run_policy",
    "solve_split",
    "solve_subset_split",
]
