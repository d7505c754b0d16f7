#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Multi-host test bed on one machine (issue 12, part 1). See scripts/TESTBED.md.
#
# H "hosts" are network namespaces, each with a UTS namespace of its own (its own hostname).
# R rails: rail r is a bridge (br0) in a "switch" namespace of its own; host h joins it by a
# veth pair (host side "rail<r>", switch side "h<h>"), subnet 10.(240+r).0.0/24, host h has
# 10.(240+r).0.(h+1), the switch's bridge 10.(240+r).0.254 (the far end of background traffic).
# Nothing is created in, or changed in, the caller's network namespace.
#
#   testbed.sh up      [--name N] --hosts H --rails R [--rate RATE] [--burst B] [--limit L] [--delay D]
#   testbed.sh down    [--name N]
#   testbed.sh status  [--name N]
#   testbed.sh run     [--name N] HOST cmd [args...]      cmd in HOST's net + UTS namespaces
#   testbed.sh shape   [--name N] HOST RAIL RATE [--burst B] [--limit L] [--delay D] [--dir both|up|down]
#   testbed.sh unshape [--name N] HOST RAIL
#   testbed.sh link    [--name N] HOST RAIL down|up
#   testbed.sh traffic [--name N] HOST RAIL start|stop [--dir up|down|bidir] [--bitrate B]
#   testbed.sh launch  [--name N] -n NRANKS [--placement cyclic|block] [--ifname IF] [--timeout S]
#                      [-x NAME=value]... [--chorus-run PATH] program [args...]
#   testbed.sh rank    [--name N] program [args...]     (used by launch: enter this rank's UTS ns)
#   testbed.sh exec    [--name N] --hosts H --rails R [--rate RATE] -- cmd [args...]
#   testbed.sh cleanup-stale [--all]
#   testbed.sh names   [--name N]                      (prints the namespace names, for scripts)
#
# HOST and RAIL are numbers from 0. Names: namespaces tbed-<N>-h<h> (hosts) and tbed-<N>-s<r>
# (rail switches); state (config, UTS namespace files, traffic pids and logs) in
# /run/testbed/<N>/ (TESTBED_STATE_ROOT overrides /run/testbed). Default name: $TESTBED_NAME,
# else "0" (exec: x<pid>).
set -uo pipefail

PREFIX=tbed
STATE_ROOT=${TESTBED_STATE_ROOT:-/run/testbed}
SELF=$(readlink -f "${BASH_SOURCE[0]}")
NAME=${TESTBED_NAME:-0}
NAME_GIVEN=${TESTBED_NAME:+1}

die() { echo "testbed: $*" >&2; exit 1; }
log() { [ -n "${TESTBED_QUIET:-}" ] || echo "testbed: $*" >&2; }

need_root() {
  [ "$(id -u)" = 0 ] || die "needs root (network and UTS namespaces)"
  command -v ip > /dev/null || die "needs iproute2 (ip)"
  command -v nsenter > /dev/null || die "needs nsenter (util-linux)"
}

check_name() {
  [[ "$NAME" =~ ^[a-z0-9]{1,12}$ ]] || die "name '$NAME': use 1 to 12 of [a-z0-9]"
}

state() { echo "$STATE_ROOT/$NAME"; }
host_ns() { echo "$PREFIX-$NAME-h$1"; }
switch_ns() { echo "$PREFIX-$NAME-s$1"; }
uts_file() { echo "$(state)/h$1.uts"; }
rail_addr() { echo "10.$((240 + $2)).0.$(($1 + 1))"; }   # rail_addr HOST RAIL
switch_addr() { echo "10.$((240 + $1)).0.254"; }

load_config() {
  local cfg
  cfg="$(state)/config"
  [ -f "$cfg" ] || die "no test bed '$NAME' (no $cfg); bring one up with: testbed.sh up --name $NAME ..."
  # shellcheck disable=SC1090
  . "$cfg"
}

