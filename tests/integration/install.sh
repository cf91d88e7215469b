#!/usr/bin/env bash
# install.sh: cmake --install to a temporary prefix, then the installed sbx, sandbox-shim and a
# program built with pkg-config run there with no LD_LIBRARY_PATH and no ldconfig (issue 18).
#
# Usage: bash install.sh BUILD_DIR
set -uo pipefail

BUILD=${1:?usage: install.sh BUILD_DIR}
T=$(mktemp -d "${TMPDIR:-/tmp}/sbx-install.XXXXXX") || exit 1
DPID=

cleanup()
{
	if [ -n "$DPID" ] && kill -0 "$DPID" 2>/dev/null; then
		kill -KILL "$DPID" 2>/dev/null
		wait "$DPID" 2>/dev/null
	fi
	rm -rf "$T"
}
trap cleanup EXIT

fail()
{
	echo "install.sh:${BASH_LINENO[0]}: $*" >&2
	[ -s "$T/shim.log" ] && tail -n 20 "$T/shim.log" >&2
	exit 1
}

P=$T/prefix
cmake --install "$BUILD" --prefix "$P" >"$T/install.log" 2>&1 || fail "cmake --install: $(tail -n 5 "$T/install.log")"
for f in bin/sbx bin/sandbox-shim include/sbx.h share/man/man1/sbx.1 share/man/man8/sandbox-shim.8 \
	share/bash-completion/completions/sbx; do
	[ -e "$P/$f" ] || fail "not installed: $f"
done
# the .pc file sits in the libdir GNUInstallDirs chose (lib, or lib/<multiarch>)
PC=$(find "$P" -name libsbx.pc -path '*/pkgconfig/*' | head -n 1)
[ -n "$PC" ] || fail "no libsbx.pc under $P"

# nothing from the build tree or the environment may help the installed files find libsbx
export LD_LIBRARY_PATH=
unset SBX_TARGET SBX_TOKEN
out=$("$P/bin/sbx" --version 2>&1) || fail "installed sbx --version: $out"
case $out in "sbx "*"(libsbx "*) ;; *) fail "sbx --version printed: $out" ;; esac
# (ldd's output taken first: `ldd | grep -q` under pipefail fails when grep quits early)
deps=$(ldd "$P/bin/sbx")
grep -q "libsbx.so.1 => $P/" <<<"$deps" || fail "sbx does not find the installed libsbx: $deps"
# the soname and the version node of every export follow sdk/ABI.md (libsbx.so.1, SBX_1)
LIB=$(find "$P" -name libsbx.so.1 | head -n 1)
[ -n "$LIB" ] || fail "no libsbx.so.1 under $P"
dyn=$(objdump -p "$LIB") || fail "objdump -p $LIB"
grep -qE "SONAME +libsbx\.so\.1$" <<<"$dyn" || fail "libsbx's SONAME: $(grep SONAME <<<"$dyn")"
syms=$(objdump -T "$LIB") || fail "objdump -T $LIB"
grep -qE "SBX_1 +sbx_connect$" <<<"$syms" || fail "sbx_connect is not in version node SBX_1: $(grep sbx_connect <<<"$syms")"

mkdir -m 0700 "$T/state"
"$P/bin/sandbox-shim" --listen "unix:$T/s" --state-dir "$T/state" 2>"$T/shim.log" </dev/null &
DPID=$!
"$P/bin/sbx" -t "unix:$T/s" ping --wait 10 >"$T/out" 2>&1 || fail "installed sbx ping: $(cat "$T/out")"
grep -q "pong from sandbox-shim" "$T/out" || fail "ping printed: $(cat "$T/out")"

# a user's program, built only from what pkg-config says (libsbx.pc carries the runtime path)
cat >"$T/v.c" <<'C'
#include <stdio.h>
#include <string.h>
#include <sbx.h>
int main(void)
{
	printf("%s\n", sbx_version());
	return strcmp(sbx_version(), SBX_VERSION) != 0;
}
C
flags=$(PKG_CONFIG_PATH=$(dirname "$PC") pkg-config --cflags --libs libsbx) || fail "pkg-config libsbx failed"
# a sanitizer build's libsbx needs the sanitizer runtime loaded first
san=
grep -q libasan <<<"$deps" && san=-fsanitize=address,undefined
# shellcheck disable=SC2086 # the flags are words
cc $san -o "$T/v" "$T/v.c" $flags 2>"$T/cc.log" || fail "cc $flags: $(cat "$T/cc.log")"
out=$("$T/v" 2>&1) || fail "the pkg-config-built program: $out"
[ -n "$out" ] || fail "sbx_version() printed nothing"

kill -TERM "$DPID"
wait "$DPID" || fail "the installed daemon did not exit 0 after SIGTERM"
DPID=
echo "install: ok"
