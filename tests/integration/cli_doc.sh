#!/usr/bin/env bash
# cli_doc.sh: issue 18's documentation: sbx(1) and sandbox-shim(8), `sbx help`, the bash completion.
#
#   bash cli_doc.sh SHIM_BIN SBX_BIN MAN_DIR SECTION...    (ctest: cli_doc.man, cli_doc.help, cli_doc.completion)
#
# The pages are the build's (MAN_DIR: BUILD/doc, made by the programs' hidden --dump-man). What
# they must contain is read independently of the generator: the commands from sdk/cli/sbx.c's
# table, the daemon's options from shim/core/main.c's options[], each command's options from sbx
# itself (--complete, the tables the command parses with).
set -uo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
SHIM=$1
SBX=$2
MAN_DIR=$3
shift 3
T=$(mktemp -d)
# shellcheck disable=SC2034 # read by cli_lib.sh's run (help needs no shim)
TARGET=unix:$T/nothing-listens
# shellcheck source=tests/integration/cli_lib.sh
source "$ROOT/tests/integration/cli_lib.sh"

# roff source to plain words: \- to -, font changes and \& dropped
unroff()
{
	sed -e 's/\\-/-/g' -e 's/\\f[BIRP]//g' -e 's/\\&//g' -e 's/\\e/\\/g' "$@"
}

# the commands of sbx.c's table, in order
table_commands()
{
	sed -n 's/^[[:space:]]*{"\([a-z0-9-]*\)", cmd_[a-z_]*,.*/\1/p' "$ROOT/sdk/cli/sbx.c"
}

# render PAGE: groff's text; its warnings (-ww) in $T/groff.err
render()
{
	groff -man -Tutf8 -ww -rHY=0 -rLL=200n "$1" 2>"$T/groff.err" | sed 's/.\x08//g'
}

