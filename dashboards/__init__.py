"""The hetero_ray performance app (Dash): live runs through Ray, finished runs from disk.

    hetero-ray dashboard --runs-dir runs                 # offline, or live when a cluster runs here
    hetero-ray dashboard --address auto --runs-dir runs  # on the `ray start --head` machine

``app`` builds the Dash app, ``layout`` the shell, ``pages/`` one module per page,
``callbacks`` the thin glue, ``data`` the run sources, ``frames`` and ``figures`` the pure
DataFrame → numbers → plotly layers, ``ray_bridge`` the one connection to Ray.
"""
