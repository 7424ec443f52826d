# Sourced by ./test.sh: FUSE for the power-cut tests' forgetful file system
# (tests/src/forgetfs). It mounts with the mount system call as root; where
# that is refused it falls back to fusermount3, from Debian's fuse3,
# installed here where missing. /dev/fuse comes from the kernel's fuse
# module, loaded here where it is not.
if [ ! -e /dev/fuse ]; then
    echo "fuse.sh: no /dev/fuse; loading the fuse module" >&2
    modprobe fuse || echo "fuse.sh: could not load the fuse module: the power-cut tests will fail" >&2
fi
if ! command -v fusermount3 >/dev/null 2>&1; then
    echo "fuse.sh: no fusermount3 here; installing Debian's fuse3" >&2
    sudo_=""
    [ "$(id -u)" = 0 ] || sudo_=sudo
    $sudo_ apt-get install -y -q fuse3 >/dev/null || echo "fuse.sh: fuse3 not installed" >&2
fi
# A test process killed mid-run (not one that fails: that unmounts) leaves
# its mount behind, answering "transport endpoint is not connected". Such
# dead mounts are taken down; a live one (another suite running here)
# answers, and is left alone.
while read -r src dir _; do
    if [ "$src" = forgetfs ] && ! stat "$dir" >/dev/null 2>&1; then
        echo "fuse.sh: taking down a dead test mount at $dir" >&2
        umount -l "$dir" 2>/dev/null || fusermount3 -uz "$dir" 2>/dev/null || true
    fi
done </proc/mounts
