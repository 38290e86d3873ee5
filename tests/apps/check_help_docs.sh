#!/bin/bash
# Every flag an app's --help lists is described somewhere in docs/ or README.md,
# so help and docs cannot drift apart silently.   check_help_docs.sh BUILD SRC
set -uo pipefail
BUILD=$1; SRC=$2; fail=0
for app in pretrain_gpt pretrain_bert pretrain_t5 generate_text evaluate text_generation_server preprocess_data convert_checkpoint \
           schedule_sim merge_datasets finetune; do
  [ -x "$BUILD/apps/$app" ] || { echo "FAILED: $BUILD/apps/$app not built"; fail=1; continue; }
  flags=$("$BUILD/apps/$app" --help 2>/dev/null | grep -oE "^ +(-[a-z] \[ )?--[A-Za-z0-9_-]+" | grep -oE -- "--[A-Za-z0-9_-]+" | sort -u)
  [ -n "$flags" ] || { echo "FAILED: $app --help listed no flags"; fail=1; continue; }
  missing=""
  for f in $flags; do
    [ "$f" = "--help" ] && continue
    grep -rqE -- "${f}([^A-Za-z0-9_-]|\$)" "$SRC/docs" "$SRC/README.md" || missing="$missing $f"
  done
  if [ -n "$missing" ]; then echo "FAILED: $app: not in docs/ or README.md:$missing"; fail=1
  else echo "ok: $app ($(echo "$flags" | wc -l) flags documented)"; fi
done
exit $fail
