#!/usr/bin/env bash
# cli_mount.sh: sbx mount, sbx mounts and sbx unmount against a real daemon and a local S3 server
# (s3rver, tests/lib/s3rver.sh): keys from the environment and from a credentials file, the record
# as text and JSON, objects checked with rclone straight against the bucket, usage errors.
#
# Usage: bash cli_mount.sh SHIM_BIN SBX_BIN [SECTION...]
# Starts its own s3rver and daemon in a mktemp -d directory and stops only them, by PID. Needs root
# (FUSE), rclone, fusermount3 and s3rver (installed on the way when missing); fails when they are
# not to be had.
set -uo pipefail

SHIM=${1:?usage: cli_mount.sh SHIM_BIN SBX_BIN [SECTION...]}
SBX=${2:?usage: cli_mount.sh SHIM_BIN SBX_BIN [SECTION...]}
shift 2
unset SBX_TARGET SBX_TOKEN AWS_ACCESS_KEY_ID AWS_SECRET_ACCESS_KEY AWS_SESSION_TOKEN
export LC_ALL=C

T=$(mktemp -d "${TMPDIR:-/tmp}/sbx-cli-mount.XXXXXX") || exit 1
T=$(cd "$T" && pwd -P)
# cleanup, fail, start_daemon, run, has, hasnt, empty, py, run_sections, stop_daemon, finish
# shellcheck source-path=SCRIPTDIR source=cli_lib.sh
. "$(dirname "$0")/cli_lib.sh"
# s3rver_install, s3rver_start, s3rver_stop, s3_rclone
# shellcheck source-path=SCRIPTDIR source=../lib/s3rver.sh
. "$(dirname "$0")/../lib/s3rver.sh"
RUN_TIMEOUT=60

# a mount left by a failed run must not outlive it (nor be descended into by rm -rf)
mount_cleanup()
{
	local mp
	while read -r mp; do
		umount -l "$mp" 2>/dev/null
	done < <(awk -v t="$T/" 'index($5, t) == 1 {print $5}' /proc/self/mountinfo | sort -r)
}
trap 'mount_cleanup; cleanup' EXIT

[ "$(id -u)" = 0 ] || {
	echo "cli_mount: FUSE mounts need root" >&2
	exit 1
}
if ! command -v rclone >/dev/null || ! command -v fusermount3 >/dev/null; then
	echo "cli_mount: rclone and fusermount3 are needed (apt-get install rclone fuse3)" >&2
	exit 1
fi
s3rver_install || exit 1
s3rver_start "$T/s3" bkt || exit 1
PIDS+=("$S3_PID")
start_daemon shim --listen "unix:$T/shim.sock"
TARGET=unix:$T/shim.sock

# mounted PATH: the topmost mount at PATH is rclone's
mounted()
{
	[ "$(awk -v d="$1" '$5 == d {t = $0} END {sub(/.* - /, "", t); split(t, f, " "); print f[1]}' /proc/self/mountinfo)" = fuse.rclone ]
}

sec_usage()
{
	run 2 mount
	run 2 mount bkt "$T/m"
	has err "--endpoint URL is required"
	# keys are never taken from the command line
	run 2 mount bkt "$T/m" --endpoint "$S3_ENDPOINT" --secret-access-key x
	run 1 mount bkt "$T/m" --endpoint "$S3_ENDPOINT"
	has err "no credentials"
	run 2 unmount
	run 2 mounts extra
	[ ! -e "$T/m" ] || fail "a refused mount left $T/m"
}

sec_env()
{
	local m=$T/env
	AWS_ACCESS_KEY_ID=$S3_ACCESS_KEY AWS_SECRET_ACCESS_KEY=$S3_SECRET_KEY run 0 mount bkt "$m" --endpoint "$S3_ENDPOINT"
	has out "state:         live"
	has out "path:          $m"
	mounted "$m" || fail "$m is not an rclone mount"
	run 0 sh "echo from-the-cli > '$m/cli.txt'"
	run 0 mounts
	has out "live"
	has out "$m"
	run 0 mounts --json
	py '
import json, sys
v = json.load(open(sys.argv[1]))
assert len(v) == 1 and v[0]["state"] == "live" and v[0]["path"] == sys.argv[2], v
assert v[0]["bucket"] == "bkt" and v[0]["rclone_pid"] > 0 and v[0]["read_only"] is False, v
' "$T/out" "$m"
	run 0 unmount "$m"
	empty out
	mounted "$m" && fail "$m still mounted"
	[ ! -e "$m" ] || fail "$m (made by the shim) is still there"
	[ "$(s3_rclone cat s3:bkt/cli.txt)" = from-the-cli ] || fail "cli.txt not in the bucket"
	# again: the same answer; unknown: ENOENT
	run 0 unmount --json "$m"
	py '
import json, sys
r = json.load(open(sys.argv[1]))
assert r["state"] == "unmounted" and r["path"] == sys.argv[2], r
' "$T/out" "$m"
	run 1 unmount 00000000-0000-4000-8000-000000000000
	has err ENOENT
	run 0 mounts --json
	[ "$(tr -d '\n' <"$T/out")" = "[]" ] || fail "mounts left: $(cat "$T/out")"
}

