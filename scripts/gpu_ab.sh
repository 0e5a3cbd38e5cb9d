#!/usr/bin/env bash
# A/B of a kernel change on one GPU: the working tree ("new") against a reference
# checkout ("ref"), built side by side and measured in the same device call, so
# both see one GPU state (issue 22's "same bits, same speed" check).
#   git archive --prefix=.ref/ <commit> | tar x     # the reference tree, carried as .ref (or REF=dir)
#   bash scripts/gpu_ab.sh [build|hashes|bench|all|moe|tests|timeline]   (default all)
# build   both trees into build/site_{new,ref} (ignored; a warm machine keeps them, so
#         a later call rebuilds incrementally)
# hashes  scripts/kernel_hashes.py with each tree, then the keys whose output bytes differ
# bench   benchmarks/loopback.py on RS_SHAPES / AG_SHAPES (8 thin and wide each by default;
#         ARMS_RS, ARMS_AG) and BWD_SHAPES (default none: the backward kernels ag_nn,
#         bulk_ag_nn and bulk_rs_nt on those shape names, each on the arms of ARMS_BWD
#         (default pull,push) it has; BWD_KERNELS to pick), then
#         benchmarks/gemm.py --layouts GEMM_LAYOUTS (default TN; empty:
#         skip, e.g. when the matmul kernels' code is unchanged), trees alternating per
#         step; prints each arm's new / ref time per shape and the geomean
# moe     benchmarks/moe.py on MOE_PRESETS (default qwen3-30b-a3b,deepseek-v3; balanced routing)
#         with MOE_ARMS (default fused,train_fused), both trees per preset; prints each arm's
#         new / ref ms and, with fused and train_fused, the backward's (their difference: the
#         backward launch and XLA's part, plus what the step's forward keeps for it, the
#         pre-activations, which the fused arm's forward-only launch does not)
# tests   pytest over TESTS (default tests/gpu; extra args go to pytest) on the new tree's
#         build, for a call that follows the A/B on a warm machine without a third build
# timeline  both trees built with KOSMOS_TRACE (build/site_{new,ref}_trace), then one traced
#         fused forward of each preset in TIMELINE (default deepseek-v3) in each tree
#         (benchmarks/moe.py --timeline; TIMELINE_ARGS=--timeline-step: a training step):
#         each role's and GEMM kind's span side by side, to say which phase a change moved
# Logs and CSVs go to $OUT/gpu_ab.tgz ($OUT default ./out). BUDGET_S bounds the benchmarks.
# Never changes clocks or resets a GPU; NVLink multicast stays off (DESIGN.md §4).
set -uo pipefail
export NCCL_NVLS_ENABLE=0 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1 CUDA_MODULE_LOADING=EAGER
export XLA_PYTHON_CLIENT_PREALLOCATE=false
step=${1:-all}
OUT=${OUT:-out}; mkdir -p "$OUT"; OUT=$(cd "$OUT" && pwd); export OUT
cd "$(dirname "$0")/.."
ROOT=$(pwd)
REF=$(cd "${REF:-.ref}" 2>/dev/null && pwd) || REF=""
PY=${PY:-python3}
BUDGET_S=${BUDGET_S:-540}
RS_SHAPES=${RS_SHAPES-8B-OProj-MBS1,8B-Down-MBS1,70B-OProj-MBS1,70B-Down-MBS1,405B-OProj-MBS1,405B-Down-MBS1,8B-Down-MBS4,70B-OProj-MBS4}
GEMM_LAYOUTS=${GEMM_LAYOUTS-TN}
AG_SHAPES=${AG_SHAPES-8B-QKV-MBS1,8B-FC1-MBS1,70B-QKV-MBS1,70B-FC1-MBS1,405B-QKV-MBS1,405B-FC1-MBS1,8B-FC1-MBS4,70B-QKV-MBS4}

# The CuTe headers come from the nvidia-cutlass wheel carried in .whl/ when not installed.
if ! $PY -c 'import cutlass_library' 2>/dev/null; then
  $PY -m pip install -q --no-index --no-deps --target /tmp/kosmos_site .whl/nvidia_cutlass-*.whl || exit 1
  export PYTHONPATH=/tmp/kosmos_site${PYTHONPATH:+:$PYTHONPATH}
fi
BASE_PATH=${PYTHONPATH:-}

build_tree() {  # $1 source tree, $2 name (a name ending _trace: a KOSMOS_TRACE build)
  $PY -m pip install -q --no-build-isolation --no-deps --upgrade --target "$ROOT/build/site_$2" "$1" \
    -Ccmake.define.KOSMOS_CUDA=on $([[ $2 == *_trace ]] && echo -Ccmake.define.KOSMOS_TRACE=ON) \
    -Cbuild-dir="$ROOT/build/ab_$2" > "$OUT/build_$2.log" 2>&1
}

in_tree() {  # $1 name, rest: a command run from that tree with its build first on the path
  local name=$1 dir; shift
  dir=$([[ $name == ref* ]] && echo "$REF" || echo "$ROOT")
  (cd "$dir" && PYTHONPATH="$ROOT/build/site_$name${BASE_PATH:+:$BASE_PATH}" "$@")
}

