#!/usr/bin/env bash
# Run the shim with a short demo: `bash tests/demo.sh` (from any directory).
#
# Installs what is missing (tests/deps.sh), builds the daemon and the CLI in build/,
# starts build/sandbox-shim on a unix socket in a fresh temporary directory, drives it
# with build/sbx (each command is echoed before it runs), then stops the shim with
# SIGTERM and checks that it exited cleanly.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

section()
{
	printf '\n==== %s ====\n' "$*"
}

section "dependencies (tests/deps.sh)"
bash tests/deps.sh

section "build (build/: sandbox-shim, sbx)"
cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo
cmake --build build -j2 --target sandbox-shim sbx-cli

dir=$(mktemp -d "${TMPDIR:-/tmp}/sbx-demo.XXXXXX")
sock="$dir/shim.sock"
shim_pid=

cleanup()
{
	local rc=$?
	if [ -n "$shim_pid" ] && kill -0 "$shim_pid" 2>/dev/null; then
		kill -TERM "$shim_pid" 2>/dev/null || true
		for _ in $(seq 50); do
			kill -0 "$shim_pid" 2>/dev/null || break
			sleep 0.1
		done
		kill -KILL "$shim_pid" 2>/dev/null || true
		wait "$shim_pid" 2>/dev/null || true
	fi
	[ -n "${S3_PID:-}" ] && kill "$S3_PID" 2>/dev/null # the mounts demo's s3rver
	if [ -s "$dir/shim.log" ]; then
		section "shim log ($dir/shim.log)"
		cat "$dir/shim.log"
	fi
	rm -rf "$dir"
	exit "$rc"
}
trap cleanup EXIT

# run CMD...: print the command, then run it.
run()
{
	local rc=0
	printf '\n$ %s\n' "$*"
	"$@" || rc=$?
	if [ "$rc" -ne 0 ]; then
		echo "demo: '$*' failed with exit status $rc" >&2
		exit "$rc"
	fi
}

section "start the shim"
echo "\$ build/sandbox-shim --listen unix:$sock --log-level info &"
build/sandbox-shim --listen "unix:$sock" --log-level info >"$dir/shim.log" 2>&1 &
shim_pid=$!
echo "shim pid $shim_pid (log: $dir/shim.log, printed at the end)"

SBX=(build/sbx -t "unix:$sock")

section "system calls"
run "${SBX[@]}" ping --wait 5
run "${SBX[@]}" info
run "${SBX[@]}" --json info
run "${SBX[@]}" echo --size 64M
run "${SBX[@]}" --trace ping

section "files"
work="$dir/work"
run "${SBX[@]}" mkdir -p "$work/notes"
printf 'hello from the host\n' >"$dir/hello.txt"
echo "\$ sbx put $work/notes/hello.txt < hello.txt"
"${SBX[@]}" put "$work/notes/hello.txt" <"$dir/hello.txt"
run "${SBX[@]}" cat "$work/notes/hello.txt"
run "${SBX[@]}" stat "$work/notes/hello.txt"
run "${SBX[@]}" cp "$work/notes/hello.txt" "$work/notes/copy.txt"
run "${SBX[@]}" ls -l "$work/notes"

section "commands"
run "${SBX[@]}" exec -- uname -sr
run "${SBX[@]}" sh "echo out; echo err >&2; ls $work/notes | wc -l"
echo "\$ sbx exec --timeout 0.2 -- sleep 5   # exits 124: timed out"
rc=0
"${SBX[@]}" exec --timeout 0.2 -- sleep 5 || rc=$?
echo "exit status $rc"
run "${SBX[@]}" exec --detach --name ticker -- sh -c 'for i in 1 2 3; do echo tick $i; sleep 0.1; done'
run "${SBX[@]}" wait ticker
run "${SBX[@]}" logs ticker
run "${SBX[@]}" ps

section "backups"
run "${SBX[@]}" backup "$work" -o "$dir/work.tar.zst" --compress zstd --json
run "${SBX[@]}" rm -r "$work/notes"
run "${SBX[@]}" restore "$work" -i "$dir/work.tar.zst"
run "${SBX[@]}" ls -R "$work"

