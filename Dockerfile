# sandbox-shim image: the fully static daemon as PID 1, with rclone and fuse3 for bucket mounts.
#
#   podman build -t sandbox-shim .                      (or: docker build -t sandbox-shim .)
#   podman run -d -v /some/host/dir:/run/sandbox-shim sandbox-shim    (dir: any mode that
#                 others cannot write; the socket in it is 0600, root's)
#   sbx -t unix:/some/host/dir/shim.sock ping
#   podman run -d sandbox-shim my-server --port 8080    (a workload: the image's CMD)
#   sbx -t 'exec:podman exec -i CTR sandbox-shim --stdio' ping
#   podman run -d -e SANDBOX_SHIM_LISTEN=tcp:0.0.0.0:7070 -e SANDBOX_SHIM_TOKEN_FILE=/run/secrets/shim-token \
#       -v ./token:/run/secrets/shim-token:ro -p 127.0.0.1:7070:7070 sandbox-shim
#   sbx -t tcp:127.0.0.1:7070 --token-file token ping   (README.md: "Reaching the image over TCP")
#
# The shim runs as PID 1 (`sandbox-shim --listen unix:/run/sandbox-shim/shim.sock
# --listen-optional vsock:-1:1024 --`): it listens on the unix socket, and on vsock port
# 1024 where the runtime provides vsock (a /dev/vsock in the container or guest; absent in a
# plain container, which is logged and fine). The image's CMD, if any, is its workload:
# signals forwarded, orphans reaped, the container exits with the workload's status. FUSE
# mounts need `--device /dev/fuse --cap-add SYS_ADMIN`. `podman stop` (SIGTERM) stops
# every process, unmounts and exits 0 within the default 10 s.
#
# Build arguments (--build-arg NAME=VALUE):
#   DEBIAN_IMAGE  base image of the build and final stages   (default debian:bookworm-slim;
#                 the build stage needs Debian 12's -dev packages)
#   BUILD_TYPE    CMAKE_BUILD_TYPE of the static binaries    (default Release)
#   JOBS          parallel compile jobs                      (default 2)
#   PACKAGES      Debian packages of the final stage         (default "ca-certificates fuse3
#                 rclone"; "" for a bare image without bucket mounts)
#
# Stages: `build` compiles; `bin` (FROM scratch) holds only /usr/local/bin/sandbox-shim and
# /usr/local/bin/sbx, both static, to copy into any image:
#   podman build --target bin -t sandbox-shim-bin .
#   COPY --from=sandbox-shim-bin /usr/local/bin/ /usr/local/bin/
# container/Dockerfile.add-shim is a complete example for an existing image.
#
# Kept to what podman 4.3's builder accepts: no `COPY --link`, no RUN heredocs. The compile
# step keeps its build tree in a cache mount (`RUN --mount=type=cache`: podman/buildah, and
# docker with BuildKit, its default builder since 23.0), so an edit recompiles only what changed.
# The build stage's package list is kept in step with tests/deps.sh.

ARG DEBIAN_IMAGE=debian:bookworm-slim

# ---- build stage: the static daemon and the static sbx, nothing else (no tests) ----
FROM ${DEBIAN_IMAGE} AS build
ARG BUILD_TYPE=Release
ARG JOBS=2
ENV DEBIAN_FRONTEND=noninteractive
# Compiler, cmake, and the -dev packages whose static archives (.a) go into the binaries.
RUN apt-get update \
	&& apt-get install -y --no-install-recommends \
		gcc libc6-dev make cmake pkg-config binutils lld \
		libev-dev libprotobuf-c-dev protobuf-c-compiler \
		libcap-dev libseccomp-dev libarchive-dev nettle-dev \
		zlib1g-dev libzstd-dev liblzma-dev libbz2-dev liblz4-dev libacl1-dev \
	&& apt-get clean && rm -rf /var/lib/apt/lists/* /var/cache/apt/*.bin
WORKDIR /src
# Only what the two targets are built from: edits to tests/ or docs keep the cache.
COPY CMakeLists.txt ./
COPY proto proto
COPY shim shim
COPY sdk/include sdk/include
COPY sdk/src sdk/src
COPY sdk/cli sdk/cli
COPY sdk/libsbx.map sdk/libsbx.pc.in sdk/
# doc/mangen.c: both programs make their man pages themselves (hidden --dump-man)
COPY doc doc
# /build is a cache mount: a rebuild after an edit compiles only what changed.
RUN --mount=type=cache,target=/build,id=sandbox-shim-build \
	cmake -S . -B /build -DSHIM_STATIC=ON -DSHIM_TESTS=OFF -DCMAKE_BUILD_TYPE="${BUILD_TYPE}" \
	&& cmake --build /build -j"${JOBS}" --target sandbox-shim sbx-static \
	&& mkdir -p /out \
	&& strip --strip-unneeded -o /out/sandbox-shim /build/sandbox-shim \
	&& strip --strip-unneeded -o /out/sbx /build/sbx-static \
	&& for b in /out/sandbox-shim /out/sbx; do \
		if readelf -lW "$b" | grep -q INTERP || readelf -dW "$b" | grep -q NEEDED; then \
			echo "$b is not static" >&2; exit 1; \
		fi; \
	done \
	&& /out/sandbox-shim --version && /out/sbx --version

# ---- bin: the two static files alone, for COPY --from into other images ----
FROM scratch AS bin
COPY --from=build /out/sandbox-shim /out/sbx /usr/local/bin/

# ---- final stage: the shim as PID 1, with what bucket mounts need ----
FROM ${DEBIAN_IMAGE}
ARG PACKAGES="ca-certificates fuse3 rclone"
# Before the COPY, so that a rebuilt shim reuses this layer.
RUN if [ -n "${PACKAGES}" ]; then \
		apt-get update \
		&& DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends ${PACKAGES} \
		&& apt-get clean && rm -rf /var/lib/apt/lists/* /var/cache/apt/*.bin; \
	fi \
	&& mkdir -p -m 0755 /run/sandbox-shim
COPY --from=bin /usr/local/bin/ /usr/local/bin/
# /run/sandbox-shim: the socket alone (shim.sock, 0600), the directory meant to be shared with
# the host: bind-mount a host directory of any mode here (one that others may write must be
# sticky and root-owned, or the shim refuses it). The shim's private state (pending-writes
# journal, mount configs with their keys, caches) is apart, in /run/sandbox-shim-state, which
# the shim creates 0700 (--state-dir); nothing of it lands in the shared directory.
STOPSIGNAL SIGTERM
ENTRYPOINT ["/usr/local/bin/sandbox-shim", "--listen", "unix:/run/sandbox-shim/shim.sock", "--listen-optional", "vsock:-1:1024", "--"]
# No workload by default (the base image's ["bash"] is dropped); give one as the command.
CMD []
