# shellcheck shell=bash
# shellcheck disable=SC2034  # the HR_* variables set here are read by the script that sources this
# Shared by start_head.sh and start_worker.sh (sourced, not run): the knobs, the node's
# device labels, token authentication, and the `ray start` call itself.
#
# Knobs (environment; a machine's own values may also live in ~/.hetero_ray/node.env,
# which is sourced first, so one launcher command line serves different machines):
#   HETERO_RAY_PORT=6379              GCS port of the head (workers: default port of the address)
#   HETERO_RAY_NODE_IP                this machine's address as the others see it (default: Ray picks)
#   HETERO_RAY_DASHBOARD_HOST=127.0.0.1  dashboard + job API bind address (head only)
#   HETERO_RAY_DASHBOARD_PORT=8265    dashboard + job API port (head only)
#   HETERO_RAY_CLIENT_PORT=10001      Ray client server port, ray:// (head only)
#   HETERO_RAY_METRICS_PORT=8080      Prometheus endpoint of this node
#   HETERO_RAY_NUM_CPUS / HETERO_RAY_NUM_GPUS   default: what Ray detects
#   HETERO_RAY_DEVICE=gpu|cpu         default: gpu when nvidia-smi lists a GPU
#   HETERO_RAY_GPU_MODEL              default: nvidia-smi's name, lower case, '-' for spaces
#   HETERO_RAY_LABELS                 more labels, "key=value,key=value"
#   HETERO_RAY_RESOURCES              custom resources as JSON, e.g. '{"nvme": 1}'
#   HETERO_RAY_RAY_BIN                the `ray` to run (default: `ray` on PATH)
#   RAY_TEMP_DIR                      Ray's temp/session dir (default /tmp/ray); same as --temp-dir
#   RAY_AUTH_MODE=token               token authentication; `disabled` turns it off (unsafe)
#   RAY_AUTH_TOKEN_PATH               token file (default ~/.ray/auth_token); Ray reads it too
#   RAY_AUTH_TOKEN                    the token itself (Kubernetes secrets); Ray reads it too
#   GLOO_SOCKET_IFNAME / NCCL_SOCKET_IFNAME   network interface for gloo / NCCL (default: the
#                                     one that carries this node's address; kept when set)

# The label names hetero_ray reads (hetero_ray/constants.py: DEVICE_LABEL, GPU_MODEL_LABEL).
HR_DEVICE_LABEL="hetero-ray.io/device"
HR_GPU_MODEL_LABEL="hetero-ray.io/gpu-model"

hr_die() {
  echo "$HR_SCRIPT: $*" >&2
  exit 2
}

hr_warn() {
  echo "$HR_SCRIPT: WARNING: $*" >&2
}

hr_load_knobs() {
  local node_env="${HETERO_RAY_NODE_ENV:-$HOME/.hetero_ray/node.env}"
  if [ -f "$node_env" ]; then
    # shellcheck disable=SC1090
    . "$node_env"
    echo "$HR_SCRIPT: settings of this machine from $node_env"
  fi
  HETERO_RAY_PORT="${HETERO_RAY_PORT:-6379}"
  HETERO_RAY_DASHBOARD_HOST="${HETERO_RAY_DASHBOARD_HOST:-127.0.0.1}"  # loopback: reach it through ssh -L
  HETERO_RAY_DASHBOARD_PORT="${HETERO_RAY_DASHBOARD_PORT:-8265}"
  HETERO_RAY_CLIENT_PORT="${HETERO_RAY_CLIENT_PORT:-10001}"
  HETERO_RAY_METRICS_PORT="${HETERO_RAY_METRICS_PORT:-8080}"
  HR_TEMP_DIR="${HR_TEMP_DIR:-${RAY_TEMP_DIR:-}}"
}

# Common options: --dry-run, --temp-dir DIR, --block, -h; after `--`, arguments go to
# `ray start` unchanged. Positional arguments are left in HR_POSITIONAL.
hr_parse_args() {
  HR_DRY_RUN=0
  HR_BLOCK=0
  HR_POSITIONAL=()
  HR_EXTRA=()
  while [ $# -gt 0 ]; do
    case "$1" in
      -h|--help) hr_usage; exit 0 ;;
      --dry-run) HR_DRY_RUN=1 ;;
      --block) HR_BLOCK=1 ;;
      --temp-dir) [ $# -ge 2 ] || hr_die "--temp-dir needs a directory"; HR_TEMP_DIR="$2"; shift ;;
      --temp-dir=*) HR_TEMP_DIR="${1#--temp-dir=}" ;;
      --) shift; HR_EXTRA=("$@"); break ;;
      -*) hr_die "unknown option $1 (see --help; options for \`ray start\` go after --)" ;;
      *) HR_POSITIONAL+=("$1") ;;
    esac
    shift
  done
}