check_host() {
  [[ "$1" =~ ^[0-9]+$ ]] && [ "$1" -lt "$HOSTS" ] || die "host '$1': the bed has hosts 0..$((HOSTS - 1))"
}
check_rail() {
  [[ "$1" =~ ^[0-9]+$ ]] && [ "$1" -lt "$RAILS" ] || die "rail '$1': the bed has rails 0..$((RAILS - 1))"
}

# ---- shaping -------------------------------------------------------------------------------

# Rate in bit/s from tc syntax (100mbit, 1gbit, 500kbit, 1000000).
rate_bps() {
  local v=$1 n unit
  [[ "$v" =~ ^([0-9]+)([a-zA-Z]*)$ ]] || die "rate '$v': expected e.g. 1gbit, 200mbit, 500kbit"
  n=${BASH_REMATCH[1]}
  unit=${BASH_REMATCH[2],,}
  case "$unit" in
    "" | bit) echo "$n" ;;
    kbit) echo $((n * 1000)) ;;
    mbit) echo $((n * 1000000)) ;;
    gbit) echo $((n * 1000000000)) ;;
    *) die "rate '$v': use bit, kbit, mbit or gbit" ;;
  esac
}

# shape_dev NS DEV RATE BURST LIMIT DELAY: tbf (under netem for a delay) as the root qdisc of
# DEV, changeable while traffic flows. Each call grafts a new qdisc (handles 1: and 2: in turn)
# in one `tc qdisc replace`: changing a tbf in place (same handle) left its queue stalled here
# (kernel 6.18, a GSO backlog: 0 bit/s until the handle changed).
shape_dev() {
  local ns=$1 dev=$2 rate=$3 burst=$4 limit=$5 delay=$6 bps handle=1
  bps=$(rate_bps "$rate")
  # Default burst: 2 ms at the rate, at least 32 KiB (GSO packets larger than it are cut by tbf).
  [ -n "$burst" ] || burst=$((bps / 8 / 500 > 32768 ? bps / 8 / 500 : 32768))
  local qlimit=(latency 50ms)
  [ -z "$limit" ] || qlimit=(limit "$limit")
  ip netns exec "$ns" tc qdisc show dev "$dev" root | grep -q "^qdisc [a-z]* 1: root" && handle=2
  if [ -n "$delay" ]; then
    if ! ip netns exec "$ns" tc qdisc add dev lo root netem delay 0ms 2> /dev/null; then
      echo "testbed: --delay needs the netem qdisc (sch_netem), which this kernel lacks" >&2
      return 1
    fi
    ip netns exec "$ns" tc qdisc del dev lo root 2> /dev/null
    ip netns exec "$ns" tc qdisc replace dev "$dev" root handle "$handle": netem delay "$delay" limit 100000 || return 1
    ip netns exec "$ns" tc qdisc replace dev "$dev" parent "$handle":1 handle "${handle}0": tbf rate "$rate" burst "$burst" "${qlimit[@]}"
  else
    ip netns exec "$ns" tc qdisc replace dev "$dev" root handle "$handle": tbf rate "$rate" burst "$burst" "${qlimit[@]}"
  fi
}

unshape_dev() {
  ip netns exec "$1" tc qdisc del dev "$2" root 2> /dev/null || true
}

# ---- up / down -----------------------------------------------------------------------------

