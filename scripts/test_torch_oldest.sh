#!/usr/bin/env bash
# The tests of the code that touches torch most closely (gradient weighting, batch norm,
# model preparation, the plan-following loader) on the lowest torch hetero_ray supports
# (hetero_ray/torch_range.py), in a virtualenv of its own: .venv-torch-oldest.
# A GPU image ships its own torch; this is how the range's lower bound stays true.
set -euo pipefail
cd "$(dirname "$0")/.."

TORCH=${TORCH:-2.11.0}
TORCHVISION=${TORCHVISION:-0.26.0}  # the torchvision built against that torch
PYTHON=${PYTHON:-python3}
VENV=.venv-torch-oldest
STAMP=$VENV/.hetero_ray_installed

want="$TORCH $TORCHVISION $(cat requirements.txt requirements-dev.txt pyproject.toml | sha256sum | cut -d' ' -f1)"
if [ ! -f "$STAMP" ] || [ "$(cat "$STAMP")" != "$want" ]; then
  echo "test-torch-oldest: creating $VENV with torch $TORCH (a few GB the first time)…"
  [ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
  requirements=$(mktemp); trap 'rm -f "$requirements"' EXIT
  sed -e "s/^torch==.*/torch==$TORCH/" -e "s/^torchvision==.*/torchvision==$TORCHVISION/" requirements.txt > "$requirements"
  "$VENV/bin/python" -m pip install --quiet --upgrade pip
  "$VENV/bin/python" -m pip install --quiet -r "$requirements" pytest==9.0.3
  "$VENV/bin/python" -m pip install --quiet --no-deps -e .
  "$VENV/bin/python" -m pip uninstall --quiet -y pynvml >/dev/null 2>&1 || true
  echo "$want" > "$STAMP"
fi
"$VENV/bin/python" -c "import torch, torchvision; print(f'test-torch-oldest: torch {torch.__version__}, torchvision {torchvision.__version__}')"
"$VENV/bin/python" -m pytest -q -W ignore::DeprecationWarning -p no:cacheprovider \
  tests/test_torch_range.py tests/test_gradients.py tests/test_sync_batchnorm.py tests/test_builtin_resnet_math.py \
  tests/test_models.py \
  "tests/test_api_e2e.py::test_user_loop_with_batchnorm_matches_one_device_under_plan_changes" \
  "tests/test_api_e2e.py::test_own_dataloader_without_prepare_data_loader_averages_like_one_device" "$@"
