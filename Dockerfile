# sandbox-shim image: a fully static daemon at /usr/local/bin/sandbox-shim.
#
#   docker build -t sandbox-shim .          (or: podman build -t sandbox-shim .)
#   docker run -d -v /some/host/dir:/run/sandbox-shim sandbox-shim
#   sbx -t unix:/some/host/dir/shim.sock ping
#
# To put the shim into your own image, copy the one file out of this one:
#   COPY --from=sandbox-shim /usr/local/bin/sandbox-shim /usr/local/bin/sandbox-shim
#
# Build arguments (--build-arg NAME=VALUE):
#   DEBIAN_IMAGE  base image of both stages           (default debian:bookworm-slim)
#   BUILD_TYPE    CMAKE_BUILD_TYPE of the daemon       (default Release)
#   JOBS          parallel compile jobs                (default 2)
#
# Kept to what podman 4.3's builder accepts: no `COPY --link`, no RUN heredocs.

ARG DEBIAN_IMAGE=debian:bookworm-slim

# ---- build stage: compile and link the daemon statically ----
FROM ${DEBIAN_IMAGE} AS build
ARG BUILD_TYPE=Release
ARG JOBS=2
ENV DEBIAN_FRONTEND=noninteractive
# Compiler, cmake, and the -dev packages whose static archives (.a) go into the daemon.
RUN apt-get update \
	&& apt-get install -y --no-install-recommends \
		gcc libc6-dev make cmake pkg-config binutils \
		libev-dev libprotobuf-c-dev protobuf-c-compiler \
		libcap-dev libseccomp-dev libarchive-dev nettle-dev \
		zlib1g-dev libzstd-dev liblzma-dev libbz2-dev liblz4-dev libacl1-dev \
	&& rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY . .
RUN cmake -S . -B /build -DSHIM_STATIC=ON -DSHIM_TESTS=OFF -DCMAKE_BUILD_TYPE="${BUILD_TYPE}" \
	&& cmake --build /build -j"${JOBS}" --target sandbox-shim \
	&& strip --strip-unneeded -o /sandbox-shim /build/sandbox-shim \
	&& if readelf -lW /sandbox-shim | grep -q INTERP; then echo "sandbox-shim is not static" >&2; exit 1; fi \
	&& /sandbox-shim --version

# ---- final stage: the daemon and nothing else of ours ----
FROM ${DEBIAN_IMAGE}
COPY --from=build /sandbox-shim /usr/local/bin/sandbox-shim
# The socket's directory; root-only, like the unit's RuntimeDirectory in container/.
# Bind-mount a host directory here to reach the socket from outside.
RUN mkdir -p -m 0700 /run/sandbox-shim
# The shim is the image's init (PID 1): it reaps orphans and forwards signals to
# its workload. Append `-- CMD ARGS...` to `docker run` to have it supervise a
# workload, or other options (e.g. --log-level debug).
STOPSIGNAL SIGTERM
ENTRYPOINT ["/usr/local/bin/sandbox-shim", "--listen", "unix:/run/sandbox-shim/shim.sock"]