# Removes everything of bed $NAME: processes left in its namespaces (they were started in the
# bed), the namespaces (their veths and bridges go with them), UTS files, the state dir.
teardown() {
  local st ns f pids
  st=$(state)
  if [ -d "$st" ]; then
    for f in "$st"/traffic-*.pids; do
      [ -f "$f" ] || continue
      # shellcheck disable=SC2046
      kill $(cat "$f") 2> /dev/null || true
      rm -f "$f"
    done
  fi
  local nss=()
  while read -r ns _; do
    [[ "$ns" == "$PREFIX-$NAME-"[hs]* ]] && nss+=("$ns")
  done < <(ip netns list 2> /dev/null)
  for ns in "${nss[@]}"; do
    pids=$(ip netns pids "$ns" 2> /dev/null)
    # shellcheck disable=SC2086
    [ -z "$pids" ] || kill $pids 2> /dev/null || true
  done
  for ns in "${nss[@]}"; do
    pids=$(ip netns pids "$ns" 2> /dev/null)
    for _ in 1 2 3 4 5 6 7 8 9 10; do
      [ -n "$pids" ] || break
      sleep 0.2
      pids=$(ip netns pids "$ns" 2> /dev/null)
    done
    # shellcheck disable=SC2086
    [ -z "$pids" ] || kill -KILL $pids 2> /dev/null || true
    ip netns del "$ns" 2> /dev/null || log "could not delete namespace $ns"
  done
  if [ -d "$st" ]; then
    for f in "$st"/*.uts; do
      [ -e "$f" ] || continue
      umount "$f" 2> /dev/null || true
      rm -f "$f"
    done
    rm -rf "$st"
  fi
}

# reachable NS ADDR: a TCP connection attempt from NS to ADDR's port 9 is refused (a RST came
# back) or accepted, within 3 s. No ping needed.
reachable() {
  local out
  out=$(ip netns exec "$1" timeout 3 bash -c "exec 3<> /dev/tcp/$2/9" 2>&1) && return 0
  [[ "$out" == *"refused"* ]]
}

cmd_up() {
  local hosts="" rails="" rate="" burst="" limit="" delay="" owner=""
  while [ $# -gt 0 ]; do
    case "$1" in
      --hosts) hosts=$2; shift 2 ;;
      --rails) rails=$2; shift 2 ;;
      --rate) rate=$2; shift 2 ;;
      --burst) burst=$2; shift 2 ;;
      --limit) limit=$2; shift 2 ;;
      --delay) delay=$2; shift 2 ;;
      --owner) owner=$2; shift 2 ;;  # exec: the bed dies with this process (cleanup-stale)
      *) die "up: unknown argument '$1'" ;;
    esac
  done
  [[ "$hosts" =~ ^[0-9]+$ ]] && [ "$hosts" -ge 1 ] && [ "$hosts" -le 200 ] || die "up: --hosts 1..200"
  [[ "$rails" =~ ^[0-9]+$ ]] && [ "$rails" -ge 1 ] && [ "$rails" -le 10 ] || die "up: --rails 1..10"
  [ -z "$rate" ] || rate_bps "$rate" > /dev/null
  local st
  st=$(state)
  [ ! -e "$st" ] || die "test bed '$NAME' exists ($st); 'testbed.sh down --name $NAME' first"
  local ns
  while read -r ns _; do
    [[ "$ns" != "$PREFIX-$NAME-"* ]] || die "namespace $ns exists without state; run 'testbed.sh cleanup-stale'"
  done < <(ip netns list 2> /dev/null)
  mkdir -p "$st"
  # Until the bed is complete, any failure (or a signal) takes down what was made.
  trap 'rc=$?; trap - EXIT INT TERM; log "up failed, rolling back"; teardown; exit $((rc ? rc : 1))' EXIT
  trap 'exit 130' INT TERM
  set -e
  {
    echo "HOSTS=$hosts"
    echo "RAILS=$rails"
    echo "OWNER=${owner}"
    echo "CREATED=$(date -u +%FT%TZ)"
  } > "$st/config.partial"
  # up of a bed that never completed is stale at once (cleanup-stale): the owner is us.
  echo "OWNER=$$" >> "$st/config.partial"
  local h r uts
  for ((r = 0; r < rails; r++)); do
    ns=$(switch_ns "$r")
    ip netns add "$ns"
    ip -n "$ns" link set lo up
    ip -n "$ns" link add br0 type bridge stp_state 0 forward_delay 0
    ip -n "$ns" addr add "$(switch_addr "$r")/24" dev br0
    ip -n "$ns" link set br0 up
  done
  for ((h = 0; h < hosts; h++)); do
    ns=$(host_ns "$h")
    ip netns add "$ns"
    ip -n "$ns" link set lo up
    # A persistent UTS namespace: unshare bind-mounts it on the file, and sets the hostname in it.
    uts=$(uts_file "$h")
    : > "$uts"
    unshare --uts="$uts" hostname "$ns"
    for ((r = 0; r < rails; r++)); do
      # Both ends are created in their namespaces: no name is ever taken in the caller's.
      ip link add "rail$r" netns "$ns" type veth peer name "h$h" netns "$(switch_ns "$r")"
      ip -n "$(switch_ns "$r")" link set "h$h" master br0
      ip -n "$(switch_ns "$r")" link set "h$h" up
      ip -n "$ns" addr add "$(rail_addr "$h" "$r")/24" dev "rail$r"
      ip -n "$ns" link set "rail$r" up
      if [ -n "$rate" ]; then
        shape_dev "$ns" "rail$r" "$rate" "$burst" "$limit" "$delay"
        shape_dev "$(switch_ns "$r")" "h$h" "$rate" "$burst" "$limit" "$delay"
      fi
    done
  done
  [ -z "${TESTBED_TEST_FAIL_UP:-}" ] || { echo "testbed: TESTBED_TEST_FAIL_UP set: failing on purpose" >&2; exit 1; }
  # Every host reaches every other on every rail (ARP resolved now, not in the first job).
  for ((r = 0; r < rails; r++)); do
    for ((h = 1; h < hosts; h++)); do
      reachable "$(host_ns 0)" "$(rail_addr "$h" "$r")" ||
        { echo "testbed: host 0 cannot reach host $h on rail $r" >&2; exit 1; }
    done
  done
  set +e
  grep -v '^OWNER=' "$st/config.partial" > "$st/config"
  echo "OWNER=${owner}" >> "$st/config"
  rm -f "$st/config.partial"
  trap - EXIT INT TERM
  log "bed '$NAME' up: $hosts hosts x $rails rails${rate:+, links shaped to $rate}"
  cmd_status
}

cmd_down() {
  [ $# -eq 0 ] || die "down: unknown argument '$1'"
  teardown
  log "bed '$NAME' down"
}

cmd_status() {
  load_config
  local h r ns
  echo "bed $NAME: $HOSTS hosts x $RAILS rails (created $CREATED${OWNER:+, owned by pid $OWNER}), state $(state)"
  for ((h = 0; h < HOSTS; h++)); do
    ns=$(host_ns "$h")
    printf 'host %d: netns %s, hostname %s\n' "$h" "$ns" \
      "$(nsenter --uts="$(uts_file "$h")" hostname 2> /dev/null || echo '?')"
    for ((r = 0; r < RAILS; r++)); do
      printf '  rail%d %-15s %-5s host->sw: %s | sw->host: %s\n' "$r" "$(rail_addr "$h" "$r")/24" \
        "$(ip -n "$ns" -br link show "rail$r" 2> /dev/null | awk '{print $2}')" \
        "$(ip netns exec "$ns" tc qdisc show dev "rail$r" 2> /dev/null | grep -E 'tbf|netem' | sed 's/qdisc //; s/ refcnt [0-9]*//' | tr '\n' ' ')" \
        "$(ip netns exec "$(switch_ns "$r")" tc qdisc show dev "h$h" 2> /dev/null | grep -E 'tbf|netem' | sed 's/qdisc //; s/ refcnt [0-9]*//' | tr '\n' ' ')"
    done
  done
  local f
  for f in "$(state)"/traffic-*.pids; do
    [ -f "$f" ] && echo "traffic: $(basename "$f" .pids) (pids $(tr '\n' ' ' < "$f"))"
  done
  return 0
}

