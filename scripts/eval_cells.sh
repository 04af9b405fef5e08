# Sourced by scripts/quality_sweep.sh and scripts/walk_eval.sh: runs `kvpack eval tasks` cells, two at a time on
# one thread each, on the built-in filler and on $filler. Set before calling run_cells NAME:
#   kvpack model task out n seed filler   (exported here), cells=("name|flags" ...)
# Every cell writes $out/<filler>__<name>.json and .seconds; a cell whose .json exists is kept (resumable), a
# cell that fails leaves no .json. scripts/quality_sweep_summary.py $out prints the tables.
run_one() {  # filler|name|flags
  IFS='|' read -r f name flags <<<"$1"
  local fl=() file="$out/${f}__${name}"
  [[ $f == austen ]] && fl=(--filler "$filler")
  [[ -s "$file.json" ]] && return 0
  local t0=$SECONDS
  # shellcheck disable=SC2086
  if "$kvpack" eval tasks -m "$model" --ctx 2048 --task "$task" --n "$n" --seed "$seed" -t 1 --json -q --answer-only \
       "${fl[@]}" $flags > "$file.tmp"; then
    mv "$file.tmp" "$file.json"
    echo $((SECONDS - t0)) > "$file.seconds"
  fi
  echo "$f $name: $((SECONDS - t0)) s" >&2
}

run_cells() {  # NAME: the run's name in the closing line and in $out/NAME.seconds
  local jobs=() f c t0=$SECONDS
  mkdir -p "$out"
  for f in builtin austen; do
    for c in "${cells[@]}"; do jobs+=("$f|$c"); done
  done
  export -f run_one
  export kvpack model task out n seed filler
  printf '%s\n' "${jobs[@]}" | xargs -P 2 -I{} bash -c 'run_one "$@"' _ {}
  echo "$1: ${#jobs[@]} cells in $((SECONDS - t0)) s" | tee "$out/$1.seconds" >&2
}
