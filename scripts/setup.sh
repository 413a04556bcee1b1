#!/usr/bin/env bash
# Sets up everything hetero_ray needs on a fresh machine: a virtualenv in .venv with the
# pinned requirements and the package itself (editable). Re-running is cheap: the install
# is skipped while requirements*.txt and pyproject.toml are unchanged.
#
#   scripts/setup.sh            runtime + test dependencies
#   SETUP_BROWSER=1 scripts/setup.sh   also Debian's chromium for the Dash browser tests
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
VENV=.venv
STAMP=$VENV/.hetero_ray_installed

if ! command -v "$PYTHON" >/dev/null; then
  echo "setup: $PYTHON not found; install Python 3.10+ (e.g. apt-get install python3 python3-venv)" >&2
  exit 1
fi

want=$(cat requirements.txt requirements-dev.txt pyproject.toml | sha256sum | cut -d' ' -f1)
if [ ! -f "$STAMP" ] || [ "$(cat "$STAMP")" != "$want" ]; then
  echo "setup: creating $VENV and installing the pinned requirements (torch is ~3 GB the first time)…"
  [ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
  "$VENV/bin/python" -m pip install --quiet --upgrade pip
  # uv fetches and unpacks the ~3 GB in parallel: ~40 s where pip takes ~90 s. The same pins
  # either way; pip alone where uv cannot be had.
  if "$VENV/bin/python" -m pip install --quiet uv 2>/dev/null; then
    # --compile-bytecode: pip writes the .pyc files as it installs; uv only when told, and a
    # machine with PYTHONDONTWRITEBYTECODE=1 would compile torch and Ray in every process.
    install=("$VENV/bin/uv" pip install --quiet --compile-bytecode --python "$VENV/bin/python")
    uninstall=("$VENV/bin/uv" pip uninstall --quiet --python "$VENV/bin/python")
  else
    install=("$VENV/bin/python" -m pip install --quiet)
    uninstall=("$VENV/bin/python" -m pip uninstall --quiet -y)
  fi
  "${install[@]}" -r requirements-dev.txt
  "${install[@]}" --no-deps -e .
  # torch warns in every process when the deprecated `pynvml` shim is present; we use nvidia-ml-py.
  "${uninstall[@]}" pynvml >/dev/null 2>&1 || true
  "$VENV/bin/python" -m pip check
  echo "$want" > "$STAMP"
else
  echo "setup: $VENV is up to date"
fi

if [ "${SETUP_BROWSER:-0}" = "1" ] && ! command -v chromium >/dev/null; then
  echo "setup: installing Debian's chromium + chromium-driver for the browser tests…"
  SUDO=""; [ "$(id -u)" = "0" ] || SUDO="sudo"
  $SUDO apt-get update -qq && $SUDO apt-get install -y -qq chromium chromium-driver >/dev/null
fi
