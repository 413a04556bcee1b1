"""A user's module of policies, imported by name or file (``--policy-module``): the policies
it registers (:func:`~hetero_ray.planning.policies.register_policy`) become choices of
``--policy`` and ``hetero-ray plan``. Every process that builds the run's configuration
imports it (the driver, each worker); the planner actor gets the class with its code."""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys

from hetero_ray.errors import ConfigError

# --policy-module's help, for hetero-ray train (PlanConfig's flag) and hetero-ray plan.
HELP = ("import this module first (a dotted name on the path, or a .py file): the policies it registers with "
        "@hetero_ray.planning.register_policy become --policy choices")


def load_policy_module(name: str, module: str) -> None:
    """Imports ``module`` — a dotted module name on the path, or a ``.py`` file — so that
    the policies it registers (:func:`register_policy`) become choices; ``name`` is the
    setting as its user wrote it (``--policy-module``).

    Raises:
        ConfigError: the module cannot be found, or raised while it was imported.
    """
    try:
        if module.endswith(".py"):
            path = os.path.abspath(os.path.expanduser(module))
            if not os.path.isfile(path):
                raise ConfigError(f"{name} {module}: no such file (on this node); pass a .py file every node "
                                  f"that reads the configuration can read, or a dotted module name on the path")
            stem = os.path.splitext(os.path.basename(path))[0]
            loaded_file = getattr(sys.modules.get(stem), "__file__", None)
            if stem in sys.modules and (loaded_file is None or os.path.abspath(loaded_file) != path):
                raise ConfigError(f"{name} {module}: a module named {stem} is already imported "
                                  f"({loaded_file or 'built in'}); rename the file")
            if stem not in sys.modules:  # the same file twice registers its policies once
                spec = importlib.util.spec_from_file_location(stem, path)
                loaded = importlib.util.module_from_spec(spec)
                sys.modules[stem] = loaded
                try:
                    spec.loader.exec_module(loaded)
                except BaseException:
                    del sys.modules[stem]
                    raise
        else:
            importlib.import_module(module)
    except ConfigError:
        raise
    except ModuleNotFoundError as e:
        raise ConfigError(f"{name} {module}: cannot import it ({e}); pass a dotted module name on the path "
                          f"(PYTHONPATH, or the job's working dir) or a .py file") from None
    except Exception as e:  # noqa: BLE001 - the user's module failed: say how, name it
        raise ConfigError(f"{name} {module} raised while it was imported: {type(e).__name__}: {e}") from None