sec_man()
{
	local page=$MAN_DIR/sbx.1 shim_page=$MAN_DIR/sandbox-shim.8 cmds c o block opts names globals p s exec_block
	command -v groff >/dev/null || {
		fail "groff is not installed (tests/deps.sh installs groff-base)"
		return
	}
	[ -s "$page" ] && [ -s "$shim_page" ] || {
		fail "no sbx.1 or sandbox-shim.8 in $MAN_DIR"
		return
	}
	# every table entry documented: the generators' own checks
	"$SBX" --check-docs >"$T/out" 2>"$T/err" || fail "sbx --check-docs failed: $(cat "$T/err")"
	empty err
	"$SHIM" --check-docs >"$T/out" 2>"$T/err" || fail "sandbox-shim --check-docs failed: $(cat "$T/err")"
	empty err
	# the pages are what the programs make now (the build is not stale)
	"$SBX" --dump-man "$ROOT/doc/sbx.1.in" >"$T/sbx.1" || fail "sbx --dump-man failed"
	cmp -s "$T/sbx.1" "$page" || fail "$page differs from what sbx --dump-man makes now"
	"$SHIM" --dump-man "$ROOT/doc/sandbox-shim.8.in" >"$T/shim.8" || fail "sandbox-shim --dump-man failed"
	cmp -s "$T/shim.8" "$shim_page" || fail "$shim_page differs from what sandbox-shim --dump-man makes now"
	# no marker left, a version in the title
	if grep -n '@[A-Z_]*@' "$page" "$shim_page"; then
		fail "a template marker is left in a page"
	fi
	grep -q '^\.TH SBX 1 "" "sandbox-shim [0-9]' "$page" || fail "sbx.1: no .TH with the version"
	grep -q '^\.TH SANDBOX-SHIM 8 "" "sandbox-shim [0-9]' "$shim_page" || fail "sandbox-shim.8: no .TH"

	# rendered without a warning, by groff and by man
	for p in "$page" "$shim_page"; do
		render "$p" >"$T/render.txt"
		[ ! -s "$T/groff.err" ] || fail "groff -ww warns about $p: $(head -5 "$T/groff.err")"
		grep -q '^NAME' "$T/render.txt" || fail "$p renders without a NAME section"
		if command -v man >/dev/null; then
			MANWIDTH=100 man --warnings -l "$p" >/dev/null 2>"$T/man.err" || fail "man -l $p failed"
			[ ! -s "$T/man.err" ] || fail "man -l $p warns: $(head -5 "$T/man.err")"
		fi
	done
	for s in NAME SYNOPSIS DESCRIPTION OPTIONS COMMANDS TRANSPORTS ENVIRONMENT "EXIT STATUS" FILES SECURITY \
		EXAMPLES "SEE ALSO"; do
		grep -q "^\.SH $s\$" "$page" || grep -q "^\.SH \"$s\"\$" "$page" || fail "sbx.1 has no $s section"
	done
	for s in NAME SYNOPSIS DESCRIPTION OPTIONS TRANSPORTS ENVIRONMENT "EXIT STATUS" FILES SECURITY EXAMPLES \
		"SEE ALSO"; do
		grep -q "^\.SH $s\$" "$shim_page" || grep -q "^\.SH \"$s\"\$" "$shim_page" ||
			fail "sandbox-shim.8 has no $s section"
	done

	# sbx(1): every command of the table has its entry, with each of its options
	globals=$("$SBX" --complete options)
	mapfile -t cmds < <(table_commands)
	[ "${#cmds[@]}" -gt 30 ] || fail "only ${#cmds[@]} commands read from sdk/cli/sbx.c"
	"$SBX" --complete commands >"$T/out"
	[ "$(printf '%s\n' "${cmds[@]}")" = "$(cat "$T/out")" ] ||
		fail "sbx --complete commands is not the table's list: $(tr '\n' ' ' <"$T/out")"
	unroff "$page" >"$T/page.txt"
	exec_block=$(awk '/^sbx [a-z0-9-]+( |$)/ { on = ($2 == "exec") } /^\.S[HS] / { on = 0 } on' "$T/page.txt")
	for c in "${cmds[@]}"; do
		# the command's block: from its ".PP / sbx NAME" to the next command or section
		block=$(awk -v c="$c" '
			/^sbx [a-z0-9-]+( |$)/ { on = ($2 == c) }
			/^\.S[HS] / { on = 0 }
			on' "$T/page.txt")
		if [ -z "$block" ]; then
			fail "sbx.1 has no entry for the command '$c'"
			continue
		fi
		[ "$(wc -l <<<"$block")" -ge 3 ] || fail "sbx.1: the entry of '$c' has no description"
		mapfile -t opts < <("$SBX" --complete options "$c")
		for o in "${opts[@]}"; do
			case $o in -h | --help) continue ;; esac
			# the global ones are documented once, under OPTIONS
			grep -qxF -- "$o" <<<"$globals" && continue
			grep -qE -- "(^|[^a-z-])$o([^a-z0-9-]|\$)" <<<"$block" && continue
			# sh: "as 'exec' does (same options...)"
			if grep -qF "as 'exec' does" <<<"$block" &&
				grep -qE -- "(^|[^a-z-])$o([^a-z0-9-]|\$)" <<<"$exec_block"; then
				continue
			fi
			fail "sbx.1: '$c' does not document $o"
		done
	done
	# and every global option under OPTIONS
	awk '/^\.SH OPTIONS/ { on = 1; next } /^\.SH / { on = 0 } on' "$T/page.txt" >"$T/options.txt"
	for o in $("$SBX" --complete options); do
		grep -qE -- "(^|[^a-z-])$o([^a-z0-9-]|\$)" "$T/options.txt" || fail "sbx.1: OPTIONS lacks $o"
	done

	# sandbox-shim(8): every option of main.c's options[] has a .TP entry under OPTIONS
	names=$(sed -n '/^static const struct option options\[\] = {/,/^};/p' "$ROOT/shim/core/main.c" |
		sed -n 's/^[[:space:]]*{"\([a-z0-9-]*\)",.*/\1/p')
	[ "$(wc -l <<<"$names")" -gt 15 ] || fail "only $(wc -l <<<"$names") options read from shim/core/main.c"
	[ "$(sed 's/^/--/' <<<"$names")" = "$("$SHIM" --list-options)" ] ||
		fail "sandbox-shim --list-options is not main.c's options[]"
	unroff "$shim_page" | awk '/^\.SH OPTIONS/ { on = 1; next } /^\.SH / { on = 0 }
		on && prev == ".TP" { print } { prev = $0 }' >"$T/shim-entries.txt"
	for o in $names; do
		grep -qE -- "(^|[^a-z-])--$o([^a-z0-9-]|\$)" "$T/shim-entries.txt" ||
			fail "sandbox-shim.8: no OPTIONS entry for --$o"
	done
	grep -q 'SANDBOX_SHIM_LISTEN' <(unroff "$shim_page" | awk '/^\.SH ENVIRONMENT/ { on = 1; next } /^\.SH / { on = 0 } on') ||
		fail "sandbox-shim.8: ENVIRONMENT lacks SANDBOX_SHIM_LISTEN"

}

