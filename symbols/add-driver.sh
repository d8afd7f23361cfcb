#!/usr/bin/env bash
# add-driver.sh: record the export lists of a new NVIDIA driver release.
#
#   symbols/add-driver.sh /path/to/libcuda.so.VERSION /path/to/libnvidia-ml.so.VERSION
#
# Writes symbols/libcuda.so.VERSION.txt and symbols/libnvidia-ml.so.VERSION.txt, each
# exactly what `nm -D --defined-only LIB | awk '{print $NF}' | LC_ALL=C sort -u` prints
# (the way every list here was made). The arguments may be given in either order and may
# be symlinks (libcuda.so.1); the version is taken from the real file's name. Set
# VGPU_SYMBOLS_DIR to write somewhere other than the folder holding this script.
set -euo pipefail

die() {
    echo "add-driver.sh: $*" >&2
    exit 1
}

usage="usage: $0 /path/to/libcuda.so.VERSION /path/to/libnvidia-ml.so.VERSION"
[ "$#" -eq 2 ] || die "expected 2 arguments, got $#; $usage"
command -v nm >/dev/null || die "nm not found; install binutils"

out_dir="${VGPU_SYMBOLS_DIR:-$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)}"
[ -d "$out_dir" ] || die "output folder $out_dir does not exist"

cuda_file="" nvml_file="" version=""
for arg in "$@"; do
    [ -e "$arg" ] || die "$arg does not exist"
    real="$(readlink -f -- "$arg")"
    [ -f "$real" ] || die "$arg is not a regular file"
    name="$(basename -- "$real")"
    case "$name" in
        libcuda.so.*) stem=libcuda.so; [ -z "$cuda_file" ] || die "two libcuda files given" ; cuda_file="$real" ;;
        libnvidia-ml.so.*) stem=libnvidia-ml.so; [ -z "$nvml_file" ] || die "two libnvidia-ml files given"; nvml_file="$real" ;;
        *) die "$arg resolves to $name, which is neither libcuda.so.VERSION nor libnvidia-ml.so.VERSION" ;;
    esac
    this_version="${name#"$stem".}"
    [[ "$this_version" =~ ^[0-9]+\.[0-9]+(\.[0-9]+)?$ ]] \
        || die "$name does not end in a driver version like 580.159.04 (pass the real, versioned file)"
    if [ -n "$version" ] && [ "$version" != "$this_version" ]; then
        die "version mismatch: $version vs $this_version"
    fi
    version="$this_version"
done
[ -n "$cuda_file" ] && [ -n "$nvml_file" ] || die "need one libcuda and one libnvidia-ml file; $usage"

# make_list LIB TMP SENTINEL: the export list of LIB into TMP, after checking that it
# holds SENTINEL (so a wrong or stripped file is caught here, not at shim build time).
make_list() {
    local lib="$1" tmp="$2" sentinel="$3"
    nm -D --defined-only "$lib" | awk '{print $NF}' | LC_ALL=C sort -u >"$tmp" || die "nm -D failed on $lib"
    grep -qx "$sentinel" "$tmp" || die "$lib does not export $sentinel; is it really the driver library?"
    chmod 644 "$tmp"
}

cuda_list="$out_dir/libcuda.so.$version.txt"
nvml_list="$out_dir/libnvidia-ml.so.$version.txt"
cuda_tmp="$(mktemp "$out_dir/.add-driver.XXXXXX")"
nvml_tmp="$(mktemp "$out_dir/.add-driver.XXXXXX")"
trap 'rm -f "$cuda_tmp" "$nvml_tmp"' EXIT
# Both lists are made and checked before either is moved into place.
make_list "$cuda_file" "$cuda_tmp" cuInit
make_list "$nvml_file" "$nvml_tmp" nvmlInit_v2
mv -f "$cuda_tmp" "$cuda_list"
mv -f "$nvml_tmp" "$nvml_list"
echo "wrote $cuda_list ($(wc -l <"$cuda_list") names)"
echo "wrote $nvml_list ($(wc -l <"$nvml_list") names)"

cat <<NEXT

Next steps:
  1. Rebuild the shims; their build scripts read every symbols/libcuda.so.*.txt and
     symbols/libnvidia-ml.so.*.txt, so the new names get forwarders:
       cargo build --release -p libcuda-shim -p libnvml-shim
  2. Check that the shims now export everything this driver does:
       cargo run -p vgpu-ldconfig -- check --real-list $cuda_list --shim target/release/libcuda_shim.so
       cargo run -p vgpu-ldconfig -- check --real-list $nvml_list --shim target/release/libnvml_shim.so
  3. Commit the lists:
       git add $cuda_list $nvml_list
NEXT