# ---- issue 7: tunnels ----
section "tunnels"
# a web server inside on a kernel-chosen port, previewed on a kernel-chosen host port
run "${SBX[@]}" exec --detach --name web -- python3 -u -m http.server 0 --bind 127.0.0.1 --directory "$work"
web_port=
for _ in $(seq 500); do
	web_port=$("${SBX[@]}" logs web | sed -n 's/.* port \([0-9][0-9]*\) .*/\1/p' | head -n 1)
	[ -n "$web_port" ] && break
	sleep 0.01
done
[ -n "$web_port" ] || {
	echo "demo: http.server printed no port" >&2
	exit 1
}
echo "\$ sbx forward 0 $web_port &    # host 127.0.0.1:(kernel-chosen) -> 127.0.0.1:$web_port inside"
"${SBX[@]}" forward 0 "$web_port" 2>"$dir/forward.log" &
fwd_pid=$!
for _ in $(seq 500); do
	grep -qs "listening on" "$dir/forward.log" && break
	sleep 0.01
done
host_port=$(sed -n 's/.*listening on [^ ,]*:\([0-9][0-9]*\),.*/\1/p' "$dir/forward.log")
echo "\$ python3 -c 'urllib.request.urlopen(\"http://127.0.0.1:$host_port/notes/hello.txt\")'"
python3 -c 'import sys, urllib.request; sys.stdout.write(urllib.request.urlopen(sys.argv[1], timeout=10).read().decode())' \
	"http://127.0.0.1:$host_port/notes/hello.txt"
run "${SBX[@]}" tunnels
kill -INT "$fwd_pid"
wait "$fwd_pid" || true
cat "$dir/forward.log"
run "${SBX[@]}" rmproc -k web

# ---- issue 6: mounts (when s3rver, rclone and fusermount3 are installed and we are root) ----
# shellcheck source=tests/lib/s3rver.sh
source tests/lib/s3rver.sh
if [ "$(id -u)" = 0 ] && ! [ -x "$(s3rver_bin)" ]; then
	s3rver_install >&2 || echo "s3rver could not be installed from npm" >&2
fi
if [ "$(id -u)" = 0 ] && [ -x "$(s3rver_bin)" ] && command -v rclone >/dev/null && command -v fusermount3 >/dev/null; then
	section "mounts (a local s3rver bucket through rclone)"
	s3rver_start "$dir/s3" demo-bucket >/dev/null
	printf '\n$ s3_rclone rcat s3:demo-bucket/readme.txt    # an object put straight into the bucket\n'
	echo "hello from the bucket" | s3_rclone rcat s3:demo-bucket/readme.txt
	echo "\$ AWS_ACCESS_KEY_ID=... AWS_SECRET_ACCESS_KEY=... sbx mount demo-bucket $dir/bucket --endpoint $S3_ENDPOINT"
	AWS_ACCESS_KEY_ID=$S3_ACCESS_KEY AWS_SECRET_ACCESS_KEY=$S3_SECRET_KEY \
		run "${SBX[@]}" mount demo-bucket "$dir/bucket" --endpoint "$S3_ENDPOINT"
	run "${SBX[@]}" cat "$dir/bucket/readme.txt"
	run "${SBX[@]}" sh "date -u > '$dir/bucket/written-inside.txt'"
	run "${SBX[@]}" mounts
	run "${SBX[@]}" unmount "$dir/bucket"
	printf '\n$ s3_rclone ls s3:demo-bucket    # the object written inside is in the bucket\n'
	s3_rclone ls s3:demo-bucket
	s3rver_stop
else
	section "mounts: skipped (needs root, rclone, fuse3 and s3rver: source tests/lib/s3rver.sh; s3rver_install)"
fi

# ---- more demos go here ----
# Add them above the "stop the shim" section, each under its own section header,
# using run "${SBX[@]}" ... so the command is echoed.

section "stop the shim (SIGTERM)"
echo "\$ kill -TERM $shim_pid"
kill -TERM "$shim_pid"
rc=0
for _ in $(seq 100); do
	kill -0 "$shim_pid" 2>/dev/null || break
	sleep 0.1
done
if kill -0 "$shim_pid" 2>/dev/null; then
	echo "the shim did not exit within 10 s of SIGTERM" >&2
	exit 1
fi
wait "$shim_pid" || rc=$?
shim_pid=
echo "shim exited with status $rc"
if [ "$rc" -ne 0 ]; then
	echo "expected exit status 0 after SIGTERM" >&2
	exit 1
fi

section "demo done"