do_build() {  # $@: which trees (new, ref; new_trace, ref_trace)
  local t0=$SECONDS pids=() t
  for t in "$@"; do
    [[ $t == new* ]] || [ -n "$REF" ] || { echo "no reference tree: set REF (see the top of $0)"; exit 2; }
    build_tree "$([[ $t == ref* ]] && echo "$REF" || echo "$ROOT")" "$t" & pids+=($!)
  done
  for t in "$@"; do
    wait "${pids[0]}" || { echo "BUILD FAILED ($t)"; tail -40 "$OUT/build_$t.log"; exit 1; }
    pids=("${pids[@]:1}")
  done
  echo "built $* in $(( SECONDS - t0 )) s"
}

do_hashes() {
  for t in ref new; do
    in_tree $t $PY scripts/kernel_hashes.py "$OUT/hashes_$t.json" > "$OUT/hashes_$t.log" 2>&1 \
      || { echo "kernel_hashes ($t) failed"; tail -20 "$OUT/hashes_$t.log"; exit 1; }
  done
  $PY - "$OUT/hashes_ref.json" "$OUT/hashes_new.json" <<'EOF'
import json, sys
ref, new = (json.load(open(p)) for p in sys.argv[1:3])
same = [k for k in new if ref.get(k) == new[k]]
diff = [k for k in new if k in ref and ref[k] != new[k]]
print(f"hashes: {len(same)} identical, {len(diff)} differ, {len(set(new) - set(ref))} new keys, "
      f"{len(set(ref) - set(new))} keys only in ref")
for k in diff:
  print("  differs:", k)
EOF
}

loopback() {  # $1 tree, $2 kernel, $3 shapes, $4 arms, $5 seconds
  # Loopback waits are short: a hang should fail fast, not eat the budget.
  KOSMOS_TIMEOUT_MS=${KOSMOS_TIMEOUT_MS:-3000} in_tree "$1" timeout "$5" $PY benchmarks/loopback.py --kernels "$2" --shapes "$3" --arms "$4" --calls 10 --reps 3 \
    --no-gemm-cap --budget-s $(( $5 - 20 )) --out-dir "$OUT/ab_$1" --tag "_$2" > "$OUT/loopback_$2_$1.log" 2>&1
  echo "loopback $2 ($1) rc=$? at ${SECONDS}s"
}

do_bench() {
  local per=$(( (BUDGET_S - SECONDS) / 6 ))
  [ -n "$RS_SHAPES" ] && for t in ref new; do loopback $t tn_rs "$RS_SHAPES" "${ARMS_RS:-pull,push,push_fold}" $(( per * 3 / 2 )); done
  [ -n "$AG_SHAPES" ] && for t in ref new; do loopback $t ag_tn "$AG_SHAPES" "${ARMS_AG:-pull,push}" $per; done
  [ -n "${BWD_SHAPES:-}" ] && for t in ref new; do
    loopback $t "${BWD_KERNELS:-ag_nn,bulk_ag_nn,bulk_rs_nt}" "$BWD_SHAPES" "${ARMS_BWD:-pull,push}" $per
  done
  [ -n "$GEMM_LAYOUTS" ] && for t in ref new; do
    in_tree $t timeout $(( per + 40 )) $PY benchmarks/gemm.py --layouts "$GEMM_LAYOUTS" --caps "" \
      --protocol interleaved --reps 5 > "$OUT/gemm_$t.log" 2>&1
    echo "gemm $GEMM_LAYOUTS ($t) rc=$? at ${SECONDS}s"
    cp "$([ $t = ref ] && echo "$REF" || echo "$ROOT")/benchmarks/out/gemm.csv" "$OUT/ab_$t/gemm.csv" 2>/dev/null
  done
  $PY - "$OUT/ab_ref" "$OUT/ab_new" <<'EOF'
import csv, glob, math, os, sys
def rows(d, pat):
  out = {}
  for p in glob.glob(os.path.join(d, pat)):
    for r in csv.DictReader(open(p)):
      out.setdefault((r.get("kernel") or r.get("layout"), r["shape"]), []).append(r)
  return out
ref, new = (rows(d, "loopback_*.csv") for d in sys.argv[1:3])
gm = lambda v: math.exp(sum(map(math.log, v)) / len(v)) if v else float("nan")
for kernel in sorted({k for k, _ in new}):
  first = next(rs[0] for k, rs in new.items() if k[0] == kernel)
  arms = [c[:-3] for c in first if c.endswith("_ms") and not c.startswith("gemm")]
  for arm in ["gemm_full"] + arms:
    # A kernel without this arm (ag_nn has no push) leaves its cells empty.
    v = [float(new[k][0][arm + "_ms"]) / float(ref[k][0][arm + "_ms"]) for k in new
         if k[0] == kernel and k in ref and new[k][0].get(arm + "_ms") and ref[k][0].get(arm + "_ms")]
    if v:
      print(f"{kernel} {arm}: new/ref time geomean {gm(v):.4f} over {len(v)} shapes, range {min(v):.3f}-{max(v):.3f}")
gr, gn = (rows(d, "gemm.csv") for d in sys.argv[1:3])
for arm in ("kosmos", "xla_cublas"):
  v = [float(a["median_ms"]) / float(b["median_ms"]) for k in gn if k in gr
       for a in gn[k] for b in gr[k] if a["arm"] == b["arm"] == arm]
  if v:
    print(f"gemm {arm}: new/ref time geomean {gm(v):.4f} over {len(v)} shapes, range {min(v):.3f}-{max(v):.3f}")
EOF
}

