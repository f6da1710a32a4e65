#!/usr/bin/env bash
# tools/install_deps.sh — installs what building and testing need, from
# Debian's packages, only where it is missing: a C compiler and make, Open MPI
# (mpicc, mpirun), Node.js and npm (the reference tokenizer of the BPE test),
# gnuplot (plots) and, with --data, the King James Bible (default dataset).
set -eu
want=()
command -v gcc >/dev/null || want+=(gcc)
command -v make >/dev/null || want+=(make)
command -v mpicc >/dev/null || want+=(openmpi-bin libopenmpi-dev)
command -v node >/dev/null || want+=(nodejs)
command -v npm >/dev/null || want+=(npm)
command -v gnuplot >/dev/null || want+=(gnuplot-nox)
if [ "${1:-}" = "--data" ]; then
    command -v bible >/dev/null || want+=(bible-kjv bible-kjv-text)
fi
[ ${#want[@]} -eq 0 ] && exit 0
SUDO=""
[ "$(id -u)" -ne 0 ] && SUDO="sudo"
echo "install_deps: installing ${want[*]}"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get install -y -qq "${want[@]}" >/dev/null 2>&1 || {
    $SUDO apt-get update -qq
    $SUDO apt-get install -y -qq "${want[@]}"
}