# ---- run / shape / link / traffic ------------------------------------------------------------

# env for commands run in a host: who they are, in which bed.
host_env() {
  echo "TESTBED_NAME=$NAME" "TESTBED_HOST=$1" "TESTBED_HOSTS=$HOSTS" "TESTBED_RAILS=$RAILS"
}

cmd_run() {
  load_config
  [ $# -ge 2 ] || die "run: HOST cmd [args...]"
  local h=$1
  shift
  check_host "$h"
  # shellcheck disable=SC2046
  # ip netns exec, not nsenter --net: it also mounts the namespace's own /sys (tools that read
  # /sys/class/net see the host's rails, not the caller's interfaces).
  exec ip netns exec "$(host_ns "$h")" nsenter --uts="$(uts_file "$h")" -- \
    env $(host_env "$h") "$@"
}

cmd_shape() {
  load_config
  local args=() burst="" limit="" delay="" dir=both
  while [ $# -gt 0 ]; do
    case "$1" in
      --burst) burst=$2; shift 2 ;;
      --limit) limit=$2; shift 2 ;;
      --delay) delay=$2; shift 2 ;;
      --dir) dir=$2; shift 2 ;;
      *) args+=("$1"); shift ;;
    esac
  done
  [ ${#args[@]} -eq 3 ] || die "shape: HOST RAIL RATE [--burst B] [--limit L] [--delay D] [--dir both|up|down]"
  local h=${args[0]} r=${args[1]} rate=${args[2]}
  check_host "$h"
  check_rail "$r"
  rate_bps "$rate" > /dev/null
  case "$dir" in
    both | up | down) ;;
    *) die "shape: --dir both, up (host to switch) or down (switch to host)" ;;
  esac
  if [ "$dir" != down ]; then shape_dev "$(host_ns "$h")" "rail$r" "$rate" "$burst" "$limit" "$delay" || die "shape failed"; fi
  if [ "$dir" != up ]; then shape_dev "$(switch_ns "$r")" "h$h" "$rate" "$burst" "$limit" "$delay" || die "shape failed"; fi
  log "host $h rail $r shaped to $rate ($dir)"
}

