# bash completion for sbx (issue 18). The words come from sbx itself (its hidden --complete:
# the command table and each command's own option table), so they are never out of date.
# Installed as share/bash-completion/completions/sbx.

_sbx()
{
	local cur=${COMP_WORDS[COMP_CWORD]} prev=
	local sbx=${COMP_WORDS[0]} cmd='' cmd_at=0 skip='' i w argopts
	((COMP_CWORD > 0)) && prev=${COMP_WORDS[COMP_CWORD - 1]}
	# ~/bin/sbx as typed: let the shell expand it
	[[ $sbx == "~"* ]] && sbx=$HOME${sbx#"~"}
	command -v "$sbx" >/dev/null 2>&1 || sbx=sbx
	COMPREPLY=()

	# the command: the first word that is neither an option nor the argument of one
	argopts=$("$sbx" --complete arg-options 2>/dev/null)
	for ((i = 1; i < COMP_CWORD; i++)); do
		w=${COMP_WORDS[i]}
		if [[ -n $skip ]]; then
			skip=
			continue
		fi
		case $w in
		--) break ;;
		-*=* | =) ;;
		-*) grep -qxF -- "$w" <<<"$argopts" && skip=1 ;;
		*)
			cmd=$w
			cmd_at=$i
			break
			;;
		esac
	done
	# after "--" (exec), nothing is ours to complete
	for ((i = cmd_at + 1; cmd_at > 0 && i < COMP_CWORD; i++)); do
		[[ ${COMP_WORDS[i]} == -- ]] && return 0
	done

	# the argument of an option: no words of ours (the shell offers file names)
	if [[ -n $cmd ]]; then
		argopts=$("$sbx" --complete arg-options "$cmd" 2>/dev/null)
	fi
	if [[ $prev == -* ]] && grep -qxF -- "$prev" <<<"$argopts"; then
		return 0
	fi

	if [[ $cur == -* ]]; then
		mapfile -t COMPREPLY < <(compgen -W "$("$sbx" --complete options ${cmd:+"$cmd"} 2>/dev/null)" -- "$cur")
	elif [[ -z $cmd ]]; then
		mapfile -t COMPREPLY < <(compgen -W "$("$sbx" --complete commands 2>/dev/null)" -- "$cur")
	elif [[ $cmd == help && $COMP_CWORD -eq $((cmd_at + 1)) ]]; then
		mapfile -t COMPREPLY < <(compgen -W "$("$sbx" --complete commands 2>/dev/null)" -- "$cur")
	fi
	return 0
}
# an empty answer falls back to file names: local files for -o, -i, --token-file, decode FILE
complete -o default -F _sbx sbx
