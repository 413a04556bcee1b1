"""The hetero_ray performance app (Dash): live runs through Ray, finished runs from disk.

    hetero-ray dashboard --runs-dir runs                 # offline, or live when a cluster runs here
    hetero-ray dashboard --address auto --runs-dir runs  # on the `ray start --head` machine

Its code is in the repository's ``dashboards/`` folder; it installs and is imported as
``hetero_ray_dashboards`` (pyproject.toml maps the name to the folder), not as a generic
top-level ``dashboards``.

``app`` builds the Dash app, ``layout`` the shell, ``pages/`` one module per page,
``callbacks`` the thin glue, ``catalog`` and ``run_keys`` the runs a browser may open,
``live_source`` a running experiment's data, ``ray_bridge`` the one connection to Ray.
What the app shares with ``hetero-ray report`` — reading a run directory, the pure
DataFrame → numbers → plotly layers — is in :mod:`hetero_ray.reporting` (the library
never imports the app).
"""

if __name__ != "hetero_ray_dashboards":  # e.g. `import dashboards` from the repository root
    raise ImportError(f"the app is imported as hetero_ray_dashboards, not {__name__}: a second name would load a "
                      "second copy of every module (install the checkout with `make setup`, i.e. pip install -e .)")
