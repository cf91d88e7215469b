#!/usr/bin/env bash
# tests/e2e/deb.sh: the Debian packages, built from the tree and installed in a fresh Debian 12
# container with rootful podman (issue 18).
#
#   bash tests/e2e/deb.sh PKG_BUILD_DIR     (as root; ctest runs it as e2e.deb, label e2e)
#
# 1. PKG_BUILD_DIR: a build configured as README.md says for packages (-DSHIM_STATIC=ON
#    -DCMAKE_INSTALL_PREFIX=/usr, Release, no tests), built, then `cpack -G DEB`: sandbox-shim,
#    sbx, libsbx1, libsbx-dev. Kept between runs (a warm run recompiles only what changed).
# 2. On the host: each package's files are under /usr only, name no build-tree path, and no
#    packaged text file (libsbx.pc, the man pages, the completion) or runtime path names one;
#    the packaged daemon is static; the sections and dependencies are what CMakeLists.txt says.
# 3. In a fresh container of the base image localhost/debian:bookworm-slim (made as
#    tests/e2e/image.sh makes it, shared with it): `apt-get install ./*.deb` (apt fetches
#    libprotobuf-c1 & co. from Debian), the installed daemon on a unix socket and the installed
#    `sbx ping`, `sbx exec`; `dpkg -L` of each package (checked on the host: no build-tree path;
#    the man pages and the completion listed); the completion answers; `apt-get remove` removes
#    every file.
#
# Exit: 0 passed, 1 failed, 77 skipped (SBX_SKIP_E2E=1, not root, podman cannot run).
# Knobs: SBX_E2E_KEEP=1 keeps the container's work directory.
# shellcheck disable=SC2016 # sh -c scripts for the container
set -uo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
PKG=${1:-}
BASE=localhost/debian:bookworm-slim
SKIP=77
FAILS=0
SECTION=setup
T0=$(date +%s%N)
RUN=$$-$(od -An -N4 -tx1 /dev/urandom | tr -d ' \n')
CTR=sbx-e2e-deb-$RUN
LOCKS=/run/lock
[ -d "$LOCKS" ] && [ -w "$LOCKS" ] || LOCKS=/tmp
if [ -z "$PKG" ]; then
	echo "usage: deb.sh PKG_BUILD_DIR" >&2
	exit 2
fi
mkdir -p "$PKG" && PKG=$(cd "$PKG" && pwd)
W=$(mktemp -d /tmp/sbx-e2e-deb.XXXXXX)

step()
{
	SECTION=$1
	printf '=== [+%ss] %s\n' "$((($(date +%s%N) - T0) / 1000000000))" "$*"
}

fail()
{
	echo "deb.sh:${BASH_LINENO[0]}: FAIL [$SECTION] $*" >&2
	FAILS=$((FAILS + 1))
}

skip()
{
	echo "deb.sh: SKIP: $*"
	exit "$SKIP"
}

cleanup()
{
	local rc=$?
	podman rm -f -t 0 "$CTR" >/dev/null 2>&1
	if [ "${SBX_E2E_KEEP:-0}" = 1 ]; then
		echo "deb.sh: kept $W"
	else
		rm -rf "$W"
	fi
	exit "$rc"
}
trap cleanup EXIT
trap 'exit 1' INT TERM

# ---------------------------------------------------------------------------------------------
step prereq "root, podman, runc"
[ "${SBX_SKIP_E2E:-0}" = 1 ] && skip "SBX_SKIP_E2E=1"
[ "$(id -u)" -eq 0 ] || skip "needs root (rootful podman)"
for tool in cpack dpkg-deb dpkg-shlibdeps readelf; do
	command -v "$tool" >/dev/null || {
		fail "$tool is missing (cmake, dpkg-dev, binutils: tests/deps.sh)"
		exit 1
	}
done
if ! command -v podman >/dev/null || ! command -v runc >/dev/null || ! command -v debootstrap >/dev/null; then
	bash "$ROOT/tests/deps.sh" --containers >"$W/deps.log" 2>&1 || {
		tail -n 5 "$W/deps.log"
		skip "podman/runc/debootstrap missing and not installable (tests/deps.sh --containers)"
	}
fi
# podman's quirks on this machine kind, as tests/e2e/image.sh has them: a private containers.conf
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
podman info >"$W/info" 2>&1 || {
	tail -n 5 "$W/info"
	skip "podman cannot run here (podman info failed)"
}