cmd_unshape() {
  load_config
  [ $# -eq 2 ] || die "unshape: HOST RAIL"
  check_host "$1"
  check_rail "$2"
  unshape_dev "$(host_ns "$1")" "rail$2"
  unshape_dev "$(switch_ns "$2")" "h$1"
  log "host $1 rail $2 unshaped"
}

cmd_link() {
  load_config
  [ $# -eq 3 ] || die "link: HOST RAIL down|up"
  check_host "$1"
  check_rail "$2"
  case "$3" in
    down | up) ;;
    *) die "link: down or up" ;;
  esac
  # The host's side: its peer in the switch loses carrier, as with a pulled cable.
  ip -n "$(host_ns "$1")" link set "rail$2" "$3" || die "link $3 failed"
  if [ "$3" = up ]; then
    # Wait for the veth to carry again (carrier comes back at once on a veth).
    for _ in $(seq 50); do
      ip -n "$(host_ns "$1")" -br link show "rail$2" | grep -q ' UP ' && break
      sleep 0.1
    done
  fi
  log "host $1 rail $2 $3"
}

# Background traffic on the link of HOST on RAIL: between the host and the rail's switch
# (its bridge address), so that only that link carries it. iperf3 when installed, else a
# python3 sink and source (full speed, no --bitrate).
cmd_traffic() {
  load_config
  local args=() dir=bidir bitrate=""
  while [ $# -gt 0 ]; do
    case "$1" in
      --dir) dir=$2; shift 2 ;;
      --bitrate) bitrate=$2; shift 2 ;;
      *) args+=("$1"); shift ;;
    esac
  done
  [ ${#args[@]} -eq 3 ] || die "traffic: HOST RAIL start|stop [--dir up|down|bidir] [--bitrate B]"
  local h=${args[0]} r=${args[1]} what=${args[2]}
  check_host "$h"
  check_rail "$r"
  local tag="traffic-h$h-r$r" st
  st=$(state)
  local pidfile="$st/$tag.pids"
  case "$what" in
    stop)
      if [ -f "$pidfile" ]; then
        # shellcheck disable=SC2046
        kill $(cat "$pidfile") 2> /dev/null || true
        rm -f "$pidfile"
        log "traffic on host $h rail $r stopped"
      fi
      return 0
      ;;
    start) ;;
    *) die "traffic: start or stop" ;;
  esac
  [ ! -f "$pidfile" ] || die "traffic already runs on host $h rail $r"
  local port=$((5201 + h)) server client
  local snet hnet saddr haddr
  snet="/run/netns/$(switch_ns "$r")"
  hnet="/run/netns/$(host_ns "$h")"
  saddr=$(switch_addr "$r")
  haddr=$(rail_addr "$h" "$r")
  if command -v iperf3 > /dev/null && [ -z "${TESTBED_NO_IPERF3:-}" ]; then
    local opts=(-t 86400 -i 0 -l 128K)
    case "$dir" in
      up) ;;
      down) opts+=(-R) ;;
      bidir) opts+=(--bidir) ;;
      *) die "traffic: --dir up, down or bidir" ;;
    esac
    [ -z "$bitrate" ] || opts+=(-b "$bitrate")
    setsid nsenter --net="$snet" -- iperf3 -s -B "$saddr" -p "$port" -1 > "$st/$tag.server.log" 2>&1 < /dev/null &
    server=$!
    for _ in $(seq 50); do
      nsenter --net="$snet" -- ss -ltn 2> /dev/null | grep -q "$saddr:$port" && break
      sleep 0.1
    done
    setsid nsenter --net="$hnet" --uts="$(uts_file "$h")" -- \
      iperf3 -c "$saddr" -p "$port" -B "$haddr" "${opts[@]}" > "$st/$tag.client.log" 2>&1 < /dev/null &
    client=$!
  else
    local py=/usr/bin/python3  # not a shim (pyenv): the pid we keep must be python's
    [ -x "$py" ] || py=$(command -v python3) || die "traffic: needs iperf3 (scripts/install-deps.sh) or python3"
    [ -z "$bitrate" ] || log "traffic: --bitrate needs iperf3; sending at full speed"
    [ "$dir" = up ] || log "traffic: the python fallback sends host -> switch only (--dir up)"
    dir="up, python3"
    local py_sink="import socket