sec_credfile()
{
	local m=$T/cf secret=cli-secret-$$-$RANDOM
	(
		umask 077
		cat >"$T/creds" <<EOF
# test keys
[other]
aws_access_key_id = NOT-THIS-ONE
[default]
aws_access_key_id = $S3_ACCESS_KEY
aws_secret_access_key = $secret
region = us-east-1
EOF
	)
	run 0 mount bkt "$m" --endpoint "$S3_ENDPOINT" --credentials-file "$T/creds" --prefix pre --read-only --json
	py '
import json, sys
r = json.load(open(sys.argv[1]))
assert r["state"] == "live" and r["prefix"] == "pre" and r["read_only"] is True, r
' "$T/out"
	if grep -lsF -- "$secret" /proc/[0-9]*/cmdline /proc/[0-9]*/environ >"$T/leaks"; then
		fail "the secret is in $(cat "$T/leaks")"
	fi
	run 2 sh "echo x > '$m/nope.txt'"
	has err "Read-only file system"
	run 0 unmount "$m"
	# a file without the secret key; a key the server does not know
	printf 'aws_access_key_id = %s\n' "$S3_ACCESS_KEY" >"$T/creds2"
	run 1 mount bkt "$T/cf2" --endpoint "$S3_ENDPOINT" --credentials-file "$T/creds2"
	has err "needs aws_access_key_id and aws_secret_access_key"
	printf 'aws_access_key_id = NOSUCHKEY\naws_secret_access_key = x\n' >"$T/creds3"
	run 1 mount bkt "$T/cf3" --endpoint "$S3_ENDPOINT" --credentials-file "$T/creds3"
	has err EACCES
	has err InvalidAccessKeyId
	[ ! -e "$T/cf3" ] || fail "a refused mount left $T/cf3"
	run 1 mount bkt "$T/cf4" --endpoint "$S3_ENDPOINT" --credentials-file "$T/no-such-file"
	has err "no-such-file"
}

sec_errors()
{
	export AWS_ACCESS_KEY_ID=$S3_ACCESS_KEY AWS_SECRET_ACCESS_KEY=$S3_SECRET_KEY
	run 1 mount Bad_Bucket "$T/e" --endpoint "$S3_ENDPOINT"
	has err EINVAL
	has err "bucket"
	run 1 mount bkt "$T/e" --endpoint "ftp://127.0.0.1"
	has err "endpoint"
	run 1 mount bkt relative --endpoint "$S3_ENDPOINT"
	has err "absolute"
	run 1 mount bkt "$T/e" --endpoint "$S3_ENDPOINT" --option rc
	has err "not allowed"
	mkdir -p "$T/full" && echo x >"$T/full/f"
	run 1 mount bkt "$T/full" --endpoint "$S3_ENDPOINT"
	has err ENOTEMPTY
	run 0 mount bkt "$T/full" --endpoint "$S3_ENDPOINT" --allow-non-empty --option vfs-cache-mode=full
	run 1 mount bkt "$T/full" --endpoint "$S3_ENDPOINT" --allow-non-empty
	has err EBUSY
	run 0 unmount "$T/full"
	[ -f "$T/full/f" ] || fail "the directory's own file is gone"
	unset AWS_ACCESS_KEY_ID AWS_SECRET_ACCESS_KEY
}

SECTIONS=("$@")
[ ${#SECTIONS[@]} -gt 0 ] || SECTIONS=(usage env credfile errors)
run_sections "${SECTIONS[@]}"
stop_daemon
s3rver_stop
finish cli_mount