# ---------------------------------------------------------------------------------------------
step packages "build and cpack in $PKG"
tb=$(date +%s)
if ! cmake -S "$ROOT" -B "$PKG" -DSHIM_STATIC=ON -DSHIM_TESTS=OFF -DSHIM_WERROR=ON -DCMAKE_BUILD_TYPE=Release \
	-DCMAKE_INSTALL_PREFIX=/usr >"$W/configure.log" 2>&1; then
	tail -n 30 "$W/configure.log" >&2
	fail "configure failed"
	exit 1
fi
if ! cmake --build "$PKG" -j2 >"$W/build.log" 2>&1; then
	grep -E 'error|Error' "$W/build.log" | head -n 30 >&2
	fail "build failed"
	exit 1
fi
rm -f "$PKG"/*.deb
if ! (cd "$PKG" && cpack -G DEB) >"$W/cpack.log" 2>&1; then
	tail -n 30 "$W/cpack.log" >&2
	fail "cpack -G DEB failed"
	exit 1
fi
echo "packages built in $(($(date +%s) - tb)) s"
VERSION=$(sed -n 's/^project(sandbox-shim VERSION \([0-9.]*\).*/\1/p' "$ROOT/CMakeLists.txt")
ARCH=$(dpkg --print-architecture)
DEBS=()
for p in sandbox-shim sbx libsbx1 libsbx-dev; do
	f=$PKG/${p}_${VERSION}_${ARCH}.deb
	[ -s "$f" ] || {
		fail "no $f: $(ls "$PKG"/*.deb 2>/dev/null | tr '\n' ' ')"
		continue
	}
	DEBS+=("$f")
done
[ "${#DEBS[@]}" -eq 4 ] || exit 1
[ "$(ls "$PKG"/*.deb | wc -l)" -eq 4 ] || fail "more packages than the four: $(ls "$PKG"/*.deb | tr '\n' ' ')"

# ---------------------------------------------------------------------------------------------
step contents "the packages' files, fields and contents"
# field PKG NAME: a control field of PKG's .deb
field()
{
	dpkg-deb -f "$PKG/${1}_${VERSION}_${ARCH}.deb" "$2"
}
[ "$(field sandbox-shim Section)" = admin ] || fail "sandbox-shim: Section $(field sandbox-shim Section)"
[ "$(field sbx Section)" = utils ] || fail "sbx: Section $(field sbx Section)"
[ "$(field libsbx1 Section)" = libs ] || fail "libsbx1: Section $(field libsbx1 Section)"
[ "$(field libsbx-dev Section)" = libdevel ] || fail "libsbx-dev: Section $(field libsbx-dev Section)"
# dpkg-shlibdeps: the static daemon needs nothing, libsbx1 libc6 and libprotobuf-c1
[ -z "$(field sandbox-shim Depends)" ] || fail "the static daemon's package depends on: $(field sandbox-shim Depends)"
[[ $(field libsbx1 Depends) == *"libc6 (>="*"libprotobuf-c1 (>="* ]] || fail "libsbx1: Depends $(field libsbx1 Depends)"
[[ $(field sbx Depends) == *"libsbx1 (= $VERSION)"*"libc6 (>="* ]] || fail "sbx: Depends $(field sbx Depends)"
[[ $(field libsbx-dev Depends) == *"libsbx1 (= $VERSION)"* ]] || fail "libsbx-dev: Depends $(field libsbx-dev Depends)"
# libsbx1 carries a shlibs file, so that packages built on it get their dependency
dpkg-deb -e "$PKG/libsbx1_${VERSION}_${ARCH}.deb" "$W/ctl-libsbx1"
[ "$(cat "$W/ctl-libsbx1/shlibs" 2>/dev/null)" = "libsbx 1 libsbx1 (>= $VERSION)" ] ||
	fail "libsbx1's shlibs: $(cat "$W/ctl-libsbx1/shlibs" 2>&1)"
grep -q ldconfig "$W/ctl-libsbx1/postinst" 2>/dev/null || fail "libsbx1 runs no ldconfig on install"
mkdir "$W/x"
for f in "${DEBS[@]}"; do
	p=$(basename "$f" | cut -d_ -f1)
	dpkg-deb -c "$f" | awk '{print $6}' >"$W/$p.list"
	if grep -vE '^\./usr(/|$)' "$W/$p.list"; then
		fail "$p installs outside /usr"
	fi
	if grep -F -e "$PKG" -e "$ROOT" "$W/$p.list"; then
		fail "$p lists a build-tree path"
	fi
	dpkg-deb -x "$f" "$W/x"
