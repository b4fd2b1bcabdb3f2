# Sourced by .device/ab.sh and .device/decode_ab.sh: the files under $AB_OLD (older copies at the same relative
# paths) and `ab_use old|new`, which copies that side's versions into the tree ("new": this tree's own, saved
# under /tmp/ab_new first). End with `ab_use new`.
ab_files=$(cd "$AB_OLD" && find . -type f)
mkdir -p /tmp/ab_new && for f in $ab_files; do mkdir -p /tmp/ab_new/$(dirname $f); cp $f /tmp/ab_new/$f; done
ab_use() {
  local src=/tmp/ab_new; [ "$1" = old ] && src=$AB_OLD
  for f in $ab_files; do cp $src/$f $f; done
}
