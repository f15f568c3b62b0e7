#!/usr/bin/env bash
# A throw-away one-node Slurm cluster on localhost, for tests/integration/test_slurm.py and for trying
# the Slurm scripts on one machine. Needs root. Everything (munge key and socket, slurm.conf,
# state, logs, pidfiles) lives in DIR; the daemons are stopped by the PIDs in DIR.
#
#   slurm/localcluster.sh up DIR     # installs Debian's Slurm + munge if absent, starts munged,
#                                    # slurmctld and slurmd, waits for the node to be idle
#   export SLURM_CONF=DIR/slurm.conf # then sbatch / squeue / scontrol talk to it
#   slurm/localcluster.sh down DIR   # cancels the jobs, stops the three daemons
#
# CPUS=N advertises N CPUs on the node (default: nproc), e.g. to run two 2-task jobs at once.
# Several clusters can run side by side: each gets free ports and its own job-id range.
# The daemons log at debug level in DIR/log (tests/integration/test_slurm.py prints a failed job's lines
# from there); MessageTimeout is 30 s, not Slurm's 10, as the cluster shares a 2-core CI
# machine with the rest of the test suite.
set -euo pipefail

usage() { echo "usage: $0 up|down DIR" >&2; exit 2; }
die() { echo "localcluster: $*" >&2; exit 1; }

install_if_missing() {
    [[ -x /usr/sbin/slurmctld && -x /usr/sbin/slurmd && -x /usr/bin/sbatch
       && -x /usr/sbin/munged && -x /usr/sbin/mungekey ]] && return 0
    (( EUID == 0 )) || die "Slurm/munge are not installed and installing them needs root"
    echo "localcluster: installing slurmctld slurmd slurm-client munge (apt-get)"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq || die "apt-get update failed"
    apt-get install -y -qq --no-install-recommends slurmctld slurmd slurm-client munge \
        >/dev/null || die "apt-get install of slurmctld slurmd slurm-client munge failed"
}

start_munge() {
    local m=$DIR/munge
    mkdir -p "$m"
    /usr/sbin/mungekey --create --keyfile="$m/munge.key" >/dev/null \
        || die "mungekey --create failed"
    chown -R munge:munge "$m"
    chmod 0755 "$m"   # munged wants the socket directory searchable by all
    chmod 0600 "$m/munge.key"
    runuser -u munge -- /usr/sbin/munged --socket="$m/munge.socket" --key-file="$m/munge.key" \
        --pid-file="$m/munged.pid" --log-file="$m/munged.log" --seed-file="$m/munged.seed" \
        || die "munged did not start: $(tail -n 5 "$m/munged.log" 2>/dev/null)"
    munge -n -S "$m/munge.socket" | unmunge -S "$m/munge.socket" >/dev/null \
        || die "munge -n | unmunge failed against $m/munge.socket"
}

free_port_pair() {   # P with P and P+1 free, above the jobs' MASTER_PORT range (20000-39999)
    local port
    while :; do
        port=$((40000 + RANDOM % 20000))
        (: <"/dev/tcp/127.0.0.1/$port") 2>/dev/null && continue
        (: <"/dev/tcp/127.0.0.1/$((port + 1))") 2>/dev/null && continue
        echo "$port"
        return
    done
}

