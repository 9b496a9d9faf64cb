"""Shell completion for ``schedctl`` (bash and zsh), generated from its argument parser, so a
new command or option completes without editing a script."""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from dataclasses import dataclass

# ---- shell completion, generated from the parser ---------------------------------------------


@dataclass
class _Level:
    """What can follow at one command path (``""``, ``"dlq"``, ``"dlq replay"``)."""

    words: list[tuple[str, str]]  # subcommands, or a positional's choices: (word, help)
    options: list[str]
    valued: list[str]  # options that take a value
    choices: dict[str, list[str]]  # option -> the values it accepts
    jobs: bool = False  # a job (or run) is named here: complete the cluster's job names and ids


#: positionals that name a job or a run (a job's name or id before its ``@``)
JOB_ARGUMENTS = ("id", "run_id", "run_ids")


def _help(text: str | None) -> str:
    return " ".join((text or "").replace("%%", "%").split())


def completion_levels(parser: argparse.ArgumentParser) -> dict[str, _Level]:
    """Every command path of ``parser`` and what can be typed there."""
    levels: dict[str, _Level] = {}

    def walk(p: argparse.ArgumentParser, path: str) -> None:
        level = _Level([], [], [], {})
        levels[path] = level
        for action in p._actions:
            if action.help == argparse.SUPPRESS:
                continue
            if isinstance(action, argparse._SubParsersAction):
                helps = {a.dest: _help(a.help) for a in action._choices_actions}
                for name, child in action.choices.items():
                    if name.startswith("__"):  # internal (the completion's own helpers)
                        continue
                    level.words.append((name, helps.get(name, "")))
                    walk(child, f"{path} {name}".strip())
            elif action.option_strings:
                level.options += action.option_strings
                if action.nargs != 0:
                    level.valued += action.option_strings
                    if action.choices is not None:
                        for option in action.option_strings:
                            level.choices[option] = [str(c) for c in action.choices]
            elif action.choices is not None:
                level.words += [(str(c), "") for c in action.choices]
            elif action.dest in JOB_ARGUMENTS:
                level.jobs = True

    walk(parser, "")
    return levels


def _sh_quote(text: str) -> str:
    return "'" + text.replace("'", "'\\''") + "'"


def _spec_function(levels: Mapping[str, _Level], zsh: bool) -> list[str]:
    lines = [
        "_schedctl_spec() {",
        "    # $1: the command path so far; sets cmdwords (the subcommands or values that can",
        "    # follow), options, valued (the options that take a value), described (zsh)",
        '    case "$1" in',
    ]
    for path, level in levels.items():
        words = " ".join(w for w, _ in level.words)
        sets = [
            f"cmdwords={_sh_quote(words)}",
            f"options={_sh_quote(' '.join(level.options))}",
            f"valued={_sh_quote(' '.join(level.valued))}",
            f"jobs={int(level.jobs)}",
        ]
        if zsh:
            described = " ".join(
                _sh_quote(w.replace(":", "\\:") + (f":{h}" if h else "")) for w, h in level.words
            )
            sets.append(f"described=({described})")
        lines.append(f"        {_sh_quote(path)})")
        lines += [f"            {line}" for line in sets]
        lines.append("            ;;")
    default = "cmdwords='' options='' valued='' jobs=0" + (" described=()" if zsh else "")
    lines += [f"        *) {default} ;;", "    esac", "}", ""]
    lines += [
        "_schedctl_choices() {",
        "    # $1: the command path, $2: an option; prints the values it accepts",
        '    case "$1|$2" in',
    ]
    # an option that accepts the same values wherever it appears (-o) gets one pattern
    seen: dict[str, list[tuple[str, list[str]]]] = {}
    for path, level in levels.items():
        for option, values in level.choices.items():
            seen.setdefault(option, []).append((path, values))
    for option, uses in seen.items():
        if all(values == uses[0][1] for _, values in uses):
            uses = [("*", uses[0][1])]
        for path, values in uses:
            pattern = (
                "*" + _sh_quote(f"|{option}") if path == "*" else _sh_quote(f"{path}|{option}")
            )
            lines.append(f"        {pattern}) echo {_sh_quote(' '.join(values))} ;;")
    lines += ["    esac", "}", "", ""]
    return lines


