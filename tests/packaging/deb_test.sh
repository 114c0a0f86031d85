#!/bin/bash
# The Debian packages end to end: cpack builds them from the build tree, they
# are unpacked into a scratch root (dpkg -x, as an install would lay them
# out), and a tiny trainer is built against the unpacked libckpt-dev twice
# (find_package(ckpt) and pkg-config), then run against the unpacked ckptd;
# the unpacked Python module imports.
#
#   deb_test.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
build=$1
src=$2
work=$(mktemp -d)
daemon=
cleanup() {
  [ -n "$daemon" ] && { kill -9 "$daemon" && wait "$daemon"; } 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
fail() { echo "deb_test: $*" >&2; exit 1; }

(cd "$build" && cpack -G DEB -B "$work/debs" >"$work/cpack.log" 2>&1) ||
  { cat "$work/cpack.log" >&2; fail "cpack failed"; }
for p in ckptd libckpt0 libckpt-dev python3-ckpt; do
  deb=$(ls "$work"/debs/${p}_*.deb 2>/dev/null | head -1 || true)
  [ -n "$deb" ] || fail "no package $p among: $(ls "$work/debs")"
  dpkg-deb --info "$deb" >/dev/null || fail "$deb is not a valid package"
  dpkg -x "$deb" "$work/root"
  echo "$p: $(dpkg-deb -f "$deb" Version) depends on: $(dpkg-deb -f "$deb" Depends)"
done
# Dependencies on Debian's libraries were found (dpkg-shlibdeps).
dpkg-deb -f "$work"/debs/ckptd_*.deb Depends | grep -q librocksdb ||
  fail "ckptd's package does not depend on librocksdb"
dpkg-deb -f "$work"/debs/libckpt-dev_*.deb Depends | grep -q libckpt0 ||
  fail "libckpt-dev does not depend on libckpt0"
root=$work/root
for f in usr/bin/ckptd usr/bin/ckpt usr/bin/ckpt-chaos usr/bin/ckpt-certs usr/lib/ckpt/ckpt-demo-trainer \
         usr/lib/systemd/system/ckptd@.service etc/ckpt/ckptd.toml \
         usr/include/ckpt/ckpt.h usr/share/doc/ckpt/README.md usr/share/doc/ckpt/ARCHITECTURE.md \
         usr/share/doc/ckpt/docs/security.md; do
  [ -e "$root/$f" ] || fail "$f is not in the packages"
done
dpkg-deb --ctrl-tarfile "$work"/debs/ckptd_*.deb | tar -xO ./conffiles |
  grep -qx /etc/ckpt/ckptd.toml || fail "/etc/ckpt/ckptd.toml is not a conffile"
# Only the C API is exported.
lib=$(find "$root" -name 'libckpt.so.0' | head -1)
[ -n "$lib" ] || fail "libckpt.so.0 is not in libckpt0"
if nm -D --defined-only "$lib" | awk '$2 ~ /[TDBW]/ {print $3}' |
    grep -v '^ckpt_' | grep -q .; then
  fail "libckpt.so exports more than ckpt_*: $(nm -D --defined-only "$lib" |
    awk '$2 ~ /[TDBW]/ {print $3}' | grep -v '^ckpt_' | head -5)"
fi
libdir=$(dirname "$lib")

# The installed configuration is accepted by the installed daemon.
"$root/usr/bin/ckptd" --config "$root/etc/ckpt/ckptd.toml" --print-config \
  >/dev/null || fail "ckptd refuses the packaged /etc/ckpt/ckptd.toml"

# find_package(ckpt) from the scratch root.
cmake -S "$src/tests/packaging/tiny_trainer" -B "$work/cmake-build" \
  -DCMAKE_PREFIX_PATH="$root/usr" >"$work/cmake.log" 2>&1 ||
  { cat "$work/cmake.log" >&2; fail "find_package(ckpt) failed"; }
cmake --build "$work/cmake-build" >>"$work/cmake.log" 2>&1 ||
  { cat "$work/cmake.log" >&2; fail "building against ckpt::ckpt failed"; }
# pkg-config from the scratch root.
export PKG_CONFIG_PATH=$libdir/pkgconfig
cc -o "$work/tiny_pc" "$src/tests/packaging/tiny_trainer/tiny_trainer.c" \
  $(pkg-config --cflags --libs ckpt) || fail "building with pkg-config failed"

# Both run against the packaged daemon.
mkdir -p "$work/run"
"$root/usr/bin/ckptd" --socket "$work/run/ckptd.sock" --data-dir "$work/data" \
  --staging-dir "$work/staging" >"$work/ckptd.log" 2>&1 &
daemon=$!
for _ in $(seq 100); do [ -S "$work/run/ckptd.sock" ] && break; sleep 0.1; done
[ -S "$work/run/ckptd.sock" ] || { cat "$work/ckptd.log" >&2; fail "ckptd did not start"; }
LD_LIBRARY_PATH=$libdir "$work/cmake-build/tiny_trainer" "$work/run/ckptd.sock" tiny-cmake
LD_LIBRARY_PATH=$libdir "$work/tiny_pc" "$work/run/ckptd.sock" tiny-pkgconfig
listed=$("$root/usr/bin/ckpt" --socket "$work/run/ckptd.sock" ls)
for job in tiny-cmake tiny-pkgconfig; do
  grep -q "$job" <<<"$listed" || fail "the packaged ckpt does not list $job: $listed"
done

# ckpt-chaos finds the daemon and its rank program where the package put them.
"$root/usr/bin/ckpt-chaos" --faults 2 --ranks 1 --elements 1024 \
  --kinds kill_daemon,kill_trainer >"$work/chaos.log" 2>&1 ||
  { cat "$work/chaos.log" >&2; fail "the packaged ckpt-chaos failed"; }

# The Python module imports from where Debian's python3 looks.
PYTHONPATH=$root/usr/lib/python3/dist-packages python3 -c \
  "import ckpt; assert ckpt.default_socket()" || fail "import ckpt failed"
echo "deb_test: packages install, a trainer builds against them and runs"
