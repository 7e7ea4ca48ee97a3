# Sourced by the scripts of a lent NVIDIA machine (device_run.sh, decode_run.sh), from
# the repository root there: the Vulkan loader from the carried .gl/ packages, the
# driver's ICD, a runtime directory, $OUT, and the CLI unpacked to $D.
OUT=${OUT:-/tmp/decoda-gpu}
mkdir -p "$OUT"
for f in .gl/*.deb; do [ -f "$f" ] && dpkg -x "$f" /; done
ldconfig
icd=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
[ -f "$icd" ] && export VK_DRIVER_FILES=$icd
export XDG_RUNTIME_DIR=/tmp/xdg PYTHONUNBUFFERED=1
mkdir -p -m 700 "$XDG_RUNTIME_DIR"
D=/tmp/decoda
xz -dc .gpu/decoda.xz > "$D" && chmod +x "$D"
step() { echo "== $(date -u +%T) $*"; }
