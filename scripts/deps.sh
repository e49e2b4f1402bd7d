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
#   ptxas, cuobjdump    assemble the committed PTX for sm_80/sm_90 and read its
#                       SASS (tensor-core instructions, spills). Debian ships
#                       them only inside nvidia-cuda-toolkit (contrib/non-free,
#                       ~3 GB with its dependencies), so this script downloads
#                       that one .deb (84 MB) and extracts the two static
#                       binaries into $TOOLS (default .cache/tools/bin), which
#                       make test puts on PATH. An installed toolkit is used as is.
#
# It needs root (or sudo) only when something is missing. It prints what it
# does and fails, naming the package, when an install fails.
set -euo pipefail
cd "$(dirname "$0")/.."
TOOLS=${TOOLS:-$PWD/.cache/tools/bin}

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

need=()
command -v g++ >/dev/null 2>&1 || need+=(g++)
command -v mpirun >/dev/null 2>&1 || need+=(openmpi-bin)
if [ ${#need[@]} -gt 0 ]; then
	apt_update
	echo "deps: apt-get install ${need[*]}"
	if ! DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null; then
		echo "deps: could not install ${need[*]} (run as root, or install them: apt-get install ${need[*]})" >&2
		exit 1
	fi
fi

have_tool() { command -v "$1" >/dev/null 2>&1 || [ -x "$TOOLS/$1" ]; }
if ! have_tool ptxas || ! have_tool cuobjdump; then
	src=/etc/apt/sources.list.d/debian.sources
	if [ -f "$src" ] && ! grep -q '^Components:.*non-free' "$src"; then
		echo "deps: enabling contrib and non-free in $src (nvidia-cuda-toolkit lives there)"
		$sudo sed -i 's/^Components: main$/Components: main contrib non-free non-free-firmware/' "$src"
		apt_updated=0
	fi
	apt_update
	tmp=$(mktemp -d)
	chmod 755 "$tmp" # apt downloads as the _apt user
	trap 'rm -rf "$tmp"' EXIT
	echo "deps: downloading nvidia-cuda-toolkit's .deb for ptxas and cuobjdump"
	if ! (cd "$tmp" && apt-get download -qq nvidia-cuda-toolkit >/dev/null); then
		echo "deps: could not download nvidia-cuda-toolkit (is contrib/non-free enabled in $src?)" >&2
		exit 1
	fi
	dpkg-deb -x "$tmp"/nvidia-cuda-toolkit_*.deb "$tmp/x"
	mkdir -p "$TOOLS"
	install -m 0755 "$tmp/x/usr/bin/ptxas" "$tmp/x/usr/bin/cuobjdump" "$TOOLS/"
	echo "deps: ptxas and cuobjdump in $TOOLS"
fi
