#!/usr/bin/env bash
# report_on_failure.sh BUILD_DIR
# A reload that fails half-way (a compressed HDF5 chunk corrupted on disk, found
# when the reader reaches it) still writes --report: the error, the parameters
# that may have changed, and every rank's CRC-32s as they stand. Checked against
# two runs that load each version whole: a parameter not named holds version 1's
# bytes on every rank; one named holds version 1's or version 2's whole, except
# on each rank at most the two that the failed bucket's first byte cuts (a
# tensor split between buckets, and a fused parameter whose tensors lie on both
# sides: q_proj and v_proj around o_proj in the file), which may hold a mix; and
# some named ones hold version 2's. With --atomic nothing is named and
# everything is version 1.
set -euo pipefail
build=$1
here="$(cd "$(dirname "$0")" && pwd)"
launch="$here/../launch/mpirun.sh"
work=$(mktemp -d /tmp/tpreload-report-XXXXXX)
trap 'rm -rf "$work"' EXIT
cat > "$work/config.json" <<'JSON'
{"architectures": ["LlamaForCausalLM"], "hidden_size": 256, "intermediate_size": 512,
 "num_hidden_layers": 4, "num_attention_heads": 8, "num_key_value_heads": 4,
 "vocab_size": 1000, "torch_dtype": "bfloat16"}
JSON
"$build/reload_ckpt" generate --config "$work/config.json" --out "$work/v1" --seed 1 > /dev/null
"$build/reload_ckpt" generate --config "$work/config.json" --out "$work/v2" --seed 2 \
  --format hdf5 --gzip 1 > /dev/null
"$launch" 2 "$build/reload_runner" --quiet --model "$work/v1" --report "$work/v1.json" > /dev/null
"$launch" 2 "$build/reload_runner" --quiet --model "$work/v2" --report "$work/v2.json" > /dev/null
/usr/bin/python3 - "$work/v2/model.h5" <<'PY'
import os, sys
path = sys.argv[1]
with open(path, "r+b") as f:  # 4 KiB of garbage 70% into the file: inside a late chunk
    f.seek(int(os.path.getsize(path) * 0.7))
    f.write(b"\xff" * 4096)
PY
for mode in default atomic; do
  extra=()
  [ "$mode" = atomic ] && extra=(--atomic)
  set +e
  # 1 MiB buckets: the 5.7 MB model in several, so that earlier ones are applied
  # before the reader reaches the corrupted chunk.
  "$launch" 2 "$build/reload_runner" --quiet --model "$work/v1" --weights "$work/v2" \
    --bucket-mb 1 --report "$work/$mode.json" "${extra[@]}" > "$work/$mode.out" 2>&1
  status=$?
  set -e
  [ "$status" -eq 1 ] || { cat "$work/$mode.out"; echo "report: FAIL: $mode exit status $status, not 1"; exit 1; }
  /usr/bin/python3 - "$mode" "$work/$mode.json" "$work/v1.json" "$work/v2.json" <<'PY'
import json, sys
mode, failed, v1, v2 = sys.argv[1], *[json.load(open(p)) for p in sys.argv[2:]]
def fail(why):
    sys.exit("report: FAIL: %s: %s" % (mode, why))
if "model.h5" not in failed.get("error", ""):
    fail("the error does not name the file: %r" % failed.get("error"))
# How the failed reload ran: the documented defaults (scatter, one reader).
settings = {k: failed.get(k) for k in ("format", "distribution", "readers", "atomic")}
if settings != {"format": "checkpoint", "distribution": "scatter", "readers": "one",
                "atomic": mode == "atomic"}:
    fail("the report does not say how the reload ran: %s" % settings)
named = set(failed["possibly_changed"])
if mode == "atomic" and named:
    fail("an atomic reload named changed parameters: %s" % sorted(named))
if mode == "default" and not named:
    fail("a reload that failed half-way named no parameter")
whole_v2 = 0
for rank, (got, one, two) in enumerate(zip(failed["ranks"], v1["ranks"], v2["ranks"])):
    mixed = []
    for name, p in got["params"].items():
        a, b = one["params"][name]["crc32"], two["params"][name]["crc32"]
        if p["crc32"] != a and name not in named:
            fail("rank %d: %s changed and is not named" % (rank, name))
        if p["crc32"] not in (a, b):
            mixed.append(name)
        whole_v2 += name in named and p["crc32"] == b and a != b
    if len(mixed) > 2:
        fail("rank %d: %d parameters hold neither version whole (at most 2 can straddle the "
             "failed bucket): %s" % (rank, len(mixed), sorted(mixed)))
if mode == "default" and not whole_v2:
    fail("no named parameter holds version 2: the reload wrote nothing it names")
changed = sum(p["crc32"] != one["params"][n]["crc32"]
              for got, one in zip(failed["ranks"], v1["ranks"]) for n, p in got["params"].items())
print("%s: exit 1, %d named, %d parameter copies changed, the rest version 1" %
      (mode, len(named), changed))
PY
done
echo "report: PASS"
