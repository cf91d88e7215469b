#!/usr/bin/env bash
# Install what sandbox-shim needs to build, test and demo, from Debian 12's packages.
#
# Idempotent: checks every package with dpkg-query and runs apt-get (update +
# install) only when something is missing, so a second run is a quick no-op.
# Runs as root; otherwise through sudo when there is one.
#
# Usage: bash tests/deps.sh [--containers]   (--containers: podman & co. for tests/e2e too)
set -euo pipefail

# ---- the package list: add new dependencies here, one a line ----
PACKAGES=(
	# toolchain
	build-essential # gcc, make, libc6-dev, binutils (readelf for the static check)
	cmake
	pkg-config
	git
	ca-certificates
	clang        # libFuzzer harness (SHIM_FUZZ)
	clang-format # style check in tests/run-tests.sh
	lld          # links the static daemon with its startup functions together (shim/core/startup.order)
	file         # tells a static binary from a dynamic one (and cpack's DEB generator needs it)
	groff-base   # groff -man: the man pages render without warnings (test cli_doc.man)
	# libraries (headers and static archives)
	libev-dev
	libprotobuf-c-dev
	protobuf-c-compiler
	protobuf-compiler # protoc: the Python codec's tests cross-check its bytes with it
	libcap-dev
	libseccomp-dev
	libarchive-dev
	libzstd-dev  # static archives of libarchive's compressors, for the static daemon
	zlib1g-dev
	liblzma-dev
	libbz2-dev
	liblz4-dev
	libacl1-dev
	nettle-dev   # sha256 of backup streams
	# unit tests (Check; its pkg-config file needs subunit)
	check
	libsubunit-dev
	# integration tests and the demo
	socat
	python3
	# the Python SDK's tests: pip install --no-build-isolation (offline), a venv for the install test
	python3-pip
	python3-setuptools
	python3-wheel
	python3-venv
	procps     # ps, pgrep, free
	util-linux # unshare, setsid, flock
	tini       # reference inits: it_workload runs its PID-1 checks against them too
	dumb-init
	tar        # GNU tar: archive compatibility tests and the backup benchmark baseline
	zstd       # tar --zstd in the benchmark baseline
	attr       # setfattr/getfattr: xattrs in the backup round trip
	libarchive-tools # bsdtar: lists our archives, makes archives we restore (backup tests)
	# ---- mounts (issue 6): S3 bucket mounts and their tests ----
	rclone # the FUSE client the shim starts for each mount
	fuse3  # fusermount3, /dev/fuse helpers
	nodejs # s3rver (tests/lib/s3rver.sh) for the mount tests, and the Pyodide test (tests/pyodide)
	npm
	# ---- end mounts ----
)

# ---- images (issue 8): rootful podman for tests/e2e/image.sh; only with --containers ----
# (tests/run-tests.sh asks for them unless SBX_SKIP_E2E=1). runc: crun fails on some cgroup
# layouts; debootstrap makes the local base image; netavark and aardvark-dns give RUN steps
# of podman build their network.
CONTAINER_PACKAGES=(
	podman
	runc
	debootstrap
	netavark
	aardvark-dns
	iptables
	containernetworking-plugins
	fuse-overlayfs
	uidmap
	slirp4netns
)
if [ "${1:-}" = --containers ]; then
	PACKAGES+=("${CONTAINER_PACKAGES[@]}")
fi
# ---- end images ----

missing=()
for pkg in "${PACKAGES[@]}"; do
	# a Node.js from elsewhere (NodeSource's nodejs bundles npm and conflicts with Debian's
	# npm package): take node and npm as they are when both commands work
	case $pkg in
	nodejs | npm)
		if command -v node >/dev/null 2>&1 && command -v npm >/dev/null 2>&1; then
			continue
		fi
		;;
	esac
	status=$(dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null || true)
	if [ "$status" != "install ok installed" ]; then
		missing+=("$pkg")
	fi
done

if [ "${#missing[@]}" -eq 0 ]; then
	echo "deps: all ${#PACKAGES[@]} packages present"
	exit 0
fi

echo "deps: installing ${missing[*]}"
if [ "$(id -u)" -eq 0 ]; then
	as_root=()
elif command -v sudo >/dev/null 2>&1; then
	as_root=(sudo)
else
	echo "deps: missing packages (${missing[*]}) and not root, no sudo: install them as root" >&2
	exit 1
fi

export DEBIAN_FRONTEND=noninteractive
"${as_root[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update
"${as_root[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${missing[@]}"
echo "deps: done"