hr_find_ray() {
  HR_RAY_BIN="${HETERO_RAY_RAY_BIN:-$(command -v ray || true)}"
  [ -n "$HR_RAY_BIN" ] && [ -x "$HR_RAY_BIN" ] || hr_die "\`ray\` not found; activate the project's virtualenv (source .venv/bin/activate) or set HETERO_RAY_RAY_BIN=/path/to/.venv/bin/ray"
  # Jobs run `python jobs/…` through PATH: put the Python that runs Ray first, so a job's
  # driver and its workers use the same interpreter and packages as this node.
  PATH="$(dirname "$HR_RAY_BIN"):$PATH"
  export PATH
}

# A label value from free text: lower case, runs of other characters become '-', at most
# 63 characters, alphanumeric at both ends (Ray/Kubernetes label syntax).
hr_label_value() {
  printf '%s' "$1" | tr '[:upper:]' '[:lower:]' \
    | sed -E 's/[^a-z0-9._-]+/-/g; s/^[^a-z0-9]+//' | cut -c1-63 | sed -E 's/[^a-z0-9]+$//'
}

# Sets HR_DEVICE (gpu|cpu), HR_GPU_MODEL, HR_NUM_GPUS (empty: Ray detects).
hr_detect_device() {
  local names="" first count distinct
  HR_NUM_GPUS="${HETERO_RAY_NUM_GPUS:-}"
  if command -v nvidia-smi >/dev/null 2>&1; then
    names="$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | sed -E 's/^ +| +$//g; /^$/d' || true)"
  fi
  case "${HETERO_RAY_DEVICE:-}" in
    gpu|cpu) HR_DEVICE="$HETERO_RAY_DEVICE" ;;
    "") if [ "$HR_NUM_GPUS" != "0" ] && [ -n "$names" ]; then HR_DEVICE=gpu; else HR_DEVICE=cpu; fi ;;
    *) hr_die "HETERO_RAY_DEVICE=$HETERO_RAY_DEVICE must be gpu or cpu" ;;
  esac
  HR_GPU_MODEL=""
  if [ "$HR_DEVICE" = cpu ]; then
    # A CPU node offers no GPU to Ray either, so labels and resources tell the same story.
    [ -z "$HR_NUM_GPUS" ] || [ "$HR_NUM_GPUS" = 0 ] \
      || hr_die "HETERO_RAY_NUM_GPUS=$HR_NUM_GPUS on a node labelled cpu; set HETERO_RAY_DEVICE=gpu or leave HETERO_RAY_NUM_GPUS unset"
    HR_NUM_GPUS=0
    return
  fi
  [ "$HR_NUM_GPUS" != "0" ] || hr_die "HETERO_RAY_DEVICE=gpu with HETERO_RAY_NUM_GPUS=0; a GPU node needs GPUs"
  if [ -n "${HETERO_RAY_GPU_MODEL:-}" ]; then
    HR_GPU_MODEL="$(hr_label_value "$HETERO_RAY_GPU_MODEL")"
  elif [ -n "$names" ]; then
    first="$(printf '%s\n' "$names" | head -n1)"
    count="$(printf '%s\n' "$names" | wc -l | tr -d ' ')"
    distinct="$(printf '%s\n' "$names" | sort -u | wc -l | tr -d ' ')"
    [ "$distinct" = 1 ] || hr_warn "this machine has $distinct GPU models; labelling it '$first'. Start one node per model (CUDA_VISIBLE_DEVICES + HETERO_RAY_GPU_MODEL) to keep them apart"
    HR_GPU_MODEL="$(hr_label_value "$first")"
    echo "$HR_SCRIPT: found $count GPU(s): $first"
  fi
  [ -n "$HR_GPU_MODEL" ] || hr_die "a GPU node needs its model: nvidia-smi did not name one; set HETERO_RAY_GPU_MODEL (e.g. nvidia-a100-sxm4-40gb)"
}