write_conf() {
    local host=$1 cpus=$2 port mem
    port=$(free_port_pair)
    mem=$(awk '/MemTotal/ {print int($2 / 1024 * 0.9)}' /proc/meminfo)
    mkdir -p "$DIR/state" "$DIR/spool" "$DIR/log"
    cat >"$DIR/slurm.conf" <<EOF
ClusterName=localcluster
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=$port
SlurmdPort=$((port + 1))
FirstJobId=$((10000 + RANDOM))
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$DIR/munge/munge.socket,cred_expire=5
StateSaveLocation=$DIR/state
SlurmdSpoolDir=$DIR/spool
SlurmctldPidFile=$DIR/slurmctld.pid
SlurmdPidFile=$DIR/slurmd.pid
SlurmctldLogFile=$DIR/log/slurmctld.log
SlurmdLogFile=$DIR/log/slurmd.log
ProctrackType=proctrack/cgroup
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerParameters=sched_interval=2,bf_interval=2
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
MpiDefault=none
SlurmdParameters=config_overrides
SlurmctldDebug=debug
SlurmdDebug=debug
MessageTimeout=30
ReturnToService=2
NodeName=$host NodeAddr=127.0.0.1 CPUs=$cpus RealMemory=$mem State=UNKNOWN
PartitionName=local Nodes=$host Default=YES MaxTime=INFINITE State=UP
EOF
    echo "CgroupPlugin=autodetect" >"$DIR/cgroup.conf"
}

pid_of() { [[ -s $1 ]] && cat "$1"; }   # empty until the daemon has written its pidfile
alive() { local pid; pid=$(pid_of "$1") && kill -0 "$pid" 2>/dev/null; }
exited() { local pid; pid=$(pid_of "$1") && ! kill -0 "$pid" 2>/dev/null; }

wait_idle() {
    local state='' daemon
    for _ in $(seq 30); do
        for daemon in slurmctld slurmd; do
            if exited "$DIR/$daemon.pid"; then
                die "$daemon exited: $(tail -n 3 "$DIR/log/$daemon.log" 2>/dev/null)"
            fi
        done
        state=$(timeout 5 sinfo -h -N -o %T 2>/dev/null || true)
        [[ $state == idle ]] && return 0
        sleep 1
    done
    die "node not idle after 30 s (sinfo: '$state');" \
        "slurmd.log: $(tail -n 3 "$DIR/log/slurmd.log" 2>/dev/null)"
}

up() {
    local host
    trap '(( $? == 0 )) || down' EXIT   # a failed start stops what it started
    install_if_missing
    mkdir -p "$DIR"
    DIR=$(cd "$DIR" && pwd)
    chmod 0755 "$DIR"   # munged (user munge) must reach DIR/munge
    host=$(hostname -s)
    getent hosts "$host" >/dev/null \
        || die "host name '$host' does not resolve; add it to /etc/hosts"
    start_munge
    write_conf "$host" "${CPUS:-$(nproc)}"
    export SLURM_CONF=$DIR/slurm.conf
    /usr/sbin/slurmctld -f "$SLURM_CONF" \
        || die "slurmctld did not start: $(tail -n 5 "$DIR/log/slurmctld.log" 2>/dev/null)"
    /usr/sbin/slurmd -f "$SLURM_CONF" -N "$host" \
        || die "slurmd did not start: $(tail -n 5 "$DIR/log/slurmd.log" 2>/dev/null)"
    wait_idle
    echo "localcluster: up; export SLURM_CONF=$SLURM_CONF"
}

stop_pidfile() {
    local pid
    pid=$(pid_of "$1") || return 0
    kill -TERM "$pid" 2>/dev/null || return 0
    for _ in $(seq 50); do
        kill -0 "$pid" 2>/dev/null || return 0
        sleep 0.2
    done
    kill -KILL "$pid" 2>/dev/null || true
}

down() {
    DIR=$(cd "$DIR" && pwd)
    export SLURM_CONF=$DIR/slurm.conf
    if alive "$DIR/slurmctld.pid" && timeout 10 scancel --full --user="$(id -un)"; then
        for _ in $(seq 40); do   # let slurmd reap the jobs' processes before it stops
            [[ -z $(timeout 5 squeue -h -o %i 2>/dev/null) ]] && break
            sleep 0.5
        done
    fi
    stop_pidfile "$DIR/slurmd.pid"
    stop_pidfile "$DIR/slurmctld.pid"
    stop_pidfile "$DIR/munge/munged.pid"
}

[[ $# == 2 ]] || usage
DIR=$2
case $1 in
    up) up ;;
    down) down ;;
    *) usage ;;
esac