# Whether more than 30 s of BUDGET_S are left for $1; if not, says so: an A/B
# needs both trees, and one the budget ends half-way must not pass unnoticed.
have_budget() {
  [ $(( BUDGET_S - SECONDS )) -gt 30 ] && return 0
  echo "$1 and later skipped: $(( BUDGET_S - SECONDS )) s of BUDGET_S left"
  return 1
}

do_moe() {
  local preset t
  for preset in $(echo "${MOE_PRESETS:-qwen3-30b-a3b,deepseek-v3}" | tr , ' '); do
    for t in ref new; do
      have_budget "moe $preset ($t)" || break 2
      in_tree $t timeout $(( BUDGET_S - SECONDS )) $PY benchmarks/moe.py --presets "$preset" --routing balanced \
        --arms "${MOE_ARMS:-fused,train_fused}" --no-append --reps 3 --settle-s 0.3 --out-dir "$OUT/ab_$t" \
        --tag "_$preset" > "$OUT/moe_${preset}_$t.log" 2>&1
      echo "moe $preset ($t) rc=$? at ${SECONDS}s"
    done
  done
  $PY - "$OUT/ab_ref" "$OUT/ab_new" <<'EOF'
import csv, glob, os, sys
def ms(d):
  out = {}
  for p in glob.glob(os.path.join(d, "moe_*.csv")):
    for r in csv.DictReader(open(p)):
      if r["status"] == "ok":
        out[(r["preset"], r["arm"])] = float(r["median_ms"])
  return out
ref, new = (ms(d) for d in sys.argv[1:3])
for preset in sorted({p for p, _ in new}):
  arms = {a: (ref.get((preset, a)), new.get((preset, a))) for p, a in new if p == preset}
  if "train_fused" in arms and "fused" in arms and None not in arms["train_fused"] + arms["fused"]:
    arms["backward"] = tuple(t - f for t, f in zip(arms["train_fused"], arms["fused"]))
  for a, (r, n) in sorted(arms.items()):
    if r and n:
      print(f"moe {preset} {a}: ref {r:.3f} ms, new {n:.3f} ms, new/ref {n / r:.4f}")
EOF
}

# The device call returns few files: everything but the summary goes into one tarball.
pack() { (cd "$OUT" && tar czf /tmp/gpu_ab.tgz --exclude=gpu_ab.tgz . && find . -mindepth 1 -delete && mv /tmp/gpu_ab.tgz .); }
trap pack EXIT
nvidia-smi --query-gpu=index,name,clocks.sm,temperature.gpu,power.draw --format=csv > "$OUT/env.log" 2>&1
do_tests() {
  shift || true
  (cd /tmp && PYTHONPATH="$ROOT/build/site_new${BASE_PATH:+:$BASE_PATH}" KOSMOS_TEST_PLATFORMS=cuda,cpu \
    timeout $(( BUDGET_S - SECONDS )) $PY -m pytest -q -p no:cacheprovider --rootdir "$ROOT" \
    $(for t in ${TESTS:-tests/gpu}; do echo "$ROOT/$t"; done) "$@" 2>&1 | tee "$OUT/pytest.log" | tail -15)
}

do_timeline() {
  local preset t
  for preset in $(echo "${TIMELINE:-deepseek-v3}" | tr , ' '); do
    for t in ref_trace new_trace; do
      have_budget "timeline $preset (${t%_trace})" || break 2
      mkdir -p "$OUT/tl_${t%_trace}"  # the PNGs (moe.py copies them into its OUT); the JSON stays in /tmp
      OUT="$OUT/tl_${t%_trace}" in_tree $t timeout $(( BUDGET_S - SECONDS )) $PY benchmarks/moe.py --timeline "$preset" \
        --routing balanced ${TIMELINE_ARGS:-} --out-dir "/tmp/tl_$t" > "$OUT/timeline_${preset}_${t%_trace}.log" 2>&1
      echo "timeline $preset (${t%_trace}) rc=$? at ${SECONDS}s"
      grep -v "^WARNING" "$OUT/timeline_${preset}_${t%_trace}.log" | tail -20
    done
  done
}

case "$step" in
  build) do_build new ref ;;
  hashes) do_build new ref; do_hashes ;;
  bench) do_build new ref; do_bench ;;
  all) do_build new ref; do_hashes; do_bench ;;
  moe) do_build new ref; do_moe ;;
  tests) do_build new; do_tests "$@" ;;
  timeline) do_build new_trace ref_trace; do_timeline ;;
  *) sed -n '2,/^# Never changes/p' "$0"; exit 2 ;;
esac