s=socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(('$saddr', $port)); s.listen(1); c,_=s.accept()
while c.recv(1<<20): pass"
    local py_src="import socket,time
for i in range(100):
    try: c=socket.create_connection(('$saddr', $port), source_address=('$haddr', 0)); break
    except OSError: time.sleep(0.1)
b=bytes(1<<20)
while True: c.sendall(b)"
    setsid nsenter --net="$snet" -- "$py" -c "$py_sink" > "$st/$tag.server.log" 2>&1 < /dev/null &
    server=$!
    setsid nsenter --net="$hnet" --uts="$(uts_file "$h")" -- "$py" -c "$py_src" > "$st/$tag.client.log" 2>&1 < /dev/null &
    client=$!
  fi
  printf '%s\n%s\n' "$client" "$server" > "$pidfile"
  sleep 0.3
  kill -0 "$client" 2> /dev/null || { cat "$st/$tag.client.log" >&2; cmd_traffic "$h" "$r" stop; die "traffic did not start"; }
  log "traffic on host $h rail $r started ($dir${bitrate:+, $bitrate}; logs $st/$tag.*.log)"
}

# ---- jobs ------------------------------------------------------------------------------------

# launch: one chorus-run on host 0 (the bootstrap root it creates listens there), ranks placed
# on hosts by chorus-run --netns (rank r -> list[r % len]); each rank passes through
# 'testbed.sh rank', which enters its host's UTS namespace, gives it the host identity and its
# local rank, and execs the program.
cmd_launch() {
  load_config
  local n="" placement=cyclic ifname=${CHORUS_SOCKET_IFNAME:-rail0} timeout=600 run="${CHORUS_RUN:-}" xs=()
  while [ $# -gt 0 ]; do
    case "$1" in
      -n | -np) n=$2; shift 2 ;;
      --placement) placement=$2; shift 2 ;;
      --ifname) ifname=$2; shift 2 ;;
      --timeout) timeout=$2; shift 2 ;;
      --chorus-run) run=$2; shift 2 ;;
      -x) xs+=(-x "$2"); shift 2 ;;
      --) shift; break ;;
      -*) die "launch: unknown option '$1'" ;;
      *) break ;;
    esac
  done
  [[ "$n" =~ ^[0-9]+$ ]] && [ "$n" -ge 1 ] || die "launch: -n NRANKS"
  [ $# -ge 1 ] || die "launch: no program"
  if [ -z "$run" ]; then
    run=$(command -v chorus-run || true)
    [ -n "$run" ] || run="$(dirname "$SELF")/../build/tools/chorus-run"
  fi
  [ -x "$run" ] || die "launch: chorus-run not found ($run); give --chorus-run or CHORUS_RUN"
  local list=() h k per
  case "$placement" in
    cyclic) for ((h = 0; h < HOSTS; h++)); do list+=("$(host_ns "$h")"); done ;;
    block)
      per=$(((n + HOSTS - 1) / HOSTS))
      for ((h = 0; h < HOSTS; h++)); do
        for ((k = 0; k < per; k++)); do list+=("$(host_ns "$h")"); done
      done
      ;;
    *) die "launch: --placement cyclic or block" ;;
  esac
  local csv
  csv=$(IFS=,; echo "${list[*]}")
  # The interface for the bootstrap root (created by chorus-run) and the ranks' sockets.
  cmd_run 0 env TESTBED_PLACEMENT="$csv" CHORUS_SOCKET_IFNAME="$ifname" \
    "$run" -n "$n" --timeout "$timeout" "${xs[@]+"${xs[@]}"}" \
    --netns "$csv" "$SELF" rank --name "$NAME" "$@"
}

