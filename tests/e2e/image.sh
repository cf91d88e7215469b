#!/usr/bin/env bash
# tests/e2e/image.sh: the image, end to end, with rootful podman, checked through the host's sbx.
#
#   bash tests/e2e/image.sh SBX_BIN        (as root; ctest runs it as e2e.image, label e2e)
#
# The Python checks load the pure-Python package from sdk/python/src.
#
# 1. podman, runc, debootstrap installed (tests/deps.sh --containers); podman's quirks on this
#    machine kind go to a private containers.conf ($CONTAINERS_CONF, nothing system-wide):
#    runtime runc (crun fails on this cgroup layout), cgroupfs, default ulimits no higher
#    than root's hard limits (root may lack CAP_SYS_RESOURCE).
# 2. the base image localhost/debian:bookworm-slim (debootstrap minbase + podman import) unless
#    it exists: `FROM debian:bookworm-slim` resolves to it, no registry needed. Kept as a cache.
# 3. podman build --pull=never of the top-level Dockerfile (the host's apt sources are mounted
#    into RUN steps read-only), of its two-file `bin` stage, and of container/Dockerfile.add-shim
#    with the binaries from that.
# 4. the shim as PID 1 (no workload; --network=host, /dev/fuse, SYS_ADMIN): ping over the
#    bind-mounted unix socket and over `podman exec -i CTR sandbox-shim --stdio`; files;
#    exec; a backup/restore round trip; orphans reaped, no zombies; a bucket mount against
#    an s3rver on the host's loopback (when the mount feature and tests/lib/s3rver.sh are
#    there); `podman stop`: SIGTERM reaches the shim's commands, mounts are flushed and
#    unmounted, exit 0 well within the grace period.
# 5. a workload as the image's CMD: supervised, its exit status is the container's; vsock
#    skipped without /dev/vsock, listened on with it. `podman run -it` with an interactive
#    bash driven through a pseudo-terminal: it reads the terminal, ^Z/fg/^C on its job, its
#    exit status, no line of the shim's on the terminal; `podman stop` of a workload that
#    stops on SIGQUIT (a stand-in for nginx, --stop-signal SIGQUIT) drains and exits 0.
# 6. TCP told by the environment: SANDBOX_SHIM_LISTEN=tcp:0.0.0.0:7070 and SANDBOX_SHIM_TOKEN_FILE
#    (a read-only bind-mounted token file), the port published on a kernel-chosen host port of
#    127.0.0.1: a ping and a file round trip from the host through the Python package
#    (sdk/python/src), a wrong token refused with EACCES, the unix socket wanting the token too,
#    `podman exec -i CTR sandbox-shim --stdio` still working; without a token the container
#    does not start and says why.
# 7. the add-shim image: the image's own init is PID 1, the shim a child subreaper beside it
#    (container/entrypoint-subreaper.sh): it answers, reaps its orphans, stops cleanly.
#
# Every container and image is named after this run and removed on exit; the base image and
# podman's layer cache stay (warm runs take seconds). Exit: 0 passed, 1 failed, 77 skipped
# (only where podman cannot run at all: not root, podman not installable, `podman info` or
# a trivial container failing).
#
# `image.sh --prepare` only does 1-3 (no checks): tests/run-tests.sh runs it in the background
# while it compiles, so that the test later finds the base image and podman's layer cache warm.
#
# Knobs: SBX_E2E_KEEP=1 keeps the containers, images and the work directory for a look.
# shellcheck disable=SC2016,SC2317 # sh -c scripts for the container; cleanup runs from the trap
set -uo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
PREPARE=0
SBX=${1:-}
if [ "$SBX" = --prepare ]; then
	PREPARE=1
elif [ -z "$SBX" ] || [ ! -x "$SBX" ]; then
	echo "usage: image.sh SBX_BIN | image.sh --prepare" >&2
	exit 2
else
	SBX=$(realpath "$SBX")
fi
BASE=localhost/debian:bookworm-slim
SKIP=77
FAILS=0
SECTION=setup
T0=$(date +%s%N)
RUN=$$-$(od -An -N4 -tx1 /dev/urandom | tr -d ' \n')
IMG=localhost/sandbox-shim-e2e:$RUN
IMG_ADD=localhost/sandbox-shim-e2e-add:$RUN
IMG_BIN=localhost/sandbox-shim-e2e-bin:$RUN
C1=sbx-e2e-$RUN-pid1
C2=sbx-e2e-$RUN-workload
C3=sbx-e2e-$RUN-subreaper
C4=sbx-e2e-$RUN-tcp
C5=sbx-e2e-$RUN-tcp-no-token
C6=sbx-e2e-$RUN-quit
W=$(mktemp -d /tmp/sbx-e2e.XXXXXX)
LOCKS=/run/lock
[ -d "$LOCKS" ] && [ -w "$LOCKS" ] || LOCKS=/tmp
CTRS=()
IMGS=()

elapsed()
{
	local now
	now=$(date +%s%N)
	echo "$(((now - T0) / 1000000000)).$((((now - T0) / 100000000) % 10))"
}

step()
{
	SECTION=$1
	printf '=== [+%ss] %s\n' "$(elapsed)" "$*"
}

fail()
{
	echo "image.sh:${BASH_LINENO[0]}: FAIL [$SECTION] $*" >&2
	FAILS=$((FAILS + 1))
}

skip()
{
	echo "image.sh: SKIP: $*"
	exit "$SKIP"
}

# want_eq GOT WANT WHAT
want_eq()
{
	[ "$1" = "$2" ] || {
		echo "image.sh:${BASH_LINENO[0]}: FAIL [$SECTION] $3: got '$1', want '$2'" >&2
		FAILS=$((FAILS + 1))
	}
}

