#!/usr/bin/env bash
# deps.sh: installs what `make test` needs beyond Go, on a fresh Debian 12
# machine of this project's kind, and does nothing when it is all there.
# make test runs it first (CI calls make test), so no step is done by hand.
#
#   g++                 builds the CUDA emulator (kernels/cuda's tests compile
#                       the real .cu kernels with it); without it every CUDA
#                       kernel would go untested
#   Open MPI            mpirun and libmpi.so.40, for the data-parallel tests
#                       (Debian package openmpi-bin)
#   procps              pgrep and kill, which cmd/train's rank-failure test
#                       runs (Debian's minimal images lack them)
#   git, tar            trainer's count of a NeMo RL clone's recipes (run only
#                       with TRACEGRPO_NEMORL_REPO set)
#   bash, make, sed,    internal/docs runs README.md's and docs/*.md's shell
#   mkdir, mv           blocks with bash, and these are the programs they run
#   python3             docs/loop.md's block runs scripts/gym_vllm_loop.py --fake
#                       (the standard library only; Debian package python3)
#   ptxas, cuobjdump,   assemble the committed PTX for sm_80/sm_90 and read its
#   nvdisasm            SASS (tensor-core instructions, spills); cuobjdump -sass
#                       runs nvdisasm. Debian ships them only inside
#                       nvidia-cuda-toolkit (contrib/non-free, ~3 GB with its
#                       dependencies), so this script downloads that one .deb
#                       (84 MB) and extracts the three static binaries into
#                       $TOOLS (default .cache/tools/bin), which make test puts
#                       on PATH. An installed toolkit is not used: the tests
#                       take these only from $TOOLS.
#
# The two lists below are every program a test runs (internal/testtool reads
# them: a test asking for a program on neither fails). make test runs the
# tests with PATH cut to $TOOLS, Go's own bin and the system directories
# (syspath), so a program installed by hand elsewhere is not found; the
# system tools are looked for on that same PATH here.
#
# Two more sets, for developers, never for make test:
#   scripts/deps.sh nvcc     nvcc for `make ptx`: the toolkit's nvcc, cicc,
#                            libdevice and nvidia-cuda-dev's headers extracted
#                            into $CUDA_HOME (default .cache/cuda); nothing is
#                            installed with dpkg
#   scripts/deps.sh golden   Debian's python3-torch, python3-numpy,
#                            python3-omegaconf, python3-protobuf and
#                            python3-crcmod (the TensorBoard event file's
#                            reference), the independent references
#                            `make golden` runs
#   scripts/deps.sh bench    python3-torch and libopenblas0-pthread, the
#                            PyTorch that `make bench-torch` times (with
#                            OpenBLAS, not the reference BLAS; installing it
#                            also makes it the system's libblas.so.3)
#
# It needs root (or sudo) only when something is missing. It prints what it
# does and fails, naming the package, when an install fails.
set -euo pipefail
cd "$(dirname "$0")/.."
TOOLS=${TOOLS:-$PWD/.cache/tools/bin}
CUDA_HOME=${CUDA_HOME:-$PWD/.cache/cuda}
mode=${1:-test}
case $mode in test|nvcc|golden|bench) ;; *) echo "usage: scripts/deps.sh [test|nvcc|golden|bench]" >&2; exit 2;; esac

sudo=""
if [ "$(id -u)" != 0 ]; then
	if command -v sudo >/dev/null 2>&1; then sudo="sudo"; fi
fi

apt_updated=0
apt_update() {
	if [ $apt_updated = 0 ]; then
		echo "deps: apt-get update"
		$sudo apt-get update -qq
		apt_updated=1
	fi
}

# download PKG DIR: fetch one .deb from Debian's contrib/non-free into DIR.
download() {
	src=/etc/apt/sources.list.d/debian.sources
	if [ -f "$src" ] && ! grep -q '^Components:.*non-free' "$src"; then
		echo "deps: enabling contrib and non-free in $src (nvidia-cuda-toolkit lives there)"
		$sudo sed -i 's/^Components: main$/Components: main contrib non-free non-free-firmware/' "$src"
		apt_updated=0
	fi
	apt_update
	chmod 755 "$2" # apt downloads as the _apt user
	echo "deps: downloading $1's .deb"
	if ! (cd "$2" && apt-get download -qq "$1" >/dev/null 2>&1); then
		echo "deps: could not download $1 (is contrib/non-free enabled in $src?)" >&2
		exit 1
	fi
}

