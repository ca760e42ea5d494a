#!/usr/bin/env bash
# Mutation testing of the decision code with mutmut 3 (not part of CI; minutes per file).
#
#   scripts/mutation.sh                 # every file of the map below
#   scripts/mutation.sh engine identity # only these (names of the map)
#   MUTATION_CHILDREN=1 scripts/mutation.sh engine   # fewer parallel workers (default 2)
#
# Each source file is mutated alone, in its own copy of the tree under .cache/mutation-work/<name>/
# (mutmut 3 writes its mutants/ folder next to the config it reads: the repository's own files,
# pyproject.toml included, are never touched), against the unit tests that exercise it.  Prints, per
# file, killed / (total - equivalent) where the equivalent mutants are the ones docs/testing.md lists
# (scripts/mutation_equivalent.txt, one mutant name a line), and writes the survivors to
# .cache/mutation-work/<name>/survivors.txt (`mutmut show <name>` in that folder shows each diff).
#
# mutmut 3.8.1 runs in its own venv, .cache/mutation-venv, made from .cache/venv's python with
# --system-site-packages (torch, pytest, hypothesis, wrapt, packaging come from there).
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BASE_PY="${BASE_PY:-$REPO/.cache/venv/bin/python}"
VENV="$REPO/.cache/mutation-venv"
WORK="$REPO/.cache/mutation-work"
CHILDREN="${MUTATION_CHILDREN:-2}"
EQUIVALENT="$REPO/scripts/mutation_equivalent.txt"

# name | file to mutate | unit tests that exercise it
MAP="
engine|tpu_closure_fix/engine.py|tests/unit/test_engine_rules.py tests/unit/test_engine_lifecycle.py
identity|tpu_closure_fix/identity.py|tests/unit/test_identity.py tests/unit/test_identity_edges.py tests/unit/test_identity_scopes.py
fingerprint|tpu_closure_fix/synccheck/fingerprint.py|tests/unit/test_fingerprint_vector.py tests/unit/test_fingerprint_dtypes.py tests/unit/test_fingerprint_xxh3.py
compare|tpu_closure_fix/synccheck/compare.py|tests/unit/test_compare_run.py tests/unit/test_synccheck_rules.py tests/unit/test_synccheck_inprocess.py
callback|tpu_closure_fix/synccheck/callback.py|tests/unit/test_callback_schedule.py tests/unit/test_synccheck_inprocess.py tests/unit/test_synccheck_rules.py
decisions|tpu_closure_fix/synccheck/decisions.py|tests/unit/test_synccheck_rules.py
report|tpu_closure_fix/synccheck/report.py|tests/unit/test_synccheck_said.py tests/unit/test_synccheck_rules.py tests/unit/test_synccheck_inprocess.py tests/unit/test_synchook.py
calls|tpu_closure_fix/calls.py|tests/unit/test_calls.py tests/unit/test_calls_edges.py
evidence|tpu_closure_fix/synccheck/evidence.py|tests/unit/test_synccheck_evidence.py
launch|tpu_closure_fix/synccheck/launch.py|tests/unit/test_synccheck_host.py tests/unit/test_launcher.py
comm|tpu_closure_fix/synccheck/comm.py|tests/unit/test_synccheck_rules.py tests/unit/test_synccheck_blocking.py
worker|tpu_closure_fix/synccheck/worker.py|tests/unit/test_synccheck_worker.py tests/unit/test_synccheck_blocking.py
"

if [ ! -x "$VENV/bin/mutmut" ]; then
    "$BASE_PY" -m venv --system-site-packages "$VENV"
    "$VENV/bin/pip" install -q "mutmut==3.8.1"
fi
# --system-site-packages reaches the base interpreter's packages, not .cache/venv's (itself a venv): a .pth
# file puts .cache/venv's site-packages (torch, pytest, hypothesis, wrapt, packaging) on the path too.
base_site="$("$BASE_PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
venv_site="$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
echo "$base_site" > "$venv_site/tpu-closure-fix-base-venv.pth"
"$VENV/bin/python" -c 'import torch, wrapt, packaging, pytest' 2>/dev/null || {
    echo "the mutation venv cannot import torch, wrapt, packaging and pytest; see $VENV"; exit 2; }

# The thread-rank tests (tests/support/thread_ranks.py) wait this long for a rank that never comes to an
# exchange: a mutant that breaks one rank's part of a check fails in seconds, not half a minute.
export TPU_CLOSURE_FIX_THREAD_RANK_TIMEOUT="${TPU_CLOSURE_FIX_THREAD_RANK_TIMEOUT:-5}"

