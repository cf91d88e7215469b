#!/bin/sh
# entrypoint-subreaper.sh: start sandbox-shim beside an image's own init, which stays PID 1.
#
#   entrypoint-subreaper.sh [SHIM OPTION]... -- INIT [ARG]...
#
# For images whose init must be PID 1 itself (systemd, s6-svscan, runit, an application
# that insists on it). Otherwise prefer the shim as PID 1 supervising the workload:
#   ENTRYPOINT ["sandbox-shim", "--listen", "unix:/run/sandbox-shim/shim.sock", "--"]
#   CMD ["my-server", "--port", "8080"]
# which forwards signals, reaps every orphan and exits with the workload's status.
#
# Here the shim runs in the background, not as PID 1, so it makes itself a child
# subreaper (PR_SET_CHILD_SUBREAPER): what its commands leave behind (`npm run dev &`)
# is reaped and ended by the shim, not dumped on the init. Then this script execs the
# init, which becomes PID 1 with the shim as its child. Example:
#
#   COPY sandbox-shim /usr/local/bin/
#   COPY entrypoint-subreaper.sh /usr/local/bin/
#   ENTRYPOINT ["entrypoint-subreaper.sh", "--listen", "unix:/run/sandbox-shim/shim.sock", "--"]
#   CMD ["/sbin/init"]
#
# Stopping: the shim ends gracefully on SIGTERM (TERM to every process it started, SIGKILL
# after --kill-grace, default 5 s). An init that signals all processes at shutdown
# (systemd, s6, runit's stage 3) gives it that; otherwise the kernel kills the shim when
# PID 1 exits. The shim's log goes to the container's stderr; its stdin is /dev/null.
set -eu

SHIM=${SANDBOX_SHIM:-/usr/local/bin/sandbox-shim}

usage() {
	echo "usage: entrypoint-subreaper.sh [SHIM OPTION]... -- INIT [ARG]..." >&2
	exit 2
}

# where the "--" is: the shim's options before it, the init's command after
n=0
found=
for a do
	if [ "$a" = "--" ]; then
		found=1
		break
	fi
	n=$((n + 1))
done
[ -n "$found" ] || usage
[ "$#" -gt $((n + 1)) ] || usage

# the shim, with the first n arguments only (a subshell keeps "$@" for the init)
(
	total=$#
	i=0
	for a do
		[ "$i" -lt "$n" ] && set -- "$@" "$a"
		i=$((i + 1))
	done
	shift "$total"
	exec "$SHIM" "$@" </dev/null
) &

shift $((n + 1))
exec "$@"