sec_help()
{
	local c line n=0
	run 0 help
	for c in $(table_commands); do
		line=$(grep -E "^  $c +[^ ]" "$T/out") || {
			fail "sbx help does not list $c with a summary"
			continue
		}
		n=$((n + 1))
		[ "${#line}" -le 80 ] || fail "sbx help: the line of $c is longer than 80 columns"
	done
	[ "$n" -gt 30 ] || fail "sbx help listed only $n commands"
	for g in "Connection and diagnostics:" "Files:" "Commands and processes:" "Directory archives:" "Tunnels:" \
		"S3 bucket mounts:"; do
		grep -qxF "$g" "$T/out" || fail "sbx help has no group '$g'"
	done
	hasnt out "Other:"
	empty err
	cp "$T/out" "$T/help.txt"
	run 0 --help
	cmp -s "$T/out" "$T/help.txt" || fail "sbx --help and sbx help differ"

	# sbx help COMMAND is sbx COMMAND --help, byte for byte
	for c in cat exec backup mount help ping; do
		run 0 help "$c"
		cp "$T/out" "$T/help-$c.txt"
		has out "usage: sbx [OPTIONS] $c"
		run 0 "$c" --help
		cmp -s "$T/out" "$T/help-$c.txt" || fail "sbx help $c differs from sbx $c --help"
	done
	run 0 help --help
	has out "usage: sbx [OPTIONS] help [COMMAND]"

	# bad input: exit 2, a clear message, nothing on stdout
	run 2 help nosuch
	has err "sbx: help: unknown command 'nosuch' ('sbx help' lists them)"
	empty out
	run 2 help cat ls
	has err "sbx: help: unexpected argument 'ls'"
	empty out
	run 2 help --bogus
	has err "sbx: help: unknown option '--bogus'"
	empty out
	run 2 help --json
	has err "sbx: help: --json: this command has no JSON output"
	empty out
	run 2 --json help
	has err "no JSON output"
	empty out
	# the hidden documentation arguments only as the first one
	run 2 ping --check-docs
	has err "unknown option '--check-docs'"
	"$SBX" --complete nonsense >"$T/out" 2>"$T/err"
	[ $? -eq 2 ] || fail "sbx --complete nonsense did not exit 2"
	has err "usage: sbx --dump-man TEMPLATE"
}

