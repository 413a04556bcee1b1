"""What the driver needs of a job beyond ``HeteroTrainer``'s arguments, as values.

``HeteroTrainer.fit`` is the one driver path: a user's loop and the built-in job
(``hetero-ray train``) both run through it. A user's loop gives it nothing more than its
arguments (:data:`API_JOB`). The built-in job also hands over its own checks of the run
directory, the dataset every node must see, its settings for ``config.json``, its length,
how to read its final model, and its front end's words: what a person types to continue a
stopped run, or to name another one, is ``--resume`` to a CLI user and ``fit()`` to a
Python one (:mod:`hetero_ray.builtin.driver` builds it).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from hetero_ray.runtime.node_checks import DatasetRef


@dataclass(frozen=True)
class Wording:
    """How a front end names what a person can do next, in the messages of a run."""

    name_setting: str  # what names the run
    storage_setting: str  # where its folder goes
    continue_how: str  # "{continue_how} continues from …": may hold {name}
    start_afresh: str  # what to do when there is nothing to continue
    locked_advice: str  # the end of a refusal by the run directory's lock

    def continues(self, name: str) -> str:
        return self.continue_how.format(name=name)


API_WORDS = Wording(
    name_setting="RunConfig(name=...)",
    storage_setting="RunConfig(storage_path=...)",
    continue_how="fit() again with RunConfig(name={name!r}) and the same storage",
    start_afresh="fit() again under another RunConfig(name=...)",
    locked_advice=("Wait for that run to end, or stop it, then fit() again with the same RunConfig(name=...) and "
                   "storage to continue it; or choose another RunConfig(name=...)"),
)


@dataclass(frozen=True)
class JobFacts:
    """What the driver needs of a job beyond the trainer's arguments (see the module docstring)."""

    words: Wording = API_WORDS
    # The job's own checks of the run directory, run under its lock before anything is
    # written (the built-in job: what a --resume continues from); None: fit()'s own.
    check_run_dir: Optional[Callable[[], None]] = None
    dataset: Optional[DatasetRef] = None  # a file dataset every worker node must see; None: nothing to check
    settings: Optional[dict] = None  # config.json's content; None: the HeteroConfig's
    summary_names: dict[str, Any] = field(default_factory=dict)  # the summary's "model" and "dataset"
    total_steps: Optional[int] = None  # the run's length in global steps, when the job knows it
    # Reads the trained model's state from the last checkpoint's directory, saved as the
    # run's model file; None: a user's loop keeps its own checkpoints.
    final_model: Optional[Callable[[str], Any]] = None


API_JOB = JobFacts()
