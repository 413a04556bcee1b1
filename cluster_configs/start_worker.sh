#!/usr/bin/env bash
# Starts a Ray worker node of a hetero_ray cluster on this machine and joins the head.
set -euo pipefail

HR_SCRIPT="start_worker.sh"
. "$(dirname "${BASH_SOURCE[0]}")/common.sh"

hr_usage() {
  cat <<'EOF'
usage: cluster_configs/start_worker.sh [--dry-run] [--block] [--temp-dir DIR] HEAD[:PORT] [-- RAY_START_ARGS...]

Joins this machine to the Ray cluster whose head is at HEAD (port 6379 unless given;
or $HETERO_RAY_HEAD_ADDRESS), with token authentication and the node labels hetero_ray
places workers by (hetero-ray.io/device=gpu|cpu, hetero-ray.io/gpu-model=<model>).
Needs the head's token in ~/.ray/auth_token (or $RAY_AUTH_TOKEN_PATH / $RAY_AUTH_TOKEN):
    mkdir -p ~/.ray && scp HEAD:~/.ray/auth_token ~/.ray/auth_token && chmod 600 ~/.ray/auth_token

  --dry-run        print the `ray start` command instead of running it
  --block          stay in the foreground (Ctrl-C stops the node)
  --temp-dir DIR   Ray's temp/session directory (default /tmp/ray, or $RAY_TEMP_DIR)
  -- ARGS          passed to `ray start` unchanged

Environment (defaults): HETERO_RAY_PORT=6379 HETERO_RAY_METRICS_PORT=8080
HETERO_RAY_NODE_IP HETERO_RAY_NUM_CPUS HETERO_RAY_NUM_GPUS HETERO_RAY_DEVICE=gpu|cpu
HETERO_RAY_GPU_MODEL HETERO_RAY_LABELS HETERO_RAY_RESOURCES HETERO_RAY_RAY_BIN
RAY_AUTH_MODE=token RAY_AUTH_TOKEN_PATH=~/.ray/auth_token
GLOO_SOCKET_IFNAME / NCCL_SOCKET_IFNAME (default: the interface of the route to HEAD)
(details: cluster_configs/common.sh)
EOF
}

hr_load_knobs
hr_parse_args "$@"
case ${#HR_POSITIONAL[@]} in
  0) address="${HETERO_RAY_HEAD_ADDRESS:-}"
     [ -n "$address" ] || { hr_usage >&2; hr_die "give the head's address (HEAD[:PORT])"; } ;;
  1) address="${HR_POSITIONAL[0]}" ;;
  *) hr_die "one head address expected, got: ${HR_POSITIONAL[*]}" ;;
esac
case "$address" in
  *://*) hr_die "give the head's GCS address HEAD[:PORT] (e.g. 192.168.1.10:6379), not a URL" ;;
  *:*) ;;
  *) address="$address:$HETERO_RAY_PORT" ;;
esac
host="${address%:*}" port="${address##*:}"
case "$host" in
  ""|[!A-Za-z0-9]*|*[!A-Za-z0-9._-]*)
    hr_die "the head's address must be a host name or IPv4 address, then :PORT (e.g. 192.168.1.10:6379); got $(printf '%q' "$address")" ;;
esac
case "$port" in
  ""|0*|*[!0-9]*|??????*) hr_die "the head's port must be a number from 1 to 65535; got $(printf '%q' "$port")" ;;
esac
[ "$port" -le 65535 ] || hr_die "the head's port must be a number from 1 to 65535; got $port"
hr_find_ray
hr_detect_device
hr_setup_auth worker

# A wrong address or a firewall otherwise shows up as a long wait inside `ray start`.
[ "$HR_DRY_RUN" = 1 ] || hr_tcp_reachable "$host" "$port" \
  || hr_die "cannot reach the head at $address; is start_head.sh running there, and is port $port open to this machine?"
hr_setup_socket_ifname "$host"

HR_ARGS=("--address=$address")
hr_common_start_args
echo "$HR_SCRIPT: device $HR_DEVICE${HR_GPU_MODEL:+ ($HR_GPU_MODEL)}; labels $(hr_labels); token from ${HR_TOKEN_SOURCE:-nowhere (auth disabled)}"
hr_exec_ray_start "${HR_ARGS[@]}"
