"""The app's pages, one module each, in navigation order.

A page module names itself (``NAME``, ``PATH``, ``TITLE``), says which of its components
a refresh updates (``GRAPHS``: figures; ``CONTENT``: children) and which extra inputs it
reads (``INPUTS``), and provides ``layout(catalog)`` and ``build(...)`` — the latter a
plain function from run sources to figures and components, which the page's callback
(see :mod:`hetero_ray_dashboards.callbacks`) delivers to the browser.
"""

from hetero_ray_dashboards.pages import balancer, bottlenecks, cluster, compare, gpu, ranks, run

PAGES = (cluster, run, ranks, balancer, bottlenecks, gpu, compare)
DEFAULT_PAGE = run
