# bash completion for epmoectl (docs/operations.md "Shell completion"). cmake --install puts it
# in share/bash-completion/completions/epmoectl, where bash-completion loads it on first use;
# without bash-completion: source it from ~/.bashrc.
#
# A command's options come from `epmoectl COMMAND --help`, so they cannot drift from the binary;
# drain/undrain complete worker names from `epmoectl workers` (with the global options typed so
# far: --coordinator, --key, ...), asking for at most half a second.

_epmoectl_workers() {
    "$1" "${@:2}" --timeout 500 workers 2>/dev/null | awk 'NR > 1 { print $1 }'
}

_epmoectl() {
    local cur=${COMP_WORDS[COMP_CWORD]} prev=${COMP_WORDS[COMP_CWORD - 1]}
    local ctl=${COMP_WORDS[0]} cmd= i
    local cmds="mkmodel keygen inspect mkinput diff forward status workers shards config shutdown
        drain undrain reload rebalance"
    local -a globals=()
    COMPREPLY=()
    # the command is the first word that is neither a global option nor its value
    for ((i = 1; i < COMP_CWORD; i++)); do
        case ${COMP_WORDS[i]} in
        -o | --output | --coordinator | --timeout | --key | --server-key)
            globals+=("${COMP_WORDS[i]}" "${COMP_WORDS[i + 1]}")
            i=$((i + 1))
            ;;
        -*) globals+=("${COMP_WORDS[i]}") ;;
        *)
            cmd=${COMP_WORDS[i]}
            break
            ;;
        esac
    done

    case $prev in
    -o)
        COMPREPLY=($(compgen -W "table wide json yaml" -- "$cur"))
        return
        ;;
    --output)
        if [ "$cmd" = forward ]; then
            COMPREPLY=($(compgen -f -- "$cur"))
        else
            COMPREPLY=($(compgen -W "table wide json yaml" -- "$cur"))
        fi
        return
        ;;
    --key | --server-key | --input | --out)
        COMPREPLY=($(compgen -f -- "$cur"))
        return
        ;;
    --model)
        COMPREPLY=($(compgen -d -- "$cur"))
        return
        ;;
    --device)
        COMPREPLY=($(compgen -W "cpu cuda:0 cuda:1 cuda:2 cuda:3 cuda:4 cuda:5 cuda:6 cuda:7" -- "$cur"))
        return
        ;;
    --gpu-gemm)
        COMPREPLY=($(compgen -W "exact fast" -- "$cur"))
        return
        ;;
    --expert-dtype)
        COMPREPLY=($(compgen -W "fp4 fp8" -- "$cur"))
        return
        ;;
    --coordinator | --timeout | --layer | --tokens | --seed | --name | --wait-timeout | --threads | \
        --hidden | --inter | --experts | --topk | --layers | --hash-layers | --mtp | --shards | \
        --vocab | --max-calc-diff)
        return # a value only the operator knows
        ;;
    esac

    if [ -z "$cmd" ]; then
        if [[ $cur == -* ]]; then
            COMPREPLY=($(compgen -W "-o --output --coordinator --timeout --key --server-key
                --version --help" -- "$cur"))
        else
            COMPREPLY=($(compgen -W "$cmds" -- "$cur"))
        fi
        return
    fi
    if [[ $cur == -* ]]; then
        local opts
        opts=$("$ctl" "$cmd" --help 2>/dev/null | grep -oE -- '--[a-z][a-z0-9-]*' | sort -u)
        COMPREPLY=($(compgen -W "$opts -o --help" -- "$cur"))
        return
    fi
    case $cmd in
    drain | undrain)
        COMPREPLY=($(compgen -W "$(_epmoectl_workers "$ctl" "${globals[@]}")" -- "$cur"))
        ;;
    diff)
        COMPREPLY=($(compgen -f -- "$cur"))
        ;;
    esac
}

complete -o default -F _epmoectl epmoectl