_BASH_MAIN = """\
_schedctl() {
    local cur="${COMP_WORDS[COMP_CWORD]}" cmdpath="" w i skip=0 npos=0 cmdwords options valued jobs
    for ((i = 1; i < COMP_CWORD; i++)); do
        w="${COMP_WORDS[i]}"
        if ((skip)); then skip=0; continue; fi
        _schedctl_spec "$cmdpath"
        case "$w" in
            -*=*) ;;
            -*) [[ " $valued " == *" $w "* ]] && skip=1 ;;
            *) if [[ " $cmdwords " == *" $w "* ]]; then
                   cmdpath="${cmdpath:+$cmdpath }$w"; npos=0
               else
                   npos=$((npos + 1))
               fi ;;
        esac
    done
    _schedctl_spec "$cmdpath"
    COMPREPLY=()
    if ((skip)); then
        local choices
        choices="$(_schedctl_choices "$cmdpath" "${COMP_WORDS[COMP_CWORD-1]}")"
        [[ -n "$choices" ]] && COMPREPLY=($(compgen -W "$choices" -- "$cur"))
    elif [[ "$cur" == -* ]]; then
        COMPREPLY=($(compgen -W "$options" -- "$cur"))
    elif [[ -n "$cmdwords" ]]; then
        COMPREPLY=($(compgen -W "$cmdwords" -- "$cur"))
    elif ((jobs && !npos)); then
        # the names and ids of the cluster's live jobs (SCHEDD_SERVER / SCHEDD_TOKEN)
        COMPREPLY=($(compgen -W "$(schedctl __jobs "$cur" 2>/dev/null)" -- "$cur"))
    fi
    return 0
}

complete -o default -F _schedctl schedctl
"""

_ZSH_MAIN = """\
_schedctl() {
    local cmdpath="" w i skip=0 npos=0 cmdwords options valued jobs
    local -a described
    for ((i = 2; i < CURRENT; i++)); do
        w="${words[i]}"
        if ((skip)); then skip=0; continue; fi
        _schedctl_spec "$cmdpath"
        case "$w" in
            -*=*) ;;
            -*) [[ " $valued " == *" $w "* ]] && skip=1 ;;
            *) if [[ " $cmdwords " == *" $w "* ]]; then
                   cmdpath="${cmdpath:+$cmdpath }$w"; npos=0
               else
                   npos=$((npos + 1))
               fi ;;
        esac
    done
    _schedctl_spec "$cmdpath"
    if ((skip)); then
        local choices
        choices="$(_schedctl_choices "$cmdpath" "${words[CURRENT-1]}")"
        if [[ -n "$choices" ]]; then compadd -- ${=choices}; else _files; fi
    elif [[ "${words[CURRENT]}" == -* ]]; then
        compadd -- ${=options}
    elif ((${#described})); then
        _describe -t commands 'schedctl command' described
    elif ((jobs && !npos)); then
        compadd -- ${(f)"$(schedctl __jobs "${words[CURRENT]}" 2>/dev/null)"}
    else
        _files
    fi
}

if [[ "${zsh_eval_context[-1]}" == loadautofunc ]]; then
    _schedctl "$@"
else
    compdef _schedctl schedctl
fi
"""


def completion_script(parser: argparse.ArgumentParser, shell: str) -> str:
    """A completion script for ``shell`` (bash or zsh) listing the parser's commands, options
    and option values; ``-o default``/``_files`` complete file names where nothing else fits."""
    levels = completion_levels(parser)
    if shell == "zsh":
        head = [
            "#compdef schedctl",
            "# zsh completion for schedctl, generated by `schedctl completion zsh`.",
            "# Load it with: source <(schedctl completion zsh)",
            "# or save it as _schedctl in a directory on $fpath.",
            "",
        ]
        return "\n".join(head + _spec_function(levels, True)) + _ZSH_MAIN
    head = [
        "# bash completion for schedctl, generated by `schedctl completion bash`.",
        "# Load it with: source <(schedctl completion bash)",
        "# or save it as ~/.local/share/bash-completion/completions/schedctl.",
        "",
    ]
    return "\n".join(head + _spec_function(levels, False)) + _BASH_MAIN
