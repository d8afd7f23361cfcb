#!/usr/bin/env bash
# Runs each cargo-fuzz target (fuzz/fuzz_targets/) for a bounded time: the quota config,
# the card view, the usage region, ld.so.cache and the HTTP/2 relay in front of the
# plugin's sockets (h2_authority), the parsers of hostile input.
#
#   bash tests/fuzz.sh [SECONDS_PER_TARGET] [TARGET...]     (default 45 s, every target)
#
# cargo-fuzz wants a nightly compiler for -Zsanitizer=address; this machine (and CI) has
# the stable toolchain only and no way to download another, so the stable compiler runs
# with RUSTC_BOOTSTRAP=1, which lets it take nightly flags. The sanitizer runtimes ship
# with the stable toolchain, so the targets run under AddressSanitizer, which matters
# here: the region readers go through raw pointers into a mapping.
#
# A crash leaves its input in fuzz/artifacts/TARGET/ and fails this script; replay it
# with `RUSTC_BOOTSTRAP=1 cargo fuzz run TARGET fuzz/artifacts/TARGET/crash-...`.
set -euo pipefail
cd "$(dirname "$0")/.."

seconds=${1:-45}
shift || true
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(config cardview region ld_cache h2_authority)

if ! cargo fuzz --version >/dev/null 2>&1; then
    cargo install cargo-fuzz --version 0.13.2 --locked
fi
export RUSTC_BOOTSTRAP=1

# Seeds: every YAML example of README and docs/ (the configs users write), the view and
# the HTTP/2 streams in fuzz/seeds/, and this machine's own loader cache.
seeds=target/fuzz-seeds
rm -rf "$seeds"
mkdir -p "$seeds"/{config,cardview,region,ld_cache,h2_authority}
for doc in README.md docs/*.md; do
    awk -v out="$seeds/config/$(basename "$doc" .md)" '
        /^```yaml/ { n++; keep = 1; next }
        /^```/ { keep = 0 }
        keep { print > (out "-" n ".yaml") }' "$doc"
done
cp fuzz/seeds/cardview/* "$seeds/cardview/"
cp fuzz/seeds/h2_authority/* "$seeds/h2_authority/"
[ -r /etc/ld.so.cache ] && cp /etc/ld.so.cache "$seeds/ld_cache/"
printf '' > "$seeds/region/empty"

for target in "${targets[@]}"; do
    corpus=target/fuzz-corpus/$target
    mkdir -p "$corpus"
    echo "fuzz: $target for ${seconds}s"
    log=target/fuzz-$target.log
    # -rss_limit_mb: far above what any target needs; a leak past it is a finding.
    if ! cargo fuzz run --fuzz-dir fuzz "$target" "$corpus" "$seeds/$target" -- \
        -max_total_time="$seconds" -rss_limit_mb=2048 -print_final_stats=1 >"$log" 2>&1; then
        tail -n 80 "$log"
        echo "fuzz: $target FAILED (its input is in fuzz/artifacts/$target/)"
        exit 1
    fi
    grep -E '^stat::(number_of_executed_units|peak_rss_mb)' "$log" | tr '\n' ' '
    echo
    echo "fuzz: $target ok"
done