# want_in HAYSTACK NEEDLE WHAT
want_in()
{
	[[ "$1" == *"$2"* ]] || {
		echo "image.sh:${BASH_LINENO[0]}: FAIL [$SECTION] $3: '$2' not in:" >&2
		printf '%s\n' "$1" | tail -n 15 >&2
		FAILS=$((FAILS + 1))
	}
}

cleanup()
{
	local rc=$?
	if [ "${SBX_E2E_KEEP:-0}" = 1 ]; then
		echo "image.sh: kept: containers ${CTRS[*]:-}, images ${IMGS[*]:-}, $W"
		return
	fi
	# one at a time: podman 4.3's `rm -f A B` removes neither when B does not exist
	local ctr
	for ctr in "${CTRS[@]}"; do
		podman rm -f -t 0 "$ctr" >/dev/null 2>&1
	done
	# the tags only: the layers stay in podman's build cache for the next run
	local img
	for img in "${IMGS[@]}"; do
		podman untag "$img" "$img" >/dev/null 2>&1
	done
	if declare -F s3rver_stop >/dev/null; then
		s3rver_stop
	fi
	rm -rf "$W"
	exit "$rc"
}
trap cleanup EXIT
trap 'exit 1' INT TERM

# sbx through a target, with a time limit: sbxt TARGET ARGS...
sbxt()
{
	local target=$1
	shift
	timeout -k 5 120 "$SBX" -t "$target" "$@"
}

# json_field JSON NAME: a number or true/false field of one-line JSON
json_field()
{
	sed -n "s/.*\"$2\":\([^,}]*\).*/\1/p" <<<"$1"
}

# no_zombies CTR: fail if any process in CTR is a zombie
no_zombies()
{
	local z
	z=$(podman exec "$1" sh -c 'grep -l "^State:[[:space:]]*Z" /proc/[0-9]*/status 2>/dev/null; true')
	want_eq "$z" "" "zombies in $1"
}

# ppid_of CTR PID: PID's parent inside CTR (empty when PID is gone)
ppid_of()
{
	podman exec "$1" sh -c "sed -n 's/^PPid:[[:space:]]*//p' /proc/$2/status 2>/dev/null; true"
}

# wait_gone CTR PID SECONDS: until PID no longer exists in CTR (reaped, not a zombie)
wait_gone()
{
	local i
	for ((i = 0; i < $3 * 10; i++)); do
		podman exec "$1" test -e "/proc/$2" || return 0
		sleep 0.1
	done
	return 1
}

# stop_quickly CTR: podman stop CTR (grace 20 s) and fail unless it took under 8 s
stop_quickly()
{
	local ts ms
	ts=$(date +%s%N)
	podman stop -t 20 "$1" >/dev/null || fail "podman stop $1"
	ms=$((($(date +%s%N) - ts) / 1000000))
	[ "$ms" -lt 8000 ] || fail "podman stop $1 took $ms ms"
}

# ---------------------------------------------------------------------------------------------
step prereq "podman, runc, debootstrap"
[ "${SBX_SKIP_E2E:-0}" = 1 ] && skip "SBX_SKIP_E2E=1"
[ "$(id -u)" -eq 0 ] || skip "needs root (rootful podman)"
if ! command -v podman >/dev/null || ! command -v runc >/dev/null || ! command -v debootstrap >/dev/null; then
	bash "$ROOT/tests/deps.sh" --containers >"$W/deps.log" 2>&1 || {
		tail -n 5 "$W/deps.log"
		skip "podman/runc/debootstrap missing and not installable (tests/deps.sh --containers)"
	}
fi
NOFILE=$(ulimit -Hn)
NPROC=$(ulimit -Hu)
PIDMAX=$(cat /proc/sys/kernel/pid_max)
[ "$NOFILE" = unlimited ] && NOFILE=1048576
if [ "$NPROC" = unlimited ] || [ "$NPROC" -gt "$PIDMAX" ]; then
	NPROC=$PIDMAX
