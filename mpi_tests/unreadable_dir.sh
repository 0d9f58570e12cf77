#!/usr/bin/env bash
# unreadable_dir.sh BUILD_DIR
# --weights names a directory its user may not read: every rank gives the same
# error naming it, exit status 1, within seconds. Run as an unprivileged user
# (root reads everything): as root, the job runs as nobody through setpriv.
set -uo pipefail
build=$(cd "$1" && pwd)
work=$(mktemp -d /tmp/tpreload-unreadable-XXXXXX)
trap 'chmod -R u+rwx "$work"; rm -rf "$work"' EXIT
chmod 755 "$work"
cat > "$work/config.json" <<'JSON'
{"architectures": ["LlamaForCausalLM"], "hidden_size": 64, "intermediate_size": 128,
 "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
 "vocab_size": 100, "torch_dtype": "bfloat16"}
JSON
"$build/reload_ckpt" generate --config "$work/config.json" --out "$work/model" > /dev/null || exit 1
cp -r "$work/model" "$work/weights"
chmod -R a+rX "$work/model"
chmod 000 "$work/weights"
as=()
if [ "$(id -u)" -eq 0 ]; then
  command -v setpriv > /dev/null || { echo "unreadable: setpriv missing"; exit 77; }
  as=(setpriv --reuid=65534 --regid=65534 --clear-groups env HOME=/tmp)
  "${as[@]}" test -x "$build/reload_runner" ||
    { echo "unreadable: nobody cannot run $build/reload_runner (a build under a private home?)"; exit 77; }
fi
start=$SECONDS
out=$(timeout 60 "${as[@]}" mpiexec -n 2 --oversubscribe --bind-to none \
  "$build/reload_runner" --model "$work/model" --weights "$work/weights" 2>&1)
status=$?
echo "$out"
[ "$status" -eq 1 ] || { echo "unreadable: FAIL: exit status $status, not 1"; exit 1; }
for r in 0 1; do
  grep -q "\[rank $r/2\] \[error\] opening the weight source failed on rank 0/2: cannot list directory '$work/weights': Permission denied" <<<"$out" ||
    { echo "unreadable: FAIL: rank $r did not give the error"; exit 1; }
done
echo "unreadable: PASS in $((SECONDS - start)) s"
