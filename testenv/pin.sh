#!/usr/bin/env bash
# Pin the testenv Go module to each Kubernetes release listed in testenv/versions.
#
# Every release gets its own module file, mod/<version>/go.mod and go.sum, and the build
# selects it with `go build -modfile=mod/<version>/go.mod`: one source tree, one module
# graph per release, each committed so that a build is reproducible. testenv/go.mod and
# go.sum are symbolic links to the newest release's files, so that plain `go` commands
# (go vet, an editor's language server) in testenv/ see the default release.
#
# k8s.io/kubernetes refers to its staging modules (k8s.io/api, k8s.io/client-go, ...)
# as v0.0.0 with local replace directives, which do not apply to a module that depends
# on it; so each modfile replaces every staging module with its published
# v0.<minor>.<patch> version, read from the release's own go.mod. Every other module
# starts at the version the release itself requires (`go mod tidy` resolves the rest),
# so etcd, CDI and the like match what that release was tested with.
#
# Usage: testenv/pin.sh [VERSION...]          write the modfiles (default: every listed release)
#        testenv/pin.sh --check [VERSION...]  exit 1 if a modfile disagrees with its release (and,
#                                             without VERSION, if go.mod is not the newest's)
#        testenv/pin.sh --resolve K8S         the listed release K8S names (1.35, v1.35, 1.35.4)
#        testenv/pin.sh --list                the listed releases, oldest first
#        testenv/pin.sh --tags VERSION        the Go build tags for VERSION: k8spre1.N for every
#                                             listed minor N newer than VERSION's, so that files
#                                             for older releases say `//go:build k8spre1.N`
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cd "$here"

# The listed releases, one v1.N.M a line; '#' starts a comment.
listed() {
    sed 's/#.*//' versions | tr -s '[:space:]' '\n' | sed '/^$/d' | sort -t. -k2,2n -k3,3n
}

# The newest listed release: the default one.
newest() { listed | tail -n 1; }

# resolve K8S: the listed release a minor (1.35), a v-prefixed minor or a full version names.
resolve() {
    local want="${1#v}" v
    [[ -z "$want" ]] && { newest; return; }
    for v in $(listed); do
        if [[ "${v#v}" == "$want" || "${v#v}" == "$want".* ]]; then
            echo "$v"
            return
        fi
    done
    echo "Kubernetes '$1' is not listed in testenv/versions ($(listed | tr '\n' ' '))" >&2
    return 2
}

staging_of() {
    [[ "$1" =~ ^v1\.([0-9]+)\.([0-9]+)$ ]] || { echo "not a release: '$1'" >&2; return 2; }
    echo "v0.${BASH_REMATCH[1]}.${BASH_REMATCH[2]}"
}

check() {
    local version="$1" modfile="mod/$1/go.mod" staging pins bad ok=1
    staging="$(staging_of "$version")"
    if [[ ! -f "$modfile" || ! -f "mod/$version/go.sum" ]]; then
        echo "$modfile or its go.sum is missing; run testenv/pin.sh $version" >&2
        return 1
    fi
    grep -Eq "^[[:space:]]*k8s.io/kubernetes ${version}([[:space:]]|$)" "$modfile" || {
        echo "$modfile does not require k8s.io/kubernetes ${version}" >&2; ok=0; }
    # every staging replace must point at the matching staging version
    pins="$(grep -E '^[[:space:]]*(replace[[:space:]]+)?k8s\.io/[a-z0-9-]+ => k8s\.io/' "$modfile" || true)"
    if [[ -z "$pins" ]]; then
        echo "$modfile has no staging replace directives" >&2; ok=0
    fi
    bad="$(grep -v " ${staging}\$" <<<"$pins" || true)"
    if [[ -n "$bad" ]]; then
        echo "$modfile: replace directives not at ${staging}:" >&2
        echo "$bad" >&2
        ok=0
    fi
    [[ $ok == 1 ]] && echo "mod/$version matches k8s.io/kubernetes ${version}"
    [[ $ok == 1 ]]
}