# complete WORDS...: run _sbx as bash would for the command line WORDS (the last one the word
# being completed), COMPREPLY sorted into $T/out one a line
complete_words()
{
	local bin
	bin=$(dirname "$SBX")
	PATH=$bin:$PATH bash -c '
		source "$1"
		shift
		COMP_WORDS=("$@")
		COMP_CWORD=$((${#COMP_WORDS[@]} - 1))
		COMP_LINE="$*"
		COMP_POINT=${#COMP_LINE}
		_sbx sbx "${COMP_WORDS[COMP_CWORD]}" "${COMP_WORDS[COMP_CWORD - 1]}"
		printf "%s\n" "${COMPREPLY[@]}" | sort' _ "$ROOT/doc/sbx.bash" sbx "$@" >"$T/out" 2>"$T/err"
}

# want_completion "WANT WORDS" WORDS...: the completions of WORDS are WANT (space-separated)
want_completion()
{
	local want=$1 got
	shift
	complete_words "$@"
	got=$(grep -v '^$' "$T/out" | tr '\n' ' ' | sed 's/ $//')
	[ "$got" = "$want" ] || fail "completing '$*': got '$got', want '$want'"
	empty err
}

sec_completion()
{
	grep -q '^complete -o default -F _sbx sbx$' "$ROOT/doc/sbx.bash" || fail "sbx.bash does not register _sbx"
	want_completion "ping" pi
	want_completion "readlink realpath restore resumed reverse" re
	want_completion "backup" ba
	want_completion "--trace" --tr
	want_completion "--target --timeout --token-file --trace" --t
	# the argument of a global option is skipped to find the command
	want_completion "stat" -t unix:/x st
	want_completion "cat" --target unix:/x --timeout 5 ca
	# a command's own options, and the global ones it takes after it
	want_completion "--depth" -t unix:/x ls --de
	want_completion "--tty" exec --tt
	want_completion "--json" --timeout 5 ps --js
	want_completion "--follow" logs --f
	# no --json for a command without JSON output, nor exec's own -t twice
	want_completion "" cat --js
	want_completion "--no-follow --no-symlinks" stat --no-
	want_completion "" exec --no-f
	# sbx help COMMAND
	want_completion "mount mounts" help mou
	# an option's argument, and after "--": nothing of ours
	want_completion "" --timeout ""
	want_completion "" exec -- ec
	# an unknown command: nothing
	want_completion "" nosuch --
}

# issue 18.6: every path the READMEs name in the tree exists, and the image's socket is the one
# they (and the man pages) say
sec_readme()
{
	local f d p base ok socks sock help
	for f in README.md container/README.md sdk/python/README.md; do
		d=$(dirname "$f")
		[ -f "$ROOT/$f" ] || {
			fail "no $f"
			continue
		}
		# markdown links, relative to the file
		for p in $(grep -oE '\]\([^)#[:space:]]+' "$ROOT/$f" | sed 's/^](//' | grep -vE '^[a-z]+:'); do
			[ -e "$ROOT/$d/$p" ] || fail "$f links to $p, which does not exist"
		done
		# paths into the tree (globs too), relative to the file or to the top
		for p in $(grep -oE '(^|[[:space:]`(])(\.\./)*(proto|shim|sdk|tests|container|doc|\.ci|examples|tools|src)/[A-Za-z0-9_.*/-]*' \
			"$ROOT/$f" | sed -E 's/^[[:space:]`(]//' | sort -u); do
			ok=
			for base in "$ROOT/$d" "$ROOT"; do
				compgen -G "$base/$p" >/dev/null && ok=1
			done
			[ -n "$ok" ] || fail "$f names $p, which is not in the tree"
		done
	done
	# the image's unix socket, from the Dockerfile's ENTRYPOINT
	socks=$(grep '^ENTRYPOINT' "$ROOT/Dockerfile" | grep -oE 'unix:/[^"]+' | sed 's/^unix://')
	[ -n "$socks" ] || fail "no unix listener in the Dockerfile's ENTRYPOINT"
	for sock in $(cat "$ROOT/README.md" "$ROOT/container/README.md" "$ROOT/sdk/python/README.md" \
		"$ROOT/doc/sbx.1.in" "$ROOT/doc/sandbox-shim.8.in" | sed 's/\\-/-/g' |
		grep -oE '/run/sandbox-shim[A-Za-z0-9_/.-]*\.sock' | sort -u); do
		grep -qxF -- "$sock" <<<"$socks" || fail "a README or man page names the socket $sock; the image listens on: $socks"
	done
	# the other /run/sandbox-shim... paths of sandbox-shim(8) (the state directory): as --help says
	# (the text taken first: `--help | grep -q` under pipefail fails when grep quits early)
	help=$("$SHIM" --help)
	for p in $(sed 's/\\-/-/g' "$ROOT/doc/sandbox-shim.8.in" | grep -oE '/run/sandbox-shim[A-Za-z0-9_/.-]*' |
		grep -v '\.sock$' | sort -u); do
		grep -qF -- "$p" <<<"$help" || fail "sandbox-shim.8.in names $p, which sandbox-shim --help does not"
	done
}

run_sections "$@"
finish cli_doc