done
# no build-tree path in any packaged file (text, runtime paths, strings of the binaries)
if grep -rlF -e "$PKG" -e "$ROOT" "$W/x"; then
	fail "a packaged file names the build tree"
fi
for b in "$W/x/usr/bin/sbx" "$W/x/usr/lib/$(gcc -print-multiarch 2>/dev/null || echo x86_64-linux-gnu)/libsbx.so.1"; do
	[ -e "$b" ] || {
		fail "$b is not in the packages"
		continue
	}
	readelf -dW "$b" | grep -E 'RPATH|RUNPATH' | grep -vF '$ORIGIN' && fail "$b has a runtime path other than \$ORIGIN's"
done
# (readelf's output taken first: `readelf | grep -q` under pipefail fails when grep quits early)
elf=$(readelf -lW "$W/x/usr/bin/sandbox-shim"; readelf -dW "$W/x/usr/bin/sandbox-shim" 2>/dev/null)
if grep -qE 'Requesting program interpreter|\(NEEDED\)' <<<"$elf"; then
	fail "the packaged sandbox-shim is not static"
fi
for want in sandbox-shim:./usr/share/man/man8/sandbox-shim.8 sbx:./usr/share/man/man1/sbx.1 \
	sbx:./usr/share/bash-completion/completions/sbx sbx:./usr/bin/sbx sandbox-shim:./usr/bin/sandbox-shim \
	libsbx-dev:./usr/include/sbx.h libsbx-dev:pkgconfig/libsbx.pc libsbx-dev:libsbx.so libsbx-dev:libsbx.a \
	libsbx1:libsbx.so.1; do
	grep -qE -- "${want#*:}\$" "$W/${want%%:*}.list" || fail "${want%%:*} does not contain ${want#*:}"
done

