#!/usr/bin/env bash
# The CPU sampler's AVX-512 kernels, tested on a machine without AVX-512.
#
# Builds the library's test binaries (its unit tests and the integration suite, without
# the device backend) static, packs them with a small first process (init.c) into an
# initramfs, and boots Debian's cloud kernel with it in Bochs, whose
# Debian build emulates a Skylake-X (AVX-512 F/CD/BW/DQ/VL). The test binaries detect
# AVX-512 there and run the AVX-512 kernels against the reference and the scalar
# loops. This checks results only: emulated time says nothing about speed.
#
# Usage: scripts/avx512-emu/run.sh            # the set below; on a pass it writes the
#                                             # sources' hash (sources.sh) to `checked`
#        scripts/avx512-emu/run.sh FILTER...  # the library's tests matching FILTER
# Needs Debian's packages (installed when missing): bochs, bochsbios, vgabios,
# genisoimage, isolinux, syslinux-common, cpio, gcc. Work files: target/avx512-emu.
#
# Three things of Bochs 2.7 that the script works around:
# - its XSAVE layout disagrees with the kernel about XSAVEC/XSAVES compaction and the
#   PKRU component, so the kernel would turn XSAVE off (and with it AVX): the kernel
#   command line clears those CPUID bits (`clearcpuid=`), and APERF/MPERF, which Bochs
#   does not implement;
# - a gather whose index is in zmm16-zmm31 raises #UD (a real Skylake-X runs it): the
#   binaries are built with LLVM's `prefer-no-gather`, so the compiler's own
#   vectorised loops use no gathers (the kernels' one explicit gather is unchanged);
# - the Debian build has the debugger in: a command file says `c` (continue).
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
here="$root/scripts/avx512-emu"
work="${DECODA_EMU_DIR:-$root/target/avx512-emu}"
mkdir -p "$work"
cd "$work"
# the hash of the sources this run builds, taken before it builds them
built="$("$here/sources.sh")"

SUDO=""
if [ "$(id -u)" != 0 ]; then SUDO="sudo"; fi
need=()
command -v bochs >/dev/null || need+=(bochs bochsbios vgabios)
command -v genisoimage >/dev/null || need+=(genisoimage)
[ -f /usr/lib/ISOLINUX/isolinux.bin ] || need+=(isolinux)
[ -f /usr/lib/syslinux/modules/bios/ldlinux.c32 ] || need+=(syslinux-common)
command -v cpio >/dev/null || need+=(cpio)
if [ "${#need[@]}" -gt 0 ]; then
  echo "== installing ${need[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need[@]}" >/dev/null
fi