hr_labels() {
  local labels="$HR_DEVICE_LABEL=$HR_DEVICE"
  [ -z "$HR_GPU_MODEL" ] || labels="$labels,$HR_GPU_MODEL_LABEL=$HR_GPU_MODEL"
  if [ -n "${HETERO_RAY_LABELS:-}" ]; then
    case "$HETERO_RAY_LABELS" in
      *hetero-ray.io/*) hr_die "HETERO_RAY_LABELS may not set hetero-ray.io/ labels; use HETERO_RAY_DEVICE / HETERO_RAY_GPU_MODEL" ;;
    esac
    labels="$labels,$HETERO_RAY_LABELS"
  fi
  printf '%s' "$labels"
}

hr_token_file() {
  printf '%s' "${RAY_AUTH_TOKEN_PATH:-$HOME/.ray/auth_token}"
}

# Token authentication, on unless RAY_AUTH_MODE=disabled. Ray itself turns it on for
# `ray start` only when a token file exists, and never on a worker by itself: say it.
#   role head:   a missing token is generated (64 hex digits, mode 600)
#   role worker: a missing token is an error that says where to get it
hr_setup_auth() {
  local role="$1" file
  file="$(hr_token_file)"
  HR_TOKEN_SOURCE=""
  case "${RAY_AUTH_MODE:-token}" in
    token) ;;
    disabled)
      hr_warn "RAY_AUTH_MODE=disabled: anyone who can reach this node's ports can run code on it. Use this only on a network you fully control."
      export RAY_AUTH_MODE=disabled
      return ;;
    *) hr_die "RAY_AUTH_MODE=$RAY_AUTH_MODE must be token (the default) or disabled" ;;
  esac
  export RAY_AUTH_MODE=token
  if [ -n "${RAY_AUTH_TOKEN:-}" ]; then
    HR_TOKEN_SOURCE="the RAY_AUTH_TOKEN environment variable"
    return
  fi
  if [ -s "$file" ]; then
    HR_TOKEN_SOURCE="$file"
    local mode
    mode="$(stat -c %a "$file" 2>/dev/null || true)"
    case "$mode" in
      ""|600|400) ;;
      *) hr_warn "$file is readable by others (mode $mode); run: chmod 600 $file" ;;
    esac
    return
  fi
  if [ "$role" = worker ]; then
    hr_die "no Ray auth token at $file. Copy the head's token here first:
    mkdir -p $(dirname "$file") && scp HEAD:~/.ray/auth_token $file && chmod 600 $file
(on the head, \`ray get-auth-token\` prints it; or set RAY_AUTH_TOKEN_PATH / RAY_AUTH_TOKEN)"
  fi
  HR_TOKEN_SOURCE="$file"
  if [ "$HR_DRY_RUN" = 1 ]; then
    echo "$HR_SCRIPT: would generate a new auth token at $file"
    return
  fi
  # Written under umask 077 into a temporary file and moved into place: never a
  # world-readable or half-written token.
  (
    umask 077
    mkdir -p "$(dirname "$file")"
    od -An -tx1 -N32 /dev/urandom | tr -d ' \n' > "$file.tmp.$$"
    mv "$file.tmp.$$" "$file"
  ) || hr_die "could not write the auth token to $file"
  echo "$HR_SCRIPT: generated a new auth token at $file"
}

# Whether HOST:PORT ($1, $2) accepts a TCP connection within 10 s. Host and port reach
# bash's /dev/tcp as arguments, never as code: a "host" holding quotes, $(...) or ; is
# only a name that does not resolve.
hr_tcp_reachable() {
  local probe=(bash -c 'exec 3<>"/dev/tcp/$1/$2"' hr_tcp_probe "$1" "$2")
  ! command -v timeout >/dev/null || probe=(timeout 10 "${probe[@]}")
  "${probe[@]}" 2>/dev/null
}

# gloo and NCCL open their sockets on the address the host name resolves to unless they
# are given an interface; on many Linux hosts that is 127.0.1.1 (/etc/hosts), and every
# connection from another node is refused. Sets HR_IFNAME to the interface that carries
# this node's address and HR_IFNAME_FROM to how it was found (both empty if unknown):
#   HETERO_RAY_NODE_IP set  → the interface holding that address
#   else                    → the interface of the route towards $1 (the head, for a worker;
#                             8.8.8.8 for the head: Ray picks its node address the same way)
#   no such route           → the only interface with a global address, if there is one
hr_find_ifname() {
  local towards="$1" address=""
  HR_IFNAME="" HR_IFNAME_FROM=""
  command -v ip >/dev/null 2>&1 || return 0
  if [ -n "${HETERO_RAY_NODE_IP:-}" ]; then
    HR_IFNAME="$(ip -o addr show 2>/dev/null | awk -v ip="$HETERO_RAY_NODE_IP" \
      '{ split($4, a, "/"); if (a[1] == ip) { sub(/@.*/, "", $2); print $2; exit } }' || true)"
    HR_IFNAME_FROM="it holds HETERO_RAY_NODE_IP=$HETERO_RAY_NODE_IP"
    return 0
  fi
  if command -v getent >/dev/null 2>&1; then
    address="$(getent ahosts "$towards" 2>/dev/null | awk 'NR == 1 { print $1 }' || true)"
  fi
  HR_IFNAME="$(ip -o route get "${address:-$towards}" 2>/dev/null \
    | awk '{ for (i = 1; i < NF; i++) if ($i == "dev") { print $(i + 1); exit } }' || true)"
  HR_IFNAME_FROM="the route to $towards goes through it"
  if [ -z "$HR_IFNAME" ]; then
    HR_IFNAME="$(ip -o addr show scope global 2>/dev/null | awk '{ sub(/@.*/, "", $2); print $2 }' \
      | sort -u | awk '{ n++; name = $0 } END { if (n == 1) print name }' || true)"
    HR_IFNAME_FROM="it is the only interface with a global address"
  fi
  [ -n "$HR_IFNAME" ] || HR_IFNAME_FROM=""
}

