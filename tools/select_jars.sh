#!/usr/bin/env bash
# Copy into $3 the jars of $1 that PySpark ($2) does not already ship: two versions of one
# library on Spark's classpath is a classic source of NoSuchMethodError at run time.
set -euo pipefail
src=$1; pyspark_jars=$2; dest=$3
mkdir -p "$dest"
for jar in "$src"/*.jar; do
  name=$(basename "$jar")
  base=$(echo "${name%.jar}" | sed -E 's/-[0-9][0-9.]*([-.][A-Za-z0-9]+)*$//')
  case "$base" in commons-logging|shims) continue ;; esac   # PySpark has jcl-over-slf4j and RoaringBitmap 1.x
  compgen -G "$pyspark_jars/${base}-[0-9]*" >/dev/null || cp "$jar" "$dest/"
done