fi
cat >"$W/containers.conf" <<EOF
[containers]
default_ulimits = ["nofile=${NOFILE}:${NOFILE}", "nproc=${NPROC}:${NPROC}"]
[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
EOF
export CONTAINERS_CONF=$W/containers.conf
podman --version
podman info --format 'podman: driver={{.Store.GraphDriverName}} runtime={{.Host.OCIRuntime.Name}} cgroups={{.Host.CgroupsVersion}}' \
	>"$W/info" 2>&1 || {
	cat "$W/info"
	skip "podman cannot run here (podman info failed)"
}
cat "$W/info"

# leftovers of earlier runs of this test that were killed before their trap ran (a ctest
# timeout): containers and tags named after a run whose process is gone
for c in $(podman ps -a --format '{{.Names}}' | grep -E '^sbx-e2e-[0-9]+-[0-9a-f]{8}-'); do
	p=${c#sbx-e2e-}
	kill -0 "${p%%-*}" 2>/dev/null || podman rm -f -t 0 "$c" >/dev/null 2>&1
done
for t in $(podman images --format '{{.Repository}}:{{.Tag}}' | grep -E '^localhost/sandbox-shim-e2e(-add|-bin)?:[0-9]+-[0-9a-f]{8}$'); do
	p=${t##*:}
	kill -0 "${p%%-*}" 2>/dev/null || podman untag "$t" "$t" >/dev/null 2>&1
done

# ---------------------------------------------------------------------------------------------
step base "base image $BASE"
if ! podman image exists "$BASE"; then
	# one builder at a time; a concurrent run waits and then finds the image
	exec 9>"$LOCKS/sandbox-shim-e2e-base.lock"
	flock 9
	if ! podman image exists "$BASE"; then
		MIRROR=$(awk '/^URIs:/{print $2; exit}' /etc/apt/sources.list.d/debian.sources 2>/dev/null)
		[ -n "$MIRROR" ] || MIRROR=$(awk '/^deb /{print $2; exit}' /etc/apt/sources.list 2>/dev/null)
		[ -n "$MIRROR" ] || MIRROR=http://deb.debian.org/debian
		echo "debootstrap --variant=minbase bookworm from $MIRROR"
		if ! debootstrap --variant=minbase bookworm "$W/rootfs" "$MIRROR" >"$W/debootstrap.log" 2>&1; then
			tail -n 20 "$W/debootstrap.log" >&2
			fail "debootstrap failed"
			exit 1
		fi
		rm -rf "$W"/rootfs/var/cache/apt/archives/*.deb "$W"/rootfs/var/lib/apt/lists/*
		# no apt sources of the machine's in the image: the host's are mounted while building
		rm -f "$W/rootfs/etc/apt/sources.list"
		tar -C "$W/rootfs" -c . | podman import -q --change 'CMD ["bash"]' - "$BASE" >/dev/null || {
			fail "podman import failed"
			exit 1
		}
		rm -rf "$W/rootfs"
	fi
	exec 9>&-
fi
podman run --rm --pull=never --network=none "$BASE" true >"$W/smoke.log" 2>&1 || {
	cat "$W/smoke.log"
	skip "podman cannot run a container here"
}

# ---------------------------------------------------------------------------------------------
step build "podman build $IMG"
# the build stage installs every library tests/deps.sh does (Check's libsubunit-dev is for tests)
for pkg in $(grep -oE '^[[:space:]]+[a-z0-9.+-]+-dev\b' "$ROOT/tests/deps.sh" | tr -d ' \t'); do
	[ "$pkg" = libsubunit-dev ] && continue
	grep -qE "[[:space:]]$pkg([[:space:]]|\$)" "$ROOT/Dockerfile" ||
		fail "$pkg is in tests/deps.sh but not in the Dockerfile's build stage"
done
# one build at a time: a run waits for a --prepare in progress, then hits its cache
exec 8>"$LOCKS/sandbox-shim-e2e-build.lock"
flock 8
APT_MOUNT=()
if [ -f /etc/apt/sources.list.d/debian.sources ]; then
	APT_MOUNT=(-v /etc/apt/sources.list.d/debian.sources:/etc/apt/sources.list.d/debian.sources:ro)
elif [ -f /etc/apt/sources.list ]; then
	APT_MOUNT=(-v /etc/apt/sources.list:/etc/apt/sources.list:ro)
fi
tb=$(date +%s%N)
IMGS+=("$IMG")
if ! podman build --pull=never "${APT_MOUNT[@]}" -t "$IMG" -f "$ROOT/Dockerfile" "$ROOT" >"$W/build.log" 2>&1; then
	tail -n 40 "$W/build.log" >&2
	fail "podman build failed"
	exit 1
fi
echo "image built in $((($(date +%s%N) - tb) / 1000000)) ms"
# the two-file `bin` stage (all of it in the cache now), as the source of the add-shim example
IMGS+=("$IMG_BIN")
if ! podman build --pull=never "${APT_MOUNT[@]}" --target bin -t "$IMG_BIN" -f "$ROOT/Dockerfile" "$ROOT" \
	>"$W/build-bin.log" 2>&1; then
	tail -n 40 "$W/build-bin.log" >&2
	fail "podman build --target bin failed"
	exit 1
fi
IMGS+=("$IMG_ADD")
# by its ID, not its per-run tag: the same binaries hit podman's layer cache again
bin_id=$(podman image inspect --format '{{.Id}}' "$IMG_BIN")
if ! podman build --pull=never --build-arg SHIM_IMAGE="$bin_id" --build-arg BASE_IMAGE="$BASE" -t "$IMG_ADD" \
	-f "$ROOT/container/Dockerfile.add-shim" "$ROOT/container" >"$W/build-add.log" 2>&1; then
	tail -n 40 "$W/build-add.log" >&2
	fail "podman build of container/Dockerfile.add-shim failed"
	exit 1
fi
exec 8>&-
if [ "$PREPARE" = 1 ]; then
	step "done" "prepared (base image and layer cache) in $(elapsed) s"
	exit 0
fi
podman image inspect "$IMG" --format 'entrypoint={{.Config.Entrypoint}} cmd={{.Config.Cmd}} size={{.Size}}'
out=$(podman run --rm --pull=never --network=none --entrypoint sh "$IMG" -c \
	'ls /usr/local/bin; rclone version | head -1; command -v fusermount3; ls /etc/ssl/certs/ca-certificates.crt; stat -c %a /run/sandbox-shim; ls -d /run/sandbox-shim-state 2>&1')
want_in "$out" "sandbox-shim" "the image's /usr/local/bin"
want_in "$out" "sbx" "the image's /usr/local/bin"
want_in "$out" "rclone v" "rclone in the image"
want_in "$out" "/usr/bin/fusermount3" "fuse3 in the image"
want_in "$out" "ca-certificates.crt" "CA certificates in the image"
want_in "$out" $'\n755' "mode of /run/sandbox-shim (the shared socket directory)"
want_in "$out" "cannot access '/run/sandbox-shim-state': No such file" "the private state dir: made by the shim, not the image"

# ---------------------------------------------------------------------------------------------
step sockdir "a shared socket dir that others may write is refused"
# 0777 and not sticky: anyone on the host could swap the socket
mkdir -m 0700 "$W/sockww" && chmod 0777 "$W/sockww"
out=$(podman run --rm --pull=never --network=none -v "$W/sockww:/run/sandbox-shim" "$IMG" 2>&1)
want_eq "$?" 1 "exit status of the image with a world-writable socket dir"
want_in "$out" "the socket directory /run/sandbox-shim is writable by others (mode 0777" \
	"why the image with a world-writable socket dir did not start"

# ---------------------------------------------------------------------------------------------
step pid1 "the shim as PID 1, no workload ($C1)"
# the socket dir shared with the host: any mode its owner gives it (0755 here, not 0700)
mkdir -m 0700 "$W/data1"
mkdir -m 0755 "$W/sock1"
S1=unix:$W/sock1/shim.sock
CTRS+=("$C1")
podman run -d --pull=never --name "$C1" --network=host --device /dev/fuse --cap-add SYS_ADMIN \
	-v "$W/sock1:/run/sandbox-shim" -v "$W/data1:/data" "$IMG" >/dev/null || {
	fail "podman run $C1 failed"
	exit 1
}
if ! sbxt "$S1" ping --wait 30 >"$W/ping1" 2>&1; then
	cat "$W/ping1"
	podman logs "$C1" 2>&1 | tail -n 20
	fail "no answer on the bind-mounted socket"
	exit 1
fi
cat "$W/ping1"
js=$(sbxt "$S1" --json ping)
want_eq "$(json_field "$js" pid)" 1 "pid over the unix socket"
want_eq "$(json_field "$js" pid1)" true "pid1 over the unix socket"
want_eq "$(sbxt "$S1" exec -- cat /proc/1/comm)" sandbox-shim "/proc/1/comm in the container"
want_eq "$(podman inspect "$C1" --format '{{.State.Pid}}' | xargs -I{} cat /proc/{}/comm)" sandbox-shim \
	"the container's init process seen from the host"
logs=$(podman logs "$C1" 2>&1)
want_in "$logs" "not listening on vsock:-1:1024: no /dev/vsock here" "vsock absent: skipped"
want_in "$logs" "listening on unix:/run/sandbox-shim/shim.sock" "unix listener"
want_in "$logs" "ready (pid 1, PID 1)" "ready line"
want_eq "$(stat -c %a "$W/sock1/shim.sock")" 600 "mode of the socket in the shared dir"
want_eq "$(stat -c %a "$W/sock1")" 755 "mode of the shared dir, unchanged"
want_eq "$(sbxt "$S1" exec -- stat -c %a /run/sandbox-shim-state)" 700 "mode of the private state dir in the container"

# a second shim in the same container, through podman exec -i ... --stdio
SX="exec:podman exec -i $C1 sandbox-shim --stdio"
if js=$(sbxt "$SX" --json ping 2>"$W/err"); then
	want_eq "$(json_field "$js" pid1)" false "pid1 of the --stdio shim"
	want_eq "$(sbxt "$SX" exec -- cat /proc/1/comm)" sandbox-shim "/proc/1/comm through --stdio"
	want_eq "$(sbxt "$SX" sh 'echo via-stdio' 2>/dev/null)" via-stdio "exec through --stdio"
else
	cat "$W/err" >&2
	fail "sbx -t '$SX' ping failed"
fi
# the static sbx inside the image, on the socket
want_in "$(podman exec "$C1" sbx -t unix:/run/sandbox-shim/shim.sock ping 2>&1)" "pid 1 pid1=yes" \
	"the image's own sbx"

# ---------------------------------------------------------------------------------------------
step files "files through the container"
head -c 300000 /dev/urandom >"$W/blob"
printf 'line\0with NUL\n' >>"$W/blob"
sbxt "$S1" put --parents /data/in/blob.bin <"$W/blob" || fail "sbx put"
sbxt "$S1" cat /data/in/blob.bin >"$W/blob.back" || fail "sbx cat"
cmp -s "$W/blob" "$W/blob.back" || fail "sbx cat returned other bytes than sbx put sent"
cmp -s "$W/blob" "$W/data1/in/blob.bin" || fail "the file in the container differs (via the bind mount)"
want_eq "$(podman exec "$C1" sha256sum /data/in/blob.bin | cut -d' ' -f1)" \
	"$(sha256sum "$W/blob" | cut -d' ' -f1)" "sha256 inside the container"
sbxt "$S1" cat /data/nope >/dev/null 2>"$W/err"
want_eq "$?" 1 "sbx cat of a missing file"
want_in "$(cat "$W/err")" "ENOENT" "sbx cat of a missing file"
sbxt "$S1" mkdir -p /data/d/e || fail "sbx mkdir -p"
want_eq "$(sbxt "$S1" ls /data/d)" e "sbx ls"

# ---------------------------------------------------------------------------------------------
step exec "commands"
out=$(sbxt "$S1" sh 'echo out; echo err >&2; exit 7' 2>"$W/err")
want_eq "$?" 7 "exit status of a command"
want_eq "$out" out "stdout of a command"
want_eq "$(cat "$W/err")" err "stderr of a command"
want_eq "$(printf 'abc\0def' | sbxt "$S1" exec -i -- sha256sum | cut -d' ' -f1)" \
	"$(printf 'abc\0def' | sha256sum | cut -d' ' -f1)" "stdin of a command"
want_eq "$(sbxt "$S1" exec --cwd /data/in -- ls)" blob.bin "cwd of a command"
want_in "$(sbxt "$S1" exec -- sh -c 'cat /proc/$PPID/comm; cat /proc/self/status' )" "sandbox-shim" \
	"a command's parent"

# ---------------------------------------------------------------------------------------------
step backup "backup and restore round trip"
podman exec "$C1" sh -c 'mkdir -p /data/tree/sub/deeper && echo one > /data/tree/a.txt &&
	head -c 100000 /dev/urandom > /data/tree/sub/r.bin && ln -s ../a.txt /data/tree/sub/link &&
	chmod 0600 /data/tree/a.txt && echo deep > /data/tree/sub/deeper/d && mkfifo /data/tree/fifo' ||
	fail "making the tree"
if sbxt "$S1" backup /data/tree -o "$W/tree.tar" 2>"$W/backup.json"; then
	want_in "$(cat "$W/backup.json")" '"sha256"' "backup record"
	tar -tf "$W/tree.tar" >"$W/tree.list" || fail "the backup is no tar archive"
	want_in "$(cat "$W/tree.list")" "sub/deeper/d" "backup members"
	sbxt "$S1" restore /data/restored -i "$W/tree.tar" 2>"$W/restore.json" || fail "sbx restore"
	# the same tree, types, modes, link targets and bytes
	listing='cd "$1" && find . -printf "%p %y %m %l %s\n" | sort && find . -type f -exec sha256sum {} + | sort'
	a=$(podman exec "$C1" sh -c "$listing" - /data/tree)
	b=$(podman exec "$C1" sh -c "$listing" - /data/restored)
	want_eq "$b" "$a" "restored tree"
	# a restore replaces the directory as a whole
	sbxt "$S1" rm -r /data/restored/sub || fail "sbx rm -r"
	echo stray | sbxt "$S1" put /data/restored/stray || fail "sbx put stray"
	sbxt "$S1" restore /data/restored -i "$W/tree.tar" 2>/dev/null || fail "second sbx restore"
	want_eq "$(podman exec "$C1" sh -c "$listing" - /data/restored)" "$a" "tree restored over a changed one"
	# a corrupted archive is refused, the directory left as it was
	sbxt "$S1" restore /data/restored -i "$W/tree.tar" --sha256 "$(printf '0%.0s' {1..64})" 2>"$W/err"
	want_eq "$?" 1 "restore with a wrong sha256"
	want_eq "$(podman exec "$C1" sh -c "$listing" - /data/restored)" "$a" "tree after a refused restore"
else
	cat "$W/backup.json" >&2
	fail "sbx backup"
fi

# ---------------------------------------------------------------------------------------------
step orphans "orphans are reaped by PID 1"
# the command exits at once; its backgrounded children are orphans of the namespace's init
opids=$(sbxt "$S1" sh 'for i in 1 2 3 4 5; do sleep 0.5 </dev/null >/dev/null 2>&1 & echo $!; done; exit 0')
want_eq "$(wc -w <<<"$opids")" 5 "orphan pids"
op=$(head -n 1 <<<"$opids")
pp=$(ppid_of "$C1" "$op")
[ -z "$pp" ] || want_eq "$pp" 1 "parent of an orphan"
for op in $opids; do
	wait_gone "$C1" "$op" 5 || fail "orphan $op not reaped (still in /proc after 5 s)"
done
# the brief's case: a background sleep outliving its shell
sbxt "$S1" exec -- sh -c 'sleep 0.2 & exit 0' || fail "sh -c 'sleep 0.2 & exit 0'"
sleep 0.6
no_zombies "$C1"

# ---------------------------------------------------------------------------------------------
step mount "bucket mount inside the container"
MOUNTED=0
if [ -f "$ROOT/tests/lib/s3rver.sh" ] && "$SBX" --help 2>&1 | grep -qE '^ +mount '; then
	# shellcheck source=../lib/s3rver.sh
	. "$ROOT/tests/lib/s3rver.sh"
	if ! s3rver_install >"$W/s3install.log" 2>&1; then
		cat "$W/s3install.log" >&2
		fail "s3rver_install"
	elif ! s3rver_start "$W/s3" e2e-bucket; then
		fail "s3rver_start"
	else
		echo "s3rver on $S3_ENDPOINT (host loopback; the container shares the host's network)"
		echo 'object put in the bucket directly' | s3_rclone rcat s3:e2e-bucket/from-s3.txt ||
			fail "s3_rclone rcat"
		if AWS_ACCESS_KEY_ID=$S3_ACCESS_KEY AWS_SECRET_ACCESS_KEY=$S3_SECRET_KEY \
			sbxt "$S1" mount e2e-bucket /mnt/bucket --endpoint "$S3_ENDPOINT" >"$W/mount.out" 2>&1; then
			MOUNTED=1
			cat "$W/mount.out"
			want_in "$(sbxt "$S1" mounts 2>&1)" "/mnt/bucket" "sbx mounts"
			want_in "$(podman exec "$C1" cat /proc/self/mountinfo)" " /mnt/bucket " "mountinfo in the container"
			want_eq "$(sbxt "$S1" cat /mnt/bucket/from-s3.txt)" "object put in the bucket directly" \
				"an object read through the mount"
			echo 'written through the mount' | sbxt "$S1" put /mnt/bucket/via-put.txt || fail "sbx put into the mount"
			sbxt "$S1" sh 'echo "written by a command" > /mnt/bucket/via-exec.txt' || fail "a command writing into the mount"
			got=""
			for ((i = 0; i < 100; i++)); do
				got=$(s3_rclone cat s3:e2e-bucket/via-put.txt 2>/dev/null) && [ -n "$got" ] && break
				sleep 0.1
			done
			want_eq "$got" "written through the mount" "the object in the bucket (read with rclone on the host)"
			# left mounted: the stop below must flush and unmount it
			echo 'written just before stop' | sbxt "$S1" put /mnt/bucket/before-stop.txt ||
				fail "sbx put before stop"
			# the mount's config (with the keys) is in the private state dir, never in the
			# directory shared with the host
			want_eq "$(ls -A "$W/sock1")" "shim.sock" "the shared socket dir holds the socket alone"
			want_in "$(sbxt "$S1" exec -- sh -c 'ls /run/sandbox-shim-state/mounts/*/rclone.conf')" \
				"/run/sandbox-shim-state/mounts/" "the rclone config in the private state dir"
			grep -rqs "$S3_SECRET_KEY" "$W/sock1" && fail "the S3 secret in the shared socket dir"
		else
			cat "$W/mount.out" >&2
			podman logs "$C1" 2>&1 | tail -n 20 >&2
			fail "sbx mount in the container"
		fi
	fi
else
	echo "NOT RUN: needs tests/lib/s3rver.sh and 'sbx mount' (the mount feature, issue 6)"
fi

# ---------------------------------------------------------------------------------------------
step stop "podman stop: SIGTERM, children stopped, unmounted, exit 0"
# a command that records the SIGTERM it gets, a plain one, and one that ignores SIGTERM (the
# shim SIGKILLs it after its --kill-grace, 5 s, still within podman's default 10 s)
sbxt "$S1" exec --detach -- sh -c 'trap "echo got-term > /data/term; exit 0" TERM; while :; do sleep 0.1; done' \
	>/dev/null || fail "detached command"
sbxt "$S1" exec --detach -- sleep 1000 >/dev/null || fail "detached sleep"
sbxt "$S1" exec --detach -- sh -c 'trap "" TERM; echo $$ > /data/stubborn; while :; do sleep 0.1; done' \
	>/dev/null || fail "detached stubborn command"
sleep 0.3
ts=$(date +%s%N)
podman stop "$C1" >/dev/null || fail "podman stop"
ms=$((($(date +%s%N) - ts) / 1000000))
echo "podman stop took $ms ms (podman's default grace 10 s; the shim's --kill-grace 5 s)"
[ "$ms" -ge 4500 ] || fail "podman stop took $ms ms: the SIGTERM-ignoring command was not given its grace"
[ "$ms" -lt 9500 ] || fail "podman stop took $ms ms: the shim did not end within podman's grace"
# 0, not 137: the shim exited by itself, podman did not have to SIGKILL it
want_eq "$(podman inspect "$C1" --format '{{.State.ExitCode}}')" 0 "exit code after podman stop"
want_eq "$(cat "$W/data1/term" 2>/dev/null)" got-term "SIGTERM delivered to a command"
[ -s "$W/data1/stubborn" ] || fail "the SIGTERM-ignoring command did not run"
[ ! -e "$W/sock1/shim.sock" ] || fail "the socket file is still there after the stop"
logs=$(podman logs "$C1" 2>&1)
want_in "$logs" "shutting down (SIGTERM)" "shutdown log"
want_in "$logs" "the grace period is over; SIGKILL to what is left" "SIGKILL after the grace period"
want_eq "$(tail -n 1 <<<"$logs" | sed 's/.*info: //')" exit "last log line"
if [ "$MOUNTED" = 1 ]; then
	want_in "$logs" "/mnt/bucket unmounted" "the shim's log of the unmount at shutdown"
	want_eq "$(s3_rclone cat s3:e2e-bucket/before-stop.txt 2>&1)" "written just before stop" \
		"a write just before the stop is in the bucket"
	want_eq "$(s3_rclone cat s3:e2e-bucket/via-exec.txt 2>&1)" "written by a command" \
		"a command's write is in the bucket"
	grep -q ' /mnt/bucket ' /proc/self/mountinfo && fail "a bucket mount leaked to the host"
fi

# ---------------------------------------------------------------------------------------------
step workload "a workload as the image's command ($C2)"
mkdir -m 0750 "$W/sock2"
CTRS+=("$C2")
podman run -d --pull=never --name "$C2" --network=none -v "$W/sock2:/run/sandbox-shim" "$IMG" \
	sh -c 'echo workload-up; trap "echo workload-term; exit 3" TERM; while :; do sleep 0.1; done' >/dev/null ||
	fail "podman run $C2"
S2=unix:$W/sock2/shim.sock
if sbxt "$S2" ping --wait 30 >/dev/null; then
	want_eq "$(json_field "$(sbxt "$S2" --json ping)" pid1)" true "pid1 with a workload"
	# the workload runs as a child of PID 1: the container's only sh started by the image
	wl=$(sbxt "$S2" sh 'for p in /proc/[0-9]*; do [ "$p" = /proc/$$ ] && continue
		tr "\0" " " 2>/dev/null <$p/cmdline | grep -q "^sh -c echo workload-up" && sed -n "s/^PPid:\t//p" $p/status; done; true')
	want_eq "$wl" 1 "parent of the workload"
	sleep 0.2
	stop_quickly "$C2"
	want_eq "$(podman inspect "$C2" --format '{{.State.ExitCode}}')" 3 "the container exits with the workload's status"
	logs=$(podman logs "$C2" 2>&1)
	want_in "$logs" "workload-up" "the workload's output"
	want_in "$logs" "workload-term" "SIGTERM reached the workload"
else
	podman logs "$C2" 2>&1 | tail -n 20
	fail "no answer from $C2"
fi
podman run --rm --pull=never --network=none "$IMG" sh -c 'exit 7' >/dev/null 2>&1
want_eq "$?" 7 "podman run IMG sh -c 'exit 7'"
if [ -e /dev/vsock ]; then
	# where the runtime provides /dev/vsock, the listener is there (a kernel-chosen port here:
	# a plain container's vsock is the host's)
	out=$(podman run --rm --pull=never --network=none --device /dev/vsock \
		--entrypoint '["/usr/local/bin/sandbox-shim","--listen-optional","vsock:-1:4294967295","--log-level","info","--"]' \
		"$IMG" true 2>&1)
	want_eq "$?" 0 "the shim with /dev/vsock"
	want_in "$out" "listening on vsock:-1:4294967295" "vsock listener with /dev/vsock"
fi

# podman run -it: the shell is the terminal's foreground and reads it (no SIGTTIN stop), job
# control works inside it, and the shim (PID 1, quiet by default) writes nothing there
if out=$(timeout -k 5 180 python3 - "$IMG" 2>&1 <<'EOF'
import os, pty, select, sys, time
pid, fd = pty.fork()
if pid == 0:
    os.execvp("podman", ["podman", "run", "-it", "--rm", "--pull=never", "--network=none", sys.argv[1],
                         "bash", "--norc", "--noprofile", "-i"])
seen = b""
def expect(want, secs=60):
    global seen
    end = time.time() + secs
    while want not in seen:
        left = end - time.time()
        r = select.select([fd], [], [], left)[0] if left > 0 else []
        data = b""
        if r:
            try:
                data = os.read(fd, 4096)
            except OSError:
                pass
        if not data:
            sys.exit("no %r on the terminal; it shows: %r" % (want, seen[-600:]))
        seen += data
    cut = seen.index(want) + len(want)     # what came after it is for the next expect
    print(seen[:cut].decode(errors="replace"), end="")
    seen = seen[cut:]
def send(b):
    os.write(fd, b)
send(b"PS1='ps''1> '\n")                # the echoes of what is typed never match
expect(b"ps1> ")
# a job of one process (dash's vfork would leave a window where ^Z cannot stop it)
send(b"bash -c 'while :; do echo t\"\"ick; read -t 0.2 </dev/tty; done'\n")
expect(b"tick")
send(b"\x1a")                           # ^Z: the job stops, bash has the terminal back
expect(b"Stopped")
expect(b"ps1> ")
send(b"fg\n")
expect(b"tick")                         # running again, in the foreground
send(b"\x03")                           # ^C: the job ends, not bash
expect(b"ps1> ")
send(b"echo jc-$((6*7))\n")
expect(b"jc-42")
send(b"exit 3\n")
while True:
    try:
        if not os.read(fd, 4096):
            break
    except OSError:
        break
_, st = os.waitpid(pid, 0)
print("\nexit", os.waitstatus_to_exitcode(st))
EOF
); then
	want_in "$out" "exit 3" "podman run -it bash: its exit status"
	[[ "$out" != *"sandbox-shim["* ]] || fail "the shim wrote to the container's terminal: $out"
else
	printf '%s\n' "$out" >&2
	fail "podman run -it with an interactive bash"
fi

# podman stop of a workload that stops on SIGQUIT (nginx's graceful stop): the shim passes
# SIGQUIT on and waits for the drain; the container exits 0
CTRS+=("$C6")
if podman run -d --pull=never --name "$C6" --network=none --stop-signal SIGQUIT "$IMG" \
	sh -c 'trap "echo quit-drain; sleep 1; echo drained; exit 0" QUIT; echo up; while :; do sleep 0.1; done' \
	>/dev/null; then
	for _ in $(seq 100); do
		podman logs "$C6" 2>&1 | grep -qx up && break
		sleep 0.1
	done
	stop_quickly "$C6"
	want_eq "$(podman inspect "$C6" --format '{{.State.ExitCode}}')" 0 "exit code after podman stop with SIGQUIT"
	logs=$(podman logs "$C6" 2>&1)
	want_in "$logs" "quit-drain" "SIGQUIT reached the workload"
	want_in "$logs" "drained" "the workload's drain ran to its end"
else
	fail "podman run $C6"
fi

# ---------------------------------------------------------------------------------------------
step tcp "TCP from the environment, a published port, the Python package ($C4)"
# a hex token (what `head -c 32 /dev/urandom | base64` would do, minus the punctuation)
od -An -N24 -tx1 /dev/urandom | tr -d ' \n' >"$W/token"
chmod 0600 "$W/token"
CTRS+=("$C4")
if ! podman run -d --pull=never --name "$C4" -e SANDBOX_SHIM_LISTEN=tcp:0.0.0.0:7070 \
	-e SANDBOX_SHIM_TOKEN_FILE=/run/secrets/shim-token -v "$W/token:/run/secrets/shim-token:ro" \
	-p 127.0.0.1::7070 "$IMG" >/dev/null; then
	fail "podman run $C4"
else
	# "127.0.0.1:PORT": the host port the kernel chose
	hp=$(podman port "$C4" 7070/tcp | head -n 1)
	PORT=${hp##*:}
	T4=tcp:127.0.0.1:$PORT
	echo "published: $hp"
	[[ "$hp" == 127.0.0.1:* ]] && [ "$PORT" -gt 0 ] 2>/dev/null || fail "podman port $C4 7070/tcp: '$hp'"
	if sbxt "$T4" --token-file "$W/token" ping --wait 30 >"$W/ping4" 2>&1; then
		cat "$W/ping4"
		logs=$(podman logs "$C4" 2>&1)
		want_in "$logs" "listening on tcp:0.0.0.0:7070" "the tcp listener from SANDBOX_SHIM_LISTEN"
		want_in "$logs" "listening on unix:/run/sandbox-shim/shim.sock" "the entrypoint's unix listener beside it"
		want_in "$logs" "ready (pid 1, PID 1)" "ready line"
		# through the Python package's public API, from the host; the wrong token after
		if out=$(env -u SBX_TOKEN -u SBX_TARGET PYTHONDONTWRITEBYTECODE=1 timeout -k 5 120 python3 - "$ROOT/sdk/python/src" "$T4" \
			"$W/token" 2>&1 <<'EOF'
import hashlib, os, sys
sys.path.insert(0, sys.argv[1])
from sandbox_shim import SandboxError, Shim

target, token = sys.argv[2], open(sys.argv[3]).read().strip()
data = os.urandom(1 << 20) + bytes(range(256)) + b"\0\r\n"  # more than one frame, every byte value
with Shim.connect(target, token=token) as shim:
    shim.ping()
    shim.files.write_file("/tmp/e2e-tcp.bin", data)
    back = shim.files.read_file("/tmp/e2e-tcp.bin")
    if back != data:
        sys.exit(f"read_file returned {len(back)} other bytes than the {len(data)} written")
print(f"python: ping, {len(data)} bytes written and read back byte-exact over {target}")
print("sha256", hashlib.sha256(data).hexdigest())
for wrong in (token + "x", token[:-1]):
    try:
        with Shim.connect(target, token=wrong) as shim:
            shim.ping()
    except SandboxError as e:
        if e.errno_name != "EACCES" or "bad token" not in str(e):
            sys.exit(f"a wrong token: want EACCES 'bad token', got {e!r}")
        print("wrong token refused:", e)
    else:
        sys.exit("a wrong token was accepted")
EOF
		); then
			printf '%s\n' "$out"
			want_eq "$(podman exec "$C4" sha256sum /tmp/e2e-tcp.bin | cut -d' ' -f1)" \
				"$(sed -n 's/^sha256 //p' <<<"$out")" "sha256 in the container of what Python wrote"
		else
			printf '%s\n' "$out" >&2
			fail "the Python package over $T4"
		fi
		# the sbx CLI without the token
		sbxt "$T4" ping >/dev/null 2>"$W/err"
		want_eq "$?" 3 "sbx ping over tcp without the token (3: connect refused)"
		want_in "$(cat "$W/err")" "EACCES: token required" "sbx ping over tcp without the token"
		# the token file guards the unix socket too; a --stdio shim ignores both variables (podman
		# exec gives it the container's environment, and PID 1 holds the port)
		out=$(podman exec "$C4" sbx -t unix:/run/sandbox-shim/shim.sock ping 2>&1)
		want_in "$out" "EACCES" "the unix socket without the token"
		want_in "$(podman exec "$C4" sbx -t unix:/run/sandbox-shim/shim.sock \
			--token-file /run/secrets/shim-token ping 2>&1)" "pid 1 pid1=yes" "the unix socket with the token"
		want_in "$(podman exec "$C4" sh -c 'echo "$SANDBOX_SHIM_LISTEN"')" "tcp:0.0.0.0:7070" \
			"podman exec sees the container's environment"
		js=$(sbxt "exec:podman exec -i $C4 sandbox-shim --stdio" --json ping 2>"$W/err") ||
			{ cat "$W/err" >&2; fail "podman exec -i $C4 sandbox-shim --stdio"; }
		want_eq "$(json_field "$js" pid1)" false "pid1 of the --stdio shim beside the tcp one"
		stop_quickly "$C4"
		want_eq "$(podman inspect "$C4" --format '{{.State.ExitCode}}')" 0 "exit code of $C4"
	else
		cat "$W/ping4" >&2
		podman logs "$C4" 2>&1 | tail -n 20 >&2
		fail "no answer on $T4 (published from $C4's 7070)"
	fi
fi
# tcp from the environment without a token: the container does not start, and says why
CTRS+=("$C5")
out=$(timeout -k 5 60 podman run --pull=never --name "$C5" --network=none \
	-e SANDBOX_SHIM_LISTEN=tcp:0.0.0.0:7070 "$IMG" 2>&1)
want_eq "$?" 1 "exit status of the image with SANDBOX_SHIM_LISTEN=tcp:... and no token"
want_in "$out" "SANDBOX_SHIM_LISTEN: cannot listen on tcp:0.0.0.0:7070: a tcp listener needs a token: set SANDBOX_SHIM_TOKEN_FILE" \
	"why the image with tcp and no token did not start"

# ---------------------------------------------------------------------------------------------
step subreaper "the shim beside the image's own init ($C3, container/Dockerfile.add-shim)"
mkdir -m 0711 "$W/sock3"
CTRS+=("$C3")
podman run -d --pull=never --name "$C3" --network=none -v "$W/sock3:/run/sandbox-shim" "$IMG_ADD" >/dev/null ||
	fail "podman run $C3"
S3=unix:$W/sock3/shim.sock
if sbxt "$S3" ping --wait 30 >/dev/null; then
	js=$(sbxt "$S3" --json ping)
	want_eq "$(json_field "$js" pid1)" false "pid1 of the shim beside an init"
	spid=$(json_field "$js" pid)
	# the script starts the shim, then execs the init: the shim may answer a moment before
	init_comm=
	for _ in $(seq 50); do
		init_comm=$(sbxt "$S3" exec -- cat /proc/1/comm)
		[ "$init_comm" = sh ] && break
		sleep 0.1
	done
	want_eq "$init_comm" sh "the image's init is PID 1"
	want_eq "$(ppid_of "$C3" "$spid")" 1 "the shim is the init's child"
	op=$(sbxt "$S3" sh 'sleep 1 </dev/null >/dev/null 2>&1 & echo $!')
	want_eq "$(ppid_of "$C3" "$op")" "$spid" "an orphan of a command is the shim's (subreaper)"
	wait_gone "$C3" "$op" 5 || fail "orphan $op not reaped by the shim"
	no_zombies "$C3"
	stop_quickly "$C3"
	want_eq "$(podman inspect "$C3" --format '{{.State.ExitCode}}')" 0 "exit code of $C3"
	logs=$(podman logs "$C3" 2>&1)
	want_in "$logs" "shutting down (SIGTERM)" "the init's SIGTERM reached the shim"
	want_eq "$(grep -c 'info: exit$' <<<"$logs")" 1 "the shim's clean exit"
else
	podman logs "$C3" 2>&1 | tail -n 20
	fail "no answer from $C3"
fi

# ---------------------------------------------------------------------------------------------
step "done" "done in $(elapsed) s"
if [ "$FAILS" -ne 0 ]; then
	echo "image.sh: $FAILS check(s) failed"
	exit 1
fi
echo "image.sh: all checks passed"
exit 0
