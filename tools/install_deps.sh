#!/usr/bin/env bash
# tools/install_deps.sh — installs what building and testing need, from
# Debian's packages, only where it is missing: a C compiler and make, Open MPI
# (mpicc, mpirun), Node.js and npm (the reference tokenizer of the BPE test),
# gnuplot (plots), python3 (test/test_sass_frag_check.sh), clang-format
# (tools/format.sh, which CI runs), SLURM and munge (test/test_slurm.sh starts
# a one-machine cluster; without their recommended extra plugins) and, with
# --data, the King James Bible (default dataset).
set -eu
want=()
command -v gcc >/dev/null || want+=(gcc)
command -v make >/dev/null || want+=(make)
command -v mpicc >/dev/null || want+=(openmpi-bin libopenmpi-dev)
command -v node >/dev/null || want+=(nodejs)
command -v npm >/dev/null || want+=(npm)
command -v gnuplot >/dev/null || want+=(gnuplot-nox)
command -v python3 >/dev/null || want+=(python3)
command -v clang-format >/dev/null || want+=(clang-format)
slurm=()
for c in slurmctld:slurmctld slurmd:slurmd sbatch:slurm-client munged:munge; do
    command -v "${c%%:*}" >/dev/null || slurm+=("${c#*:}")
done
if [ "${1:-}" = "--data" ]; then
    command -v bible >/dev/null || want+=(bible-kjv bible-kjv-text)
fi
[ ${#want[@]} -eq 0 ] && [ ${#slurm[@]} -eq 0 ] && exit 0
SUDO=""
[ "$(id -u)" -ne 0 ] && SUDO="sudo"
export DEBIAN_FRONTEND=noninteractive
# apt_install [apt-get options] PACKAGES...: quietly, updating the package lists once if that fails
apt_install() {
    echo "install_deps: installing $*"
    $SUDO apt-get install -y -qq "$@" >/dev/null 2>&1 || {
        $SUDO apt-get update -qq
        $SUDO apt-get install -y -qq "$@"
    }
}
[ ${#want[@]} -eq 0 ] || apt_install "${want[@]}"
[ ${#slurm[@]} -eq 0 ] || apt_install --no-install-recommends "${slurm[@]}"