if [ ! -f vmlinuz ]; then
  kernel_pkg() {
    apt-cache depends linux-image-cloud-amd64 2>/dev/null |
      awk '/Depends: linux-image-/ { print $2; exit }'
  }
  pkg="$(kernel_pkg)"
  if [ -z "$pkg" ]; then
    $SUDO apt-get update -qq
    pkg="$(kernel_pkg)"
  fi
  echo "== downloading the kernel ($pkg)"
  rm -rf kernel ./*.deb
  apt-get download "$pkg" 2>/dev/null
  dpkg-deb -x ./*.deb kernel
  cp kernel/boot/vmlinuz-* vmlinuz
fi

echo "== building the test binaries (static, no compiler-made gathers)"
json="$(cd "$root" && RUSTFLAGS="-C target-feature=+crt-static,+prefer-no-gather" \
  cargo test --release -p decoda --lib --test=suite --no-run \
  --target x86_64-unknown-linux-gnu --target-dir "$work/target" --message-format=json)"
exe() { # the test executable of one target: `lib` or a test's name
  printf '%s\n' "$json" | python3 -c '
import json, sys
for line in sys.stdin:
    m = json.loads(line)
    t = m.get("target", {})
    if m.get("executable") and t.get("name") == sys.argv[1] and sys.argv[2] in t.get("kind", []):
        print(m["executable"])' "$@"
}

rm -rf rd && mkdir -p rd
gcc -O2 -static -o rd/init "$here/init.c"
strip -o rd/lib "$(exe decoda lib)"
strip -o rd/suite "$(exe suite test)"
run=(--test-threads=1)
if [ "$#" -gt 0 ]; then
  echo "/lib ${run[*]} $*" > rd/cmds
else
  # What the AVX-512 kernels change, at a size emulation finishes in minutes: every
  # kernel against its scalar loop, the sampler's stages against the reference, the
  # contract's suite on one thread, and parity at V = 131072 and at the edges.
  cat > rd/cmds <<EOF
/lib ${run[*]} cpu::kernels::tests cpu::tests::one_pass_draw_edge_rows cpu::tests::partial_walk cpu::tests::peeled_walk cpu::tests::pruned_walk cpu::tests::whole_row_draw cpu::tests::top_k_with_history cpu::tests::wide_kept_sets cpu::tests::coarse_normaliser_defers_unclear_cuts
/suite ${run[*]} conformance_cpu::fast_one_thread:: --skip distribution_chi_square
/suite ${run[*]} fast_vs_reference::large_vocab_parity fast_vs_reference::top_p_one_pass_edge_rows fast_vs_reference::top_k_one_pass_edge_rows
EOF
fi
(cd rd && find . | cpio -o -H newc --quiet | gzip -1 > ../initrd.gz)

rm -rf iso && mkdir -p iso/isolinux
cp /usr/lib/ISOLINUX/isolinux.bin /usr/lib/syslinux/modules/bios/ldlinux.c32 iso/isolinux/
cp vmlinuz initrd.gz iso/
# CPUID bits cleared: 124 APERF/MPERF, 321 XSAVEC, 323 XSAVES, 515 PKU, 516 OSPKE.
cat > iso/isolinux/isolinux.cfg <<EOF
DEFAULT t
PROMPT 0
TIMEOUT 0
LABEL t
  KERNEL /vmlinuz
  APPEND initrd=/initrd.gz console=ttyS0,115200 quiet panic=-1 mitigations=off idle=halt clearcpuid=124,321,323,515,516
EOF
genisoimage -quiet -o boot.iso -b isolinux/isolinux.bin -c isolinux/boot.cat \
  -no-emul-boot -boot-load-size 4 -boot-info-table -J -R iso

cat > bochsrc <<EOF
megs: 1024
cpu: model=corei7_skylake_x, count=1, ips=20000000, reset_on_triple_fault=0
romimage: file=/usr/share/bochs/BIOS-bochs-latest
vgaromimage: file=/usr/share/vgabios/vgabios.bin
ata0-master: type=cdrom, path=boot.iso, status=inserted
boot: cdrom
com1: enabled=1, mode=file, dev=serial.txt
display_library: rfb, options="timeout=0"
log: bochs.log
panic: action=fatal
clock: sync=none, time0=local
EOF
echo c > debugger.rc
rm -f serial.txt
echo "== booting in Bochs ($(wc -l < rd/cmds) test commands; the console follows)"
# (in the C locale: Bochs 2.7 aborts with "buffer overflow detected" under LANG=C.UTF-8)
LANG=C LC_ALL=C timeout "${DECODA_EMU_TIMEOUT:-2400}" bochs -q -f bochsrc -rc debugger.rc < /dev/null > bochs.out 2>&1 &
pid=$!
# the guest's console as it comes (only the lines of the tests and of init.c)
tail -n +1 -F serial.txt 2>/dev/null | grep --line-buffered -a -E '^(EMU:|test |thread |  left|assertion|test result)' &
tailer=$!
wait "$pid" || true
sleep 1
kill "$tailer" 2>/dev/null || true
if grep -a -q 'EMU: done: .* all passed' serial.txt; then
  grep -a -q 'EMU: cpuid avx512f=1 avx512dq=1 avx512bw=1 avx512vl=1' serial.txt || {
    echo "AVX-512 was not detected in the emulated machine" >&2
    exit 1
  }
  echo "== AVX-512 tests passed under emulation"
  if [ "$#" -eq 0 ]; then
    # the default set passed on these sources: .ci/run skips the emulation until they
    # change (not written when they changed while the run went on: those were not built)
    if [ "$("$here/sources.sh")" = "$built" ]; then
      echo "$built" > "$here/checked"
      echo "== wrote scripts/avx512-emu/checked ($built)"
    else
      echo "== the sources changed during the run: scripts/avx512-emu/checked not written" >&2
    fi
  fi
  exit 0
fi
echo "AVX-512 emulation: the tests failed or did not finish (see $work/serial.txt, bochs.log)" >&2
tail -n 40 serial.txt >&2 || true
exit 1