cmd_rank() {
  load_config
  [ $# -ge 1 ] || die "rank: no program"
  # Which host: the one whose network namespace this process is in.
  local me h found=""
  me=$(stat -L -c %i /proc/self/ns/net)
  for ((h = 0; h < HOSTS; h++)); do
    if [ "$(stat -L -c %i "/run/netns/$(host_ns "$h")" 2> /dev/null)" = "$me" ]; then
      found=$h
      break
    fi
  done
  [ -n "$found" ] || die "rank: this process is in none of bed '$NAME''s hosts"
  local extra=(CHORUS_HOST_ID="$(host_ns "$found")")
  local rank=${CHORUS_RANK:-}
  if [ -n "${TESTBED_PLACEMENT:-}" ] && [ -n "$rank" ] && [ -n "${CHORUS_NRANKS:-}" ]; then
    # Local rank and size from the launcher's placement (rank r is on list[r % len]).
    local list j lr=0 ls=0
    IFS=, read -r -a list <<< "$TESTBED_PLACEMENT"
    for ((j = 0; j < CHORUS_NRANKS; j++)); do
      [ "${list[j % ${#list[@]}]}" = "$(host_ns "$found")" ] || continue
      [ "$j" -lt "$rank" ] && lr=$((lr + 1))
      ls=$((ls + 1))
    done
    extra+=("CHORUS_LOCAL_RANK=$lr" "LOCAL_RANK=$lr" "LOCAL_WORLD_SIZE=$ls")
  fi
  # shellcheck disable=SC2046
  # ip netns exec for the namespace's own /sys (chorus-run --netns only enters the net ns).
  exec ip netns exec "$(host_ns "$found")" nsenter --uts="$(uts_file "$found")" -- \
    env $(host_env "$found") "${extra[@]}" "$@"
}

cmd_exec() {
  local upargs=() owner=$$
  while [ $# -gt 0 ]; do
    case "$1" in
      --) shift; break ;;
      *) upargs+=("$1"); shift ;;
    esac
  done
  [ $# -ge 1 ] || die "exec: --hosts H --rails R [...] -- cmd [args...]"
  ("$SELF" up --name "$NAME" --owner "$owner" "${upargs[@]}") || exit 1
  trap 'TESTBED_QUIET=1 teardown' EXIT
  trap 'exit 130' INT TERM
  load_config
  local csv h
  csv=$(for ((h = 0; h < HOSTS; h++)); do host_ns "$h"; done | paste -sd,)
  TESTBED_NAME=$NAME TESTBED_HOSTS=$HOSTS TESTBED_RAILS=$RAILS TESTBED_NETNS=$csv \
    TESTBED=$SELF TESTBED_STATE=$(state) "$@"
  local rc=$?
  teardown
  trap - EXIT
  log "bed '$NAME' down (command exited with $rc)"
  return $rc
}

cmd_names() {
  load_config
  local h r
  for ((h = 0; h < HOSTS; h++)); do echo "host $h $(host_ns "$h") $(uts_file "$h")"; done
  for ((r = 0; r < RAILS; r++)); do echo "switch $r $(switch_ns "$r") br0 $(switch_addr "$r")/24"; done
}

# Removes beds whose owner (exec, or an up that never finished) is gone, and namespaces
# named tbed-<name>-h*/s* whose bed has no state; --all: every bed.
cmd_cleanup_stale() {
  local all=""
  [ "${1:-}" != --all ] || all=1
  local d owner n ns removed=0
  if [ -d "$STATE_ROOT" ]; then
    for d in "$STATE_ROOT"/*/; do
      [ -d "$d" ] || continue
      n=$(basename "$d")
      owner=""
      if [ -f "$d/config" ]; then
        owner=$(sed -n 's/^OWNER=//p' "$d/config" | tail -1)
      elif [ -f "$d/config.partial" ]; then
        owner=$(sed -n 's/^OWNER=//p' "$d/config.partial" | tail -1)
        [ -n "$owner" ] || owner=0
      else
        owner=0  # no config: a leftover
      fi
      if [ -n "$all" ] || { [ -n "$owner" ] && ! kill -0 "$owner" 2> /dev/null; }; then
        (NAME=$n; teardown)
        log "removed bed '$n'"
        removed=$((removed + 1))
      fi
    done
  fi
  while read -r ns _; do
    [[ "$ns" =~ ^$PREFIX-([a-z0-9]{1,12})-[hs][0-9]+$ ]] || continue
    n=${BASH_REMATCH[1]}
    [ -d "$STATE_ROOT/$n" ] && continue
    (NAME=$n; teardown)
    log "removed namespaces of bed '$n' (no state)"
    removed=$((removed + 1))
  done < <(ip netns list 2> /dev/null)
  log "cleanup-stale: $removed removed"
}

main() {
  [ $# -ge 1 ] || { sed -n '2,/^set -uo/p' "$SELF" | sed '$d; s/^# \{0,1\}//'; exit 2; }
  local cmd=$1
  shift
  case "$cmd" in
    -h | --help | help) sed -n '2,/^set -uo/p' "$SELF" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
  esac
  # --name may come anywhere before the command's own arguments.
  local rest=()
  while [ $# -gt 0 ]; do
    case "$1" in
      --name) NAME=$2; NAME_GIVEN=1; shift 2 ;;
      --) rest+=("$@"); break ;;
      *)
        if [ "$cmd" = run ] || [ "$cmd" = rank ] || [ "$cmd" = launch ]; then
          # After the host (run) or at the program (rank, launch) the rest is the command's own.
          if [ "$cmd" = run ] && [ ${#rest[@]} -eq 0 ]; then rest+=("$1"); shift; continue; fi
          if [ "$cmd" = launch ] && [[ "$1" == -* ]]; then rest+=("$1" "${2:-}"); shift 2 || shift; continue; fi
          rest+=("$@")
          break
        fi
        rest+=("$1")
        shift
        ;;
    esac
  done
  # exec without a name: one of its own (x<pid>), so that one-shot beds never collide.
  [ "$cmd" != exec ] || [ -n "$NAME_GIVEN" ] || NAME=x$$
  check_name
  need_root
  set -- "${rest[@]+"${rest[@]}"}"
  case "$cmd" in
    up) cmd_up "$@" ;;
    down) cmd_down "$@" ;;
    status) cmd_status "$@" ;;
    run) cmd_run "$@" ;;
    shape) cmd_shape "$@" ;;
    unshape) cmd_unshape "$@" ;;
    link) cmd_link "$@" ;;
    traffic) cmd_traffic "$@" ;;
    launch) cmd_launch "$@" ;;
    rank) cmd_rank "$@" ;;
    exec) cmd_exec "$@" ;;
    names) cmd_names "$@" ;;
    cleanup-stale) cmd_cleanup_stale "$@" ;;
    *) die "unknown command '$cmd' (testbed.sh help)" ;;
  esac
}

main "$@"
