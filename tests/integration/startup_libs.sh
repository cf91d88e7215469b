#!/usr/bin/env bash
# startup_libs.sh: what the daemon loads at start (issue 21). The dynamic build links
# libarchive, the compressors, nettle and the four small libraries every start uses (libev,
# libprotobuf-c, libcap, libseccomp) from their static archives: it needs only libc and
# libzstd (Debian's libzstd.a compresses on one thread only: see CMakeLists.txt), has no
# runtime path (in the build tree CMake would pad one with empty entries: the current directory),
# and carries only the archive writers it uses (no xar, hence no libxml2).
#
#   bash startup_libs.sh SANDBOX_SHIM
set -euo pipefail
BIN=${1:?usage: startup_libs.sh SANDBOX_SHIM}
fail() {
	echo "startup_libs: $*" >&2
	exit 1
}
dyn=$(readelf -dW "$BIN")
needed=$(sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p' <<<"$dyn" | sort | tr '\n' ' ')
if [ -z "$needed" ]; then
	echo "startup_libs: $BIN is static: nothing to check" >&2
	exit 77
fi
for lib in $needed; do
	case $lib in
	libc.so.* | libm.so.* | libzstd.so.*) ;;
	libasan.so.* | libubsan.so.*) ;; # an ASan build (SHIM_SANITIZE)
	*) fail "$BIN needs $lib at start (all it needs: $needed)" ;;
	esac
done
case " $needed " in
*" libzstd.so."*) ;;
*) fail "$BIN does not use the shared libzstd (the multithreaded one): $needed" ;;
esac
if grep -E '\((RPATH|RUNPATH)\)' <<<"$dyn"; then
	fail "$BIN has a runtime path"
fi
syms=$(nm "$BIN")
grep -q ' archive_write_set_format_pax$' <<<"$syms" || fail "$BIN lacks libarchive's pax writer"
grep -q ' archive_read_support_filter_zstd$' <<<"$syms" || fail "$BIN lacks libarchive's zstd reader"
if grep -E ' (archive_write_set_format_xar|archive_write_set_format)$' <<<"$syms"; then
	fail "$BIN carries libarchive's table of every writer"
fi
# the loader finds everything, and the daemon starts
"$BIN" --version >/dev/null || fail "$BIN --version failed"
echo "startup_libs: $BIN needs $needed"