# ---------------------------------------------------------------------------------------------
step base "base image $BASE"
if ! podman image exists "$BASE"; then
	# the way tests/e2e/image.sh makes it, under its lock (one builder at a time)
	exec 9>"$LOCKS/sandbox-shim-e2e-base.lock"
	flock 9
	if ! podman image exists "$BASE"; then
		MIRROR=$(awk '/^URIs:/{print $2; exit}' /etc/apt/sources.list.d/debian.sources 2>/dev/null)
		[ -n "$MIRROR" ] || MIRROR=$(awk '/^deb /{print $2; exit}' /etc/apt/sources.list 2>/dev/null)
		[ -n "$MIRROR" ] || MIRROR=http://deb.debian.org/debian
		if ! debootstrap --variant=minbase bookworm "$W/rootfs" "$MIRROR" >"$W/debootstrap.log" 2>&1; then
			tail -n 20 "$W/debootstrap.log" >&2
			fail "debootstrap failed"
			exit 1
		fi
		rm -rf "$W"/rootfs/var/cache/apt/archives/*.deb "$W"/rootfs/var/lib/apt/lists/*
		rm -f "$W/rootfs/etc/apt/sources.list"
		tar -C "$W/rootfs" -c . | podman import -q --change 'CMD ["bash"]' - "$BASE" >/dev/null || {
			fail "podman import failed"
			exit 1
		}
		rm -rf "$W/rootfs"
	fi
	exec 9>&-
fi

# ---------------------------------------------------------------------------------------------
step install "apt-get install ./*.deb in a fresh container"
mkdir "$W/debs" "$W/out"
cp "${DEBS[@]}" "$W/debs/"
APT_MOUNT=()
if [ -f /etc/apt/sources.list.d/debian.sources ]; then
	APT_MOUNT=(-v /etc/apt/sources.list.d/debian.sources:/etc/apt/sources.list.d/debian.sources:ro)
elif [ -f /etc/apt/sources.list ]; then
	APT_MOUNT=(-v /etc/apt/sources.list:/etc/apt/sources.list:ro)
fi
cat >"$W/in-container.sh" <<'EOF'
set -eu
export DEBIAN_FRONTEND=noninteractive
step() { echo "--- $*"; }
step "apt-get install"
apt-get update -qq
cd /debs
apt-get install -y -q --no-install-recommends ./sandbox-shim_*.deb ./sbx_*.deb ./libsbx1_*.deb ./libsbx-dev_*.deb \
	>/out/apt.log 2>&1 || { tail -n 20 /out/apt.log; exit 1; }
cd /
for p in sandbox-shim sbx libsbx1 libsbx-dev; do
	dpkg -L "$p" >"/out/$p.dpkg-L"
done
step "the installed programs"
command -v sandbox-shim sbx
sandbox-shim --version
sbx --version
d=$(mktemp -d)
sandbox-shim --listen "unix:$d/shim.sock" --state-dir "$d/state" 2>"$d/shim.log" &
pid=$!
sbx -t "unix:$d/shim.sock" ping --wait 20 >/out/ping.txt
sbx -t "unix:$d/shim.sock" exec -- echo hello from the packages >/out/exec.txt
sbx -t "unix:$d/shim.sock" --json info >/out/info.json
kill -TERM "$pid"
wait "$pid" || { echo "the shim exited $?"; cat "$d/shim.log"; exit 1; }
step "man pages and completion"
test -s /usr/share/man/man1/sbx.1 && test -s /usr/share/man/man8/sandbox-shim.8
bash -c 'source /usr/share/bash-completion/completions/sbx; COMP_WORDS=(sbx pi); COMP_CWORD=1; _sbx; echo "${COMPREPLY[*]}"' >/out/complete.txt
step "apt-get remove"
apt-get remove -y -q sandbox-shim sbx libsbx-dev libsbx1 >>/out/apt.log 2>&1
for p in sandbox-shim sbx libsbx1 libsbx-dev; do
	while read -r f; do
		if [ -f "$f" ] || [ -L "$f" ]; then echo "left after apt-get remove: $f"; exit 1; fi
	done <"/out/$p.dpkg-L"
done
echo "--- done"
EOF
ti=$(date +%s)
if ! timeout -k 10 240 podman run --rm --name "$CTR" --pull=never --network=host "${APT_MOUNT[@]}" \
	-v "$W/debs:/debs:ro" -v "$W/out:/out" -v "$W/in-container.sh:/in-container.sh:ro" \
	"$BASE" bash /in-container.sh >"$W/run.log" 2>&1; then
	tail -n 40 "$W/run.log" >&2
	fail "installing and running the packages in the container failed"
	exit 1
fi
cat "$W/run.log"
echo "installed, run and removed in $(($(date +%s) - ti)) s"

step checks "what the container saw"
grep -q '^pong from sandbox-shim '"$VERSION" "$W/out/ping.txt" || fail "sbx ping: $(cat "$W/out/ping.txt")"
[ "$(cat "$W/out/exec.txt")" = "hello from the packages" ] || fail "sbx exec: $(cat "$W/out/exec.txt")"
grep -q '"protocol_version":1' "$W/out/info.json" || fail "sbx --json info: $(cat "$W/out/info.json")"
[ "$(cat "$W/out/complete.txt")" = ping ] || fail "the installed completion of 'sbx pi': $(cat "$W/out/complete.txt")"
for p in sandbox-shim sbx libsbx1 libsbx-dev; do
	if grep -F -e "$PKG" -e "$ROOT" -e _CPack_Packages "$W/out/$p.dpkg-L"; then
		fail "dpkg -L $p lists a build-tree path"
	fi
	if grep -vE '^/usr(/|$)|^/\.$' "$W/out/$p.dpkg-L"; then
		fail "dpkg -L $p lists a path outside /usr"
	fi
done
grep -qx /usr/share/man/man1/sbx.1 "$W/out/sbx.dpkg-L" || fail "dpkg -L sbx lacks the man page"
grep -qx /usr/share/bash-completion/completions/sbx "$W/out/sbx.dpkg-L" || fail "dpkg -L sbx lacks the completion"
grep -qx /usr/share/man/man8/sandbox-shim.8 "$W/out/sandbox-shim.dpkg-L" || fail "dpkg -L sandbox-shim lacks the man page"
grep -qx /usr/bin/sandbox-shim "$W/out/sandbox-shim.dpkg-L" || fail "dpkg -L sandbox-shim lacks the daemon"

step "done" "$FAILS failed checks in $((($(date +%s%N) - T0) / 1000000000)) s"
[ "$FAILS" -eq 0 ] || exit 1
exit 0
