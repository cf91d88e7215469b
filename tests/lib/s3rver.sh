# tests/lib/s3rver.sh: a local S3 server (npm s3rver) for tests; SOURCE this file, do not run it.
# shellcheck shell=bash
#
#   s3rver_install          npm install s3rver@3.7.1 into $SBX_NPM_DIR (default
#                           ~/.cache/sandbox-shim/npm) unless it is there already (offline-friendly)
#   s3rver_start DIR [BUCKET...]
#                           start s3rver on 127.0.0.1, kernel-chosen port, data in DIR/s3data,
#                           log in DIR/s3rver.log; create the buckets given (default: none).
#                           Exports S3_ENDPOINT=http://127.0.0.1:PORT, S3_PID, S3_PORT,
#                           S3_ACCESS_KEY=S3RVER, S3_SECRET_KEY=S3RVER (s3rver's built-in keys)
#                           and returns once the server answers S3 requests.
#   s3rver_stop             stop the server started here (S3_PID only)
#   s3_rclone ARGS...       run rclone against that server with a clean environment and a
#                           private temporary config whose remote is "s3:", e.g.
#                           `s3_rclone cat s3:bucket/key`, `s3_rclone mkdir s3:bucket` (a new
#                           bucket), `echo hi | s3_rclone rcat s3:bucket/key`
#
# Example:
#   source tests/lib/s3rver.sh
#   s3rver_install && s3rver_start "$tmp" mybucket || exit 1
#   ... S3_ENDPOINT, S3_ACCESS_KEY, S3_SECRET_KEY ...
#   s3rver_stop
#
# Note: s3rver does not check signatures: a wrong secret is accepted; only an unknown
# access key id is refused (403 InvalidAccessKeyId).

S3RVER_VERSION=3.7.1

s3rver_dir()
{
	echo "${SBX_NPM_DIR:-$HOME/.cache/sandbox-shim/npm}"
}

s3rver_bin()
{
	echo "$(s3rver_dir)/node_modules/.bin/s3rver"
}

# true if s3rver $S3RVER_VERSION is installed in s3rver_dir
s3rver_installed()
{
	[ -x "$(s3rver_bin)" ] && grep -q "\"version\": \"$S3RVER_VERSION\"" \
		"$(s3rver_dir)/node_modules/s3rver/package.json" 2>/dev/null
}

s3rver_install()
{
	local dir
	dir=$(s3rver_dir)
	s3rver_installed && return 0
	command -v npm >/dev/null || {
		echo "s3rver_install: npm not found (apt-get install nodejs npm)" >&2
		return 1
	}
	mkdir -p "$dir" || return 1
	# one install at a time: the mount tests, run in parallel on a fresh machine, each
	# install on demand, and two npm installs into one directory break each other (the
	# first ctest -j3 here: four of them failed). The one that waited finds it done.
	(
		flock 9 || exit 1
		s3rver_installed && exit 0
		cd "$dir" && npm install --no-save --no-audit --no-fund --loglevel=error "s3rver@$S3RVER_VERSION" >&2
	) 9>"$dir/.install.lock" || {
		echo "s3rver_install: npm install s3rver@$S3RVER_VERSION failed" >&2
		return 1
	}
	[ -x "$(s3rver_bin)" ]
}

s3rver_start()
{
	local dir=$1
	shift
	[ -n "$dir" ] || {
		echo "s3rver_start: give a directory" >&2
		return 1
	}
	local bin
	bin=$(s3rver_bin)
	[ -x "$bin" ] || {
		echo "s3rver_start: $bin missing (call s3rver_install)" >&2
		return 1
	}
	mkdir -p "$dir/s3data" || return 1
	local cfg=() b
	for b in "$@"; do cfg+=(--configure-bucket "$b"); done
	# env -i: node needs nothing from us; the data dir and the log are the test's own
	env -i PATH="/usr/local/bin:/usr/bin:/bin" HOME="$dir" \
		"$bin" -d "$dir/s3data" -a 127.0.0.1 -p 0 --no-vhost-buckets "${cfg[@]}" \
		>"$dir/s3rver.log" 2>&1 </dev/null &
	S3_PID=$!
	local port=""
	for _ in $(seq 1 400); do
		port=$(sed -n 's/^S3rver listening on 127\.0\.0\.1:\([0-9]*\).*/\1/p' "$dir/s3rver.log" | head -1)
		[ -n "$port" ] && break
		kill -0 "$S3_PID" 2>/dev/null || break
		sleep 0.05
	done
	if [ -z "$port" ]; then
		echo "s3rver_start: s3rver did not start; its log:" >&2
		cat "$dir/s3rver.log" >&2
		s3rver_stop
		return 1
	fi
	export S3_PID S3_PORT=$port S3_ENDPOINT="http://127.0.0.1:$port"
	export S3_ACCESS_KEY=S3RVER S3_SECRET_KEY=S3RVER
	# answering S3 requests (not only listening)
	for _ in $(seq 1 200); do
		s3_rclone lsd s3: >/dev/null 2>&1 && return 0
		sleep 0.05
	done
	echo "s3rver_start: s3rver does not answer on $S3_ENDPOINT; its log:" >&2
	cat "$dir/s3rver.log" >&2
	s3rver_stop
	return 1
}

s3rver_stop()
{
	if [ -n "${S3_PID:-}" ]; then
		kill "$S3_PID" 2>/dev/null || true
		wait "$S3_PID" 2>/dev/null || true
	fi
	S3_PID=""
	return 0
}

s3_rclone()
{
	[ -n "${S3_ENDPOINT:-}" ] || {
		echo "s3_rclone: no server (call s3rver_start)" >&2
		return 1
	}
	command -v rclone >/dev/null || {
		echo "s3_rclone: rclone not found (apt-get install rclone)" >&2
		return 1
	}
	# A private 0600 config file, removed afterwards; env -i because an inherited
	# AWS_CA_BUNDLE (and friends) breaks rclone's S3 client.
	local conf rc
	conf=$(umask 077 && mktemp "${TMPDIR:-/tmp}/s3rclone.XXXXXX") || return 1
	cat >"$conf" <<EOF
[s3]
type = s3
provider = Other
env_auth = false
access_key_id = ${S3_ACCESS_KEY:-S3RVER}
secret_access_key = ${S3_SECRET_KEY:-S3RVER}
endpoint = $S3_ENDPOINT
region = us-east-1
force_path_style = true
EOF
	env -i PATH="/usr/local/bin:/usr/bin:/bin" HOME="${TMPDIR:-/tmp}" \
		rclone --config "$conf" "$@"
	rc=$?
	rm -f "$conf"
	return $rc
}
