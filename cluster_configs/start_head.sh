#!/usr/bin/env bash
# Starts the Ray head node of a hetero_ray cluster on this machine.
set -euo pipefail

HR_SCRIPT="start_head.sh"
. "$(dirname "${BASH_SOURCE[0]}")/common.sh"

hr_usage() {
  cat <<'EOF'
usage: cluster_configs/start_head.sh [--dry-run] [--block] [--temp-dir DIR] [-- RAY_START_ARGS...]

Starts the Ray head on this machine with token authentication, the node labels hetero_ray
places workers by (hetero-ray.io/device=gpu|cpu, hetero-ray.io/gpu-model=<model>), the
dashboard and job API on 127.0.0.1:8265, and a Prometheus endpoint on :8080.
Creates ~/.ray/auth_token if there is none; copy it to every worker and job submitter.

  --dry-run        print the `ray start` command instead of running it (writes nothing)
  --block          stay in the foreground (Ctrl-C stops the node)
  --temp-dir DIR   Ray's temp/session directory (default /tmp/ray, or $RAY_TEMP_DIR)
  -- ARGS          passed to `ray start` unchanged (e.g. -- --object-store-memory=4000000000)

Environment (defaults): HETERO_RAY_PORT=6379 HETERO_RAY_DASHBOARD_HOST=127.0.0.1
HETERO_RAY_DASHBOARD_PORT=8265 HETERO_RAY_CLIENT_PORT=10001 HETERO_RAY_METRICS_PORT=8080
HETERO_RAY_NODE_IP HETERO_RAY_NUM_CPUS HETERO_RAY_NUM_GPUS HETERO_RAY_DEVICE=gpu|cpu
HETERO_RAY_GPU_MODEL HETERO_RAY_LABELS HETERO_RAY_RESOURCES HETERO_RAY_RAY_BIN
RAY_AUTH_MODE=token RAY_AUTH_TOKEN_PATH=~/.ray/auth_token
GLOO_SOCKET_IFNAME / NCCL_SOCKET_IFNAME (default: the interface holding HETERO_RAY_NODE_IP,
or else the one Ray's own address lies on)  (details: cluster_configs/common.sh)

Stop it with `ray stop` (add --temp-dir's value as RAY_TMPDIR if you gave one).
EOF
}

hr_load_knobs
hr_parse_args "$@"
[ ${#HR_POSITIONAL[@]} -eq 0 ] || hr_die "unexpected argument ${HR_POSITIONAL[0]} (see --help)"
hr_find_ray
hr_detect_device
hr_setup_auth head
hr_setup_socket_ifname 8.8.8.8  # no packet is sent: the route Ray also takes to find its address

HR_ARGS=(
  --head
  "--port=$HETERO_RAY_PORT"
  --include-dashboard=true
  "--dashboard-host=$HETERO_RAY_DASHBOARD_HOST"
  "--dashboard-port=$HETERO_RAY_DASHBOARD_PORT"
  "--ray-client-server-port=$HETERO_RAY_CLIENT_PORT"
)
hr_common_start_args

node="${HETERO_RAY_NODE_IP:-$(hostname)}"
echo "$HR_SCRIPT: device $HR_DEVICE${HR_GPU_MODEL:+ ($HR_GPU_MODEL)}; labels $(hr_labels)"
if [ "$RAY_AUTH_MODE" = token ]; then
  token="$(hr_token_file)"
  cat <<EOF
$HR_SCRIPT: token authentication is on; token from $HR_TOKEN_SOURCE.
  Whoever holds the token can run any code on every node: treat it like an SSH private key.
  Each worker machine needs it before cluster_configs/start_worker.sh:
      scp $token WORKER:~/.ray/auth_token && ssh WORKER chmod 600 '~/.ray/auth_token'
  Each job submitter needs it, and RAY_AUTH_MODE=token:
      scp $node:$token ~/.ray/auth_token && chmod 600 ~/.ray/auth_token
      export RAY_AUTH_MODE=token
  (\`ray get-auth-token\` prints it.)
EOF
fi
cat <<EOF
$HR_SCRIPT: workers join with:   cluster_configs/start_worker.sh $node:$HETERO_RAY_PORT
$HR_SCRIPT: dashboard and job API on $HETERO_RAY_DASHBOARD_HOST:$HETERO_RAY_DASHBOARD_PORT
EOF
case "$HETERO_RAY_DASHBOARD_HOST" in
  127.*|localhost|::1)
    echo "$HR_SCRIPT: from another machine: ssh -N -L $HETERO_RAY_DASHBOARD_PORT:127.0.0.1:$HETERO_RAY_DASHBOARD_PORT $node, then"
    echo "    ray job submit --address http://127.0.0.1:$HETERO_RAY_DASHBOARD_PORT --working-dir . -- python jobs/train.py ..." ;;
  *)
    hr_warn "the dashboard and job API listen on $HETERO_RAY_DASHBOARD_HOST: whoever reaches that port with the token can run code here. Keep it off untrusted networks." ;;
esac

# The head's GCS declares a node dead after health_check_failure_threshold (5) failed checks,
# one every health_check_period_ms: 1 s instead of Ray's 3 s finds a vanished machine in ~5 s,
# so an elastic run continues sooner. A slow but alive node still has 10 s per check to answer.
export RAY_health_check_period_ms="${RAY_health_check_period_ms:-1000}"

hr_exec_ray_start "${HR_ARGS[@]}"