# Exports GLOO_SOCKET_IFNAME and NCCL_SOCKET_IFNAME (see hr_find_ifname; $1: where the
# route is looked up towards). A value already set (environment or node.env) is kept.
# Ray starts every worker process of the node from `ray start`'s environment, so the
# training workers get them too.
hr_setup_socket_ifname() {
  if [ -z "${GLOO_SOCKET_IFNAME:-}" ] || [ -z "${NCCL_SOCKET_IFNAME:-}" ]; then
    hr_find_ifname "$1"
    if [ -n "$HR_IFNAME" ]; then
      GLOO_SOCKET_IFNAME="${GLOO_SOCKET_IFNAME:-$HR_IFNAME}"
      NCCL_SOCKET_IFNAME="${NCCL_SOCKET_IFNAME:-=$HR_IFNAME}"  # '=': this name exactly, not a prefix
      echo "$HR_SCRIPT: GLOO_SOCKET_IFNAME=$GLOO_SOCKET_IFNAME NCCL_SOCKET_IFNAME=$NCCL_SOCKET_IFNAME; this node's interface is $HR_IFNAME ($HR_IFNAME_FROM); set either variable to choose another"
    elif [ -n "${HETERO_RAY_NODE_IP:-}" ]; then
      hr_warn "no network interface of this machine holds HETERO_RAY_NODE_IP=$HETERO_RAY_NODE_IP (see \`ip -o addr\`); check the address, or set GLOO_SOCKET_IFNAME and NCCL_SOCKET_IFNAME, or training across nodes may fail with \"connection refused\""
    else
      hr_warn "could not tell which network interface carries this node's address (is \`ip\` installed?); set GLOO_SOCKET_IFNAME and NCCL_SOCKET_IFNAME (e.g. in ~/.hetero_ray/node.env), or training across nodes may fail with \"connection refused\""
    fi
  fi
  [ -z "${GLOO_SOCKET_IFNAME:-}" ] || export GLOO_SOCKET_IFNAME
  [ -z "${NCCL_SOCKET_IFNAME:-}" ] || export NCCL_SOCKET_IFNAME
}

# Runs (or, with --dry-run, prints) `ray start` with the arguments given.
hr_exec_ray_start() {
  local shown
  shown="$(printf ' %q' "$HR_RAY_BIN" start "$@")"
  [ -z "${NCCL_SOCKET_IFNAME:-}" ] || shown="$(printf ' NCCL_SOCKET_IFNAME=%q' "$NCCL_SOCKET_IFNAME")$shown"
  [ -z "${GLOO_SOCKET_IFNAME:-}" ] || shown="$(printf ' GLOO_SOCKET_IFNAME=%q' "$GLOO_SOCKET_IFNAME")$shown"
  echo "$HR_SCRIPT: RAY_AUTH_MODE=$RAY_AUTH_MODE${shown}"
  if [ "$HR_DRY_RUN" = 1 ]; then
    return 0
  fi
  exec "$HR_RAY_BIN" start "$@"
}

# Arguments both roles pass to `ray start`, appended to the array named HR_ARGS.
hr_common_start_args() {
  HR_ARGS+=("--metrics-export-port=$HETERO_RAY_METRICS_PORT" "--labels=$(hr_labels)" "--disable-usage-stats")
  [ -z "${HETERO_RAY_NODE_IP:-}" ] || HR_ARGS+=("--node-ip-address=$HETERO_RAY_NODE_IP")
  [ -z "${HETERO_RAY_NUM_CPUS:-}" ] || HR_ARGS+=("--num-cpus=$HETERO_RAY_NUM_CPUS")
  [ -z "$HR_NUM_GPUS" ] || HR_ARGS+=("--num-gpus=$HR_NUM_GPUS")
  [ -z "${HETERO_RAY_RESOURCES:-}" ] || HR_ARGS+=("--resources=$HETERO_RAY_RESOURCES")
  [ -z "$HR_TEMP_DIR" ] || HR_ARGS+=("--temp-dir=$HR_TEMP_DIR")
  [ "$HR_BLOCK" = 0 ] || HR_ARGS+=("--block")
  HR_ARGS+=("${HR_EXTRA[@]+"${HR_EXTRA[@]}"}")
}