apt_install() {
	apt_update
	echo "deps: apt-get install $*"
	if ! DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "$@" >/dev/null; then
		echo "deps: could not install $* (run as root, or install them: apt-get install $*)" >&2
		exit 1
	fi
}

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# The programs tests run. toolkit_tools come from the nvidia-cuda-toolkit
# .deb into $TOOLS; system_tools are PROGRAM:DEBIAN-PACKAGE pairs, installed
# with apt-get into the system directories. One line each (testtool parses
# them).
toolkit_tools="ptxas cuobjdump nvdisasm"
system_tools="g++:g++ gcc:g++ mpirun:openmpi-bin pgrep:procps kill:procps cp:coreutils sync:coreutils sh:dash git:git tar:tar bash:bash make:make sed:sed mkdir:coreutils mv:coreutils python3:python3"
syspath=/usr/sbin:/usr/bin:/sbin:/bin

case $mode in
golden | bench)
	pkgs="python3-torch python3-numpy python3-omegaconf python3-protobuf python3-crcmod"
	[ "$mode" = golden ] || pkgs="python3-torch libopenblas0-pthread"
	need=()
	for p in $pkgs; do
		dpkg -s "$p" >/dev/null 2>&1 || need+=("$p")
	done
	[ ${#need[@]} = 0 ] || apt_install "${need[@]}"
	exit 0
	;;
nvcc)
	if [ -x "$CUDA_HOME/bin/nvcc" ] && [ -f "$CUDA_HOME/include/cuda_runtime.h" ]; then exit 0; fi
	download nvidia-cuda-toolkit "$tmp"
	download nvidia-cuda-dev "$tmp"
	mkdir -p "$tmp/x"
	dpkg-deb -x "$tmp"/nvidia-cuda-toolkit_*.deb "$tmp/x"
	dpkg-deb --fsys-tarfile "$tmp"/nvidia-cuda-dev_*.deb | tar -x -C "$tmp/x" ./usr/include
	rm -rf "$CUDA_HOME"
	mkdir -p "$CUDA_HOME/bin"
	k="$tmp/x/usr/lib/nvidia-cuda-toolkit"
	install -m 0755 "$k/bin/nvcc" "$k/bin/cicc" "$tmp/x/usr/bin/ptxas" "$tmp/x/usr/bin/fatbinary" "$tmp/x/usr/bin/cudafe++" "$CUDA_HOME/bin/"
	cp -r "$k/libdevice" "$CUDA_HOME/libdevice"
	cp -r "$tmp/x/usr/include" "$CUDA_HOME/include"
	# nvcc reads nvcc.profile beside itself; _HERE_ is that directory.
	cat >"$CUDA_HOME/bin/nvcc.profile" <<'PROFILE'
NVVMIR_LIBRARY_DIR = $(_HERE_)/../libdevice
PATH += $(_HERE_):
INCLUDES += "-I$(_HERE_)/../include" $(_SPACE_)
PROFILE
	echo "deps: nvcc in $CUDA_HOME/bin ($("$CUDA_HOME/bin/nvcc" --version | sed -n 's/.*release \([0-9.]*\).*/cuda \1/p'))"
	exit 0
	;;
esac

need=()
for tp in $system_tools; do
	if ! PATH=$syspath command -v "${tp%%:*}" >/dev/null 2>&1; then
		case " ${need[*]} " in *" ${tp#*:} "*) ;; *) need+=("${tp#*:}") ;; esac
	fi
done
if [ ${#need[@]} -gt 0 ]; then
	apt_install "${need[@]}"
fi

missing=()
for t in $toolkit_tools; do
	[ -x "$TOOLS/$t" ] || missing+=("$t")
done
if [ ${#missing[@]} -gt 0 ]; then
	echo "deps: ${missing[*]} missing from $TOOLS"
	download nvidia-cuda-toolkit "$tmp"
	dpkg-deb -x "$tmp"/nvidia-cuda-toolkit_*.deb "$tmp/x"
	mkdir -p "$TOOLS"
	for t in $toolkit_tools; do
		install -m 0755 "$tmp/x/usr/bin/$t" "$TOOLS/"
	done
	echo "deps: $toolkit_tools in $TOOLS"
fi