check_links() {
    local want="mod/$(newest)" f
    for f in go.mod go.sum; do
        if [[ "$(readlink "$f" 2>/dev/null)" != "$want/$f" ]]; then
            echo "testenv/$f should link to $want/$f (the newest listed release); run testenv/pin.sh" >&2
            return 1
        fi
    done
}

pin() {
    local version="$1" staging info release_mod dir="mod/$1" m
    staging="$(staging_of "$version")"
    info="$(go mod download -json "k8s.io/kubernetes@${version}")"
    if grep -q '"Error"' <<<"$info"; then
        # e.g. the module proxy refuses some release zips ("not available")
        echo "cannot download k8s.io/kubernetes@${version}:" >&2
        grep '"Error"' <<<"$info" >&2
        return 1
    fi
    release_mod="$(sed -n 's/.*"GoMod": "\(.*\)".*/\1/p' <<<"$info")"
    mkdir -p "$dir"
    {
        echo "module draplugin.test/testenv"
        echo
        echo "go 1.26.0"
        echo
        echo "require k8s.io/kubernetes ${version}"
        echo
        echo "// Staging modules of k8s.io/kubernetes ${version}; written by pin.sh."
        echo "replace ("
        # Staging modules are the replace targets of the form ./staging/src/<path>; some
        # (samples) are not published: skip those the proxy lacks.
        sed -n 's#^[[:space:]]*\(k8s\.io/[^ ]*\) => \./staging/src/.*#\1#p' "$release_mod" |
            while read -r m; do
                if go mod download "${m}@${staging}" >/dev/null 2>&1; then
                    printf '\t%s => %s %s\n' "$m" "$m" "$staging"
                fi
            done
        echo ")"
    } > "$dir/go.mod"
    : > "$dir/go.sum"
    # The release's own requirements first, so that tidy keeps its versions of shared
    # dependencies (etcd, CDI, ...) instead of taking the newest ones.
    local reqs
    mapfile -t reqs < <(go mod edit -json "$release_mod" | tr -d ' \t\n' |
        grep -o '"Path":"[^"]*","Version":"[^"]*"' |
        sed 's/"Path":"\([^"]*\)","Version":"\([^"]*\)"/-require=\1@\2/' |
        grep -v '^-require=k8s\.io/[^@]*@v0\.0\.0$')
    go mod edit "${reqs[@]}" "$dir/go.mod"
    go mod tidy -modfile="$dir/go.mod"
    echo "pinned k8s.io/kubernetes ${version} (staging ${staging}) in testenv/$dir"
}

# tags VERSION: k8spre1.N for each listed release 1.N newer than VERSION (none for the newest).
tags() {
    local minor v out=()
    minor="$(cut -d. -f2 <<<"$1")"
    for v in $(listed); do
        (( $(cut -d. -f2 <<<"$v") > minor )) && out+=("k8spre1.$(cut -d. -f2 <<<"$v")")
    done
    echo "${out[*]}"
}

case "${1:-}" in
--list)
    listed
    ;;
--tags)
    tags "$(resolve "${2:-}")"
    ;;
--resolve)
    resolve "${2:-}"
    ;;
--check)
    shift
    versions=("$@")
    ok=1
    if [[ ${#versions[@]} == 0 ]]; then
        mapfile -t versions < <(listed)
        check_links || ok=0
    fi
    for v in "${versions[@]}"; do check "$(resolve "$v")" || ok=0; done
    [[ $ok == 1 ]]
    ;;
*)
    versions=("$@")
    [[ ${#versions[@]} == 0 ]] && mapfile -t versions < <(listed)
    for v in "${versions[@]}"; do pin "$(resolve "$v")"; done
    ln -sfn "mod/$(newest)/go.mod" go.mod
    ln -sfn "mod/$(newest)/go.sum" go.sum
    ;;
esac
