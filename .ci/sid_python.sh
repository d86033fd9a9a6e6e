#!/usr/bin/env bash
# The README's two commands with a Python only Debian unstable has (3.14 while
# Debian 12 has 3.11), clean: Debian sid's own python3.X package in a sid chroot
# (debootstrap: sid's glibc and toolchain, nothing from this machine), a fresh
# venv, a fresh clone of this checkout's HEAD. Not part of .ci/run (it fetches
# a whole sid system); docs/building.md says when it was run and what it gave.
#   - the chroot is made once, in CHROOT_DIR (default /opt/cuda_debug_sid);
#   - it runs in a private mount namespace (proc, dev, sys and a tmpfs /tmp
#     mounted there only), on a clone of HEAD made in CHROOT_DIR/root/clone:
#     nothing changes outside CHROOT_DIR;
#   - this machine's CA bundle and pip configuration are copied in (a proxy that
#     re-signs TLS is trusted inside too).
# Extra arguments replace the README's test command: `python3 -m pytest ARGS...`.
#
# usage (as root): .ci/sid_python.sh [python3.14 [CHROOT_DIR [PYTEST ARGS...]]]
set -euo pipefail
PYPKG=${1:-python3.14}
ROOT=${2:-/opt/cuda_debug_sid}
shift $(( $# < 2 ? $# : 2 ))
SRC=$(cd "$(dirname "$0")/.." && pwd)
[ "$(id -u)" = 0 ] || { echo "sid_python: run as root (debootstrap, chroot)"; exit 1; }

if [ ! -x "$ROOT/usr/bin/$PYPKG" ]; then
    command -v debootstrap >/dev/null || DEBIAN_FRONTEND=noninteractive apt-get install -y -q debootstrap
    debootstrap --variant=minbase \
        --include="$PYPKG,$PYPKG-venv,$PYPKG-dev,gcc,libc6-dev,make,git,ca-certificates,nodejs" \
        sid "$ROOT"
fi
[ -f /etc/ssl/certs/ca-certificates.crt ] && cp /etc/ssl/certs/ca-certificates.crt "$ROOT/etc/ssl/certs/"
[ -f /etc/pip.conf ] && cp /etc/pip.conf "$ROOT/etc/pip.conf"
cp /etc/resolv.conf "$ROOT/etc/resolv.conf"
rm -rf "$ROOT/root/clone"
git clone -q "$SRC" "$ROOT/root/clone"        # HEAD of this checkout, nothing uncommitted

cat > "$ROOT/root/readme_run.sh" <<'EOF'
set -euo pipefail
PYPKG=$1; shift
rm -rf /root/venv
cd /root/clone
"$PYPKG" -m venv /root/venv
export PATH="/root/venv/bin:$PATH" VIRTUAL_ENV=/root/venv
python3 -c 'import sys; print("Python", sys.version.split()[0], sys.executable)'
cmds=$(awk '/^```bash$/ { inside = 1; next } /^```/ { if (inside) exit } inside' README.md)
if [ $# -gt 0 ]; then
    cmds="$(echo "$cmds" | head -1)
python3 -m pytest $*"
fi
echo "$cmds"
bash -euo pipefail -c "$cmds"
EOF

exec unshare -m --propagation private bash -c '
set -e
ROOT=$1; SRC=$2; shift 2
mount -t proc proc "$ROOT/proc"
mount --rbind /dev "$ROOT/dev"
mount --rbind /sys "$ROOT/sys"
mount -t tmpfs tmpfs "$ROOT/tmp"
exec chroot "$ROOT" /usr/bin/env -i HOME=/root PATH=/usr/local/bin:/usr/bin:/bin LANG=C.UTF-8 \
    CI="${CI:-}" bash /root/readme_run.sh "$@"' bash "$ROOT" "$SRC" "$PYPKG" "$@"
