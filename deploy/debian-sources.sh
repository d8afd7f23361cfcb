#!/usr/bin/env bash
# What this machine's own apt configuration says about its Debian archive, so that no
# install script of ours names a mirror:
#
#   deploy/debian-sources.sh nonfree   deb822 stanzas that add the `non-free` component
#                                       to every enabled Debian source of this release
#                                       (same URIs, suites and keys); nothing when
#                                       non-free is already enabled there
#   deploy/debian-sources.sh mirror    the URI of this release's main archive (what
#                                       debootstrap needs); nothing when there is none
#
# A source belongs to this release when one of its suites is VERSION_CODENAME (from
# os-release) or VERSION_CODENAME-something other than -security, and it carries
# `main`. The security archive is left as it is: it carries newer builds of the NVIDIA
# driver than the release, and the tests' fixture packages are the release's. Both deb822
# (*.sources) and one-line (sources.list, *.list) files are read; disabled stanzas
# (`Enabled: no`) and our own output file are skipped. APT_ETC (default /etc/apt) and
# OS_RELEASE (default /etc/os-release) point elsewhere for tests.
set -euo pipefail

APT_ETC=${APT_ETC:-/etc/apt}
OS_RELEASE=${OS_RELEASE:-/etc/os-release}
OWN_FILE=vgpu-nonfree.sources

codename() {
    local name=""
    if [ -r "$OS_RELEASE" ]; then
        name=$(. "$OS_RELEASE" && echo "${VERSION_CODENAME:-}")
    fi
    if [ -z "$name" ]; then
        echo "debian-sources.sh: no VERSION_CODENAME in $OS_RELEASE" >&2
        exit 1
    fi
    echo "$name"
}

# Every enabled source, one per line: TYPES<TAB>URIS<TAB>SUITES<TAB>COMPONENTS<TAB>SIGNED_BY<TAB>ARCHITECTURES
# (lists space-separated; SIGNED_BY a path, or empty).
sources() {
    local file
    for file in "$APT_ETC"/sources.list.d/*.sources; do
        [ -f "$file" ] || continue
        [ "$(basename "$file")" = "$OWN_FILE" ] && continue
        awk '
            function flush() {
                if (types != "" && tolower(enabled) != "no")
                    printf "%s\t%s\t%s\t%s\t%s\t%s\n", types, uris, suites, comps, signed, archs
                types = uris = suites = comps = signed = archs = ""; enabled = "yes"; field = ""
            }
            BEGIN { enabled = "yes" }
            /^[ \t]*#/ { next }
            /^[ \t]*$/ { flush(); next }
            /^[ \t]/ { next }   # continuation lines (an inline key): not a path, not copied
            {
                split($0, kv, ":"); field = tolower(kv[1])
                value = substr($0, length(kv[1]) + 2); gsub(/^[ \t]+|[ \t]+$/, "", value)
                if (field == "types") types = value
                else if (field == "uris") uris = value
                else if (field == "suites") suites = value
                else if (field == "components") comps = value
                else if (field == "signed-by") signed = value
                else if (field == "architectures") archs = value
                else if (field == "enabled") enabled = value
            }
            END { flush() }
        ' "$file"
    done
    for file in "$APT_ETC"/sources.list "$APT_ETC"/sources.list.d/*.list; do
        [ -f "$file" ] || continue
        awk '
            /^[ \t]*deb[ \t]/ {
                signed = archs = ""; i = 2
                if ($2 ~ /^\[/) {
                    while (i <= NF) {
                        option = $i; gsub(/[\[\]]/, "", option)
                        if (option ~ /^signed-by=/) { sub(/^signed-by=/, "", option); signed = option }
                        if (option ~ /^arch=/) { sub(/^arch=/, "", option); archs = option; gsub(/,/, " ", archs) }
                        if ($i ~ /\]$/) { i++; break }
                        i++
                    }
                }
                uri = $i; suite = $(i + 1); comps = ""
                for (j = i + 2; j <= NF; j++) comps = comps (comps == "" ? "" : " ") $j
                printf "deb\t%s\t%s\t%s\t%s\t%s\n", uri, suite, comps, signed, archs
            }
        ' "$file"
    done
}

# Suites of SUITES that belong to release CODENAME.
release_suites() {
    local suite kept=""
    for suite in $1; do
        case "$suite" in
            "$2"-security) ;;
            "$2" | "$2"-*) kept="$kept${kept:+ }$suite" ;;
        esac
    done
    echo "$kept"
}

has_word() { case " $1 " in *" $2 "*) return 0 ;; esac; return 1; }

nonfree() {
    local release types uris suites comps signed archs kept out="" enabled=""
    release=$(codename)
    while IFS=$'\t' read -r types uris suites comps signed archs; do
        has_word "$types" deb || continue
        kept=$(release_suites "$suites" "$release")
        [ -n "$kept" ] || continue
        if has_word "$comps" non-free; then
            enabled="$enabled $kept"
            continue
        fi
        has_word "$comps" main || continue
        out+="Types: deb"$'\n'"URIs: $uris"$'\n'"Suites: $kept"$'\n'"Components: non-free"$'\n'
        [ -n "$archs" ] && out+="Architectures: $archs"$'\n'
        [ -n "$signed" ] && out+="Signed-By: $signed"$'\n'
        out+=$'\n'
    done < <(sources)
    # Non-free already enabled for the release itself: nothing to add.
    if has_word "$enabled" "$release"; then
        return 0
    fi
    printf '%s' "$out"
}

mirror() {
    local release types uris suites comps signed archs
    release=$(codename)
    while IFS=$'\t' read -r types uris suites comps signed archs; do
        has_word "$types" deb && has_word "$suites" "$release" && has_word "$comps" main || continue
        echo "${uris%% *}"
        return 0
    done < <(sources)
}

case "${1:-}" in
    nonfree) nonfree ;;
    mirror) mirror ;;
    *)
        echo "usage: $0 nonfree|mirror" >&2
        exit 2
        ;;
esac