wanted=("$@")
selected() {
    [ "${#wanted[@]}" -eq 0 ] && return 0
    local w
    for w in "${wanted[@]}"; do [ "$w" = "$1" ] && return 0; done
    return 1
}

summary=()
while IFS='|' read -r name file tests; do
    [ -n "$name" ] || continue
    selected "$name" || continue
    dir="$WORK/$name"
    rm -rf "$dir"
    mkdir -p "$dir/tests"
    cp -a "$REPO/tpu_closure_fix" "$dir/"
    cp -a "$REPO/tests/support" "$dir/tests/"
    mkdir -p "$dir/tests/unit"
    cp "$REPO"/tests/unit/*.py "$dir/tests/unit/"
    mkdir -p "$dir/scripts"
    cp "$REPO/scripts/fingerprints.py" "$dir/scripts/"  # test_identity.py tests the script's use of identity
    find "$dir" -name __pycache__ -prune -exec rm -rf {} +
    {
        echo "[mutmut]"
        echo "source_paths = tpu_closure_fix/"
        echo "only_mutate = $file"
        echo "pytest_add_cli_args = -p no:cacheprovider -q -m \"not slow\""
        echo "pytest_add_cli_args_test_selection ="
        for t in $tests; do echo "    $t"; done
        echo "also_copy ="
        echo "    scripts/"
        echo "use_git_change_detection = false"
        echo "timeout_multiplier = 2.0"
        echo "timeout_constant = 3.0"
        echo
        echo "[tool:pytest]"
        echo "pythonpath = tests"
        echo "markers ="
        echo "    slow: spawns interpreters or builds wheels"
    } > "$dir/setup.cfg"
    echo "== $name: mutating $file with: $tests"
    ( cd "$dir" && env -u PYTHONPATH "$VENV/bin/mutmut" run --max-children "$CHILDREN" >"$dir/run.log" 2>&1 ) || {
        echo "mutmut failed for $name; see $dir/run.log"; tail -20 "$dir/run.log"; continue; }
    ( cd "$dir" && env -u PYTHONPATH "$VENV/bin/mutmut" results --all true >"$dir/results.txt" 2>&1 ) || true
    line="$(cd "$dir" && "$VENV/bin/python" - "$dir/results.txt" "$EQUIVALENT" "$name" "$dir/survivors.txt" <<'EOF'
import sys
results, equivalent_file, name, survivors_file = sys.argv[1:]
equivalent = set()
try:
    with open(equivalent_file) as handle:
        equivalent = {line.split("#")[0].strip() for line in handle if line.split("#")[0].strip()}
except OSError:
    pass
status = {}
with open(results) as handle:
    for line in handle:
        if ": " in line:
            mutant, verdict = line.strip().rsplit(": ", 1)
            status[mutant] = verdict
killed = sum(1 for v in status.values() if v in ("killed", "timeout"))
equiv = sum(1 for m, v in status.items() if m in equivalent and v not in ("killed", "timeout"))
survivors = sorted(m for m, v in status.items() if v not in ("killed", "timeout") and m not in equivalent)
# each survivor with its changed lines, read from the mutated copy (one process: faster than `mutmut show`)
import ast, difflib, os
functions = {}
for folder, _, files in os.walk("mutants/tpu_closure_fix"):
    for filename in files:
        if filename.endswith(".py"):
            path = os.path.join(folder, filename)
            text = open(path).read()
            lines = text.split("\n")
            for node in ast.walk(ast.parse(text)):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and "__mutmut_" in node.name:
                    functions[node.name] = lines[node.lineno:node.end_lineno]  # the body, without the def line
def changed(mutant):
    short = mutant.rsplit(".", 1)[1]
    orig = functions.get(short.rsplit("__mutmut_", 1)[0] + "__mutmut_orig")
    body = functions.get(short)
    if orig is None or body is None:
        return ["    (source not found)"]
    return ["    " + line for line in difflib.unified_diff(orig, body, lineterm="", n=0)
            if line[:1] in "+-" and not line.startswith(("+++", "---"))]
with open(survivors_file, "w") as handle:
    for m in survivors:
        handle.write("%s: %s\n" % (m, status[m]))
        handle.write("".join(line + "\n" for line in changed(m)))
denominator = len(status) - equiv
score = 100.0 * killed / denominator if denominator else 0.0
print("%-12s killed %d / (total %d - equivalent %d) = %.1f%%; %d surviving (survivors.txt)"
      % (name, killed, len(status), equiv, score, len(survivors)))
EOF
)"
    echo "$line"
    summary+=("$line")
done <<< "$MAP"

echo
echo "mutation scores at $(git -C "$REPO" rev-parse --short HEAD) (working tree may differ):"
for line in "${summary[@]}"; do echo "  $line"; done
