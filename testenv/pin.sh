#!/usr/bin/env bash
# Pin the testenv Go module to the Kubernetes release named in K8S_VERSION.
#
# k8s.io/kubernetes refers to its staging modules (k8s.io/api, k8s.io/client-go, ...)
# as v0.0.0 with local replace directives, so a module that depends on it must
# replace every staging module with its published v0.<minor>.<patch> version.
# This script reads the staging module list from the release's own go.mod and
# rewrites the require/replace directives of testenv/go.mod accordingly.
#
# Usage: testenv/pin.sh            rewrite go.mod/go.sum for K8S_VERSION
#        testenv/pin.sh --check    exit 1 if go.mod does not match K8S_VERSION
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cd "$here"

version="$(tr -d '[:space:]' < K8S_VERSION)"
if [[ ! "$version" =~ ^v1\.([0-9]+)\.([0-9]+)$ ]]; then
    echo "K8S_VERSION must look like v1.N.M, got '$version'" >&2
    exit 2
fi
staging="v0.${BASH_REMATCH[1]}.${BASH_REMATCH[2]}"

if [[ "${1:-}" == "--check" ]]; then
    ok=1
    grep -Eq "^[[:space:]]*k8s.io/kubernetes ${version}([[:space:]]|$)" go.mod || {
        echo "go.mod does not require k8s.io/kubernetes ${version}" >&2; ok=0; }
    # every staging replace must point at the matching staging version
    pins="$(grep -E '^[[:space:]]*(replace[[:space:]]+)?k8s\.io/[a-z0-9-]+ => k8s\.io/' go.mod || true)"
    if [[ -z "$pins" ]]; then
        echo "go.mod has no staging replace directives" >&2; ok=0
    fi
    bad="$(grep -v " ${staging}\$" <<<"$pins" || true)"
    if [[ -n "$bad" ]]; then
        echo "replace directives not at ${staging}:" >&2
        echo "$bad" >&2
        ok=0
    fi
    [[ $ok == 1 ]] && echo "go.mod matches K8S_VERSION ${version}"
    [[ $ok == 1 ]]
    exit $?
fi

info="$(go mod download -json "k8s.io/kubernetes@${version}")"
if grep -q '"Error"' <<<"$info"; then
    # e.g. the module proxy refuses some release zips ("not available")
    echo "cannot download k8s.io/kubernetes@${version}:" >&2
    grep '"Error"' <<<"$info" >&2
    exit 1
fi
modfile="$(sed -n 's/.*"GoMod": "\(.*\)".*/\1/p' <<<"$info")"

# Staging modules are the replace targets of the form ./staging/src/<path>.
mapfile -t mods < <(sed -n 's#^[[:space:]]*\(k8s\.io/[^ ]*\) => \./staging/src/.*#\1#p' "$modfile")

# Drop the old pins, then add the new ones as one block.
for m in $(go mod edit -json | sed -n 's/.*"Path": "\(k8s\.io\/[^"]*\)".*/\1/p' | sort -u); do
    go mod edit -dropreplace="$m" 2>/dev/null || true
done
block="// Staging modules of k8s.io/kubernetes ${version}; written by pin.sh from K8S_VERSION.
replace ("
for m in "${mods[@]}"; do
    # some staging modules (samples) are not published; skip those the proxy lacks
    if go mod download "${m}@${staging}" >/dev/null 2>&1; then
        block+=$'\n\t'"${m} => ${m} ${staging}"
    fi
done
block+=$'\n)'
# remove a previous comment line, then append the block
sed -i '/^\/\/ Staging modules of k8s.io\/kubernetes/d' go.mod
printf '\n%s\n' "$block" >> go.mod
go mod edit -require="k8s.io/kubernetes@${version}"
go mod tidy
echo "pinned k8s.io/kubernetes ${version} (staging ${staging})"
