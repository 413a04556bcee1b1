# hetero_ray's container image, for the KubeRay manifests in cluster_configs/.
#
# Base: Ray's own image, not a slim Python. Every node and job of a Ray cluster must run
# the same Ray and Python minor version (Ray refuses the others); rayproject/ray pins both
# (Ray 2.60.0 on Python 3.11) and is what KubeRay's pods expect (the `ray` user and its
# home, `ray start` on PATH, the tools KubeRay's probes run). A slim Python base would have
# to rebuild all of that. The GPU variant only differs in its CUDA libraries:
#
#   docker build -t ghcr.io/your-org/hetero-ray:0.1.0-cpu .
#   docker build --build-arg RAY_IMAGE=rayproject/ray:2.60.0-py311-gpu \
#       -t ghcr.io/your-org/hetero-ray:0.1.0-gpu .
#
# The tags are the ones kuberay-raycluster.yaml names; push them where your cluster pulls
# from. Size: both images carry torch from PyPI, which brings CUDA 13's libraries
# (nvidia-* wheels, about 3 GB installed) also into the CPU image, where nothing uses
# them. A CPU-only torch would leave them out, but PyPI's torchvision wheels are CUDA
# builds that fail to import against it (requirements.txt), so both images install the
# same tested pair; expect the CPU image to be about 3 GB larger than its Ray base. No token or data goes into the image (.dockerignore): the auth token comes from a
# Kubernetes Secret at run time.
ARG RAY_IMAGE=rayproject/ray:2.60.0-py311
FROM ${RAY_IMAGE}

WORKDIR /home/ray/hetero_ray

# The pinned requirements first, so that a code change does not reinstall torch (~3 GB).
COPY --chown=ray:users requirements.txt ./
RUN pip install --no-cache-dir -r requirements.txt \
    && (pip uninstall -y pynvml || true)

# The project: the library and the app installed (not editable), the job entrypoints and
# examples beside them for `ray job submit` / a RayJob's `python jobs/train.py`.
COPY --chown=ray:users pyproject.toml README.md ./
COPY --chown=ray:users hetero_ray/ hetero_ray/
COPY --chown=ray:users dashboards/ dashboards/
COPY --chown=ray:users jobs/ jobs/
COPY --chown=ray:users examples/ examples/
RUN pip install --no-cache-dir --no-deps . \
    && python -c "import hetero_ray, hetero_ray_dashboards, ray; assert ray.__version__ == '2.60.0', ray.__version__"
