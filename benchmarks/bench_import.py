"""Cost of the shim on ``import pytorch_lightning`` (pytorch-lightning 1.8.6 target): enabled vs disabled.

``--framework accelerate`` measures ``import accelerate`` (accelerate 1.15.0 target) instead;
``--framework optimum-neuron`` measures ``import optimum.neuron.accelerate.optimizer``
(optimum-neuron 0.4.5 target; it imports optimum.neuron, accelerate, transformers' lazy
module) with the tests' stand-ins for torch_xla and the Neuron SDK installed first,
untimed (tests/support/neuron_sdk.py: that module needs the SDK to import).

Each pair starts two interpreters of the base venv (.cache/venv, where the wheel's
.pth auto-enable is installed) with the framework's target on PYTHONPATH, one with
``TPU_CLOSURE_FIX=1`` and one with ``TPU_CLOSURE_FIX=0`` (order alternating), and
times ``import pytorch_lightning`` inside the process (start-up excluded). The
enabled arm includes the shim's whole activation: wrapt, the engine, the post-import
hooks and patching the call sites. Goal: <= 2 % added.

Whole-import pairs of a 3-5 s import are noisy on a shared 2-core machine (their IQR
is hundreds of ms), so the script also measures the shim's own share in-process, in
enabled runs only: the self time of the modules that only the enabled run loads (the shim's, wrapt's
and whatever they import that Lightning would not), the time the post-import hooks
spend patching, and the shim's ``sys.meta_path`` finders (each import asks them
first: their per-lookup cost times the imports Lightning does).

    python benchmarks/bench_import.py            # 30 pairs (after 1 warm-up pair)
    python benchmarks/bench_import.py --smoke    # 2 pairs (CI)
    python benchmarks/bench_import.py --framework accelerate   # import accelerate (1.15.0 target)
"""
import argparse
import json
import os
import statistics
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _stats import summary  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
#: framework -> (target install command, target folder, the import timed, module, class, method patched)
FRAMEWORKS = {
    "lightning": ("pytorch-lightning==1.8.6", "pytorch-lightning-1.8.6", "pytorch_lightning",
                  "pytorch_lightning.plugins.precision.tpu", "TPUPrecisionPlugin", "optimizer_step"),
    "accelerate": ("accelerate==1.15.0", "accelerate-1.15.0", "accelerate", "accelerate.optimizer",
                   "AcceleratedOptimizer", "step"),
    "optimum-neuron": ("optimum-neuron==0.4.5", "optimum-neuron-0.4.5", "optimum.neuron.accelerate.optimizer",
                       "optimum.neuron.accelerate.optimizer", "NeuronAcceleratedOptimizer", "step"),
}
#: framework -> code run before the timed import (not timed): what the module needs to import at all.
PREAMBLES = {
    "optimum-neuron": "import sys; sys.path.insert(0, %r); from support import neuron_sdk; neuron_sdk.install(1, 0); "
                      % os.path.join(REPO, "tests"),
}
TARGET = IMPORT = CODE = PREAMBLE = None


def select(framework):
    """Point TARGET / IMPORT / CODE / SHARE_CODE at ``framework`` (see FRAMEWORKS)."""
    global TARGET, IMPORT, CODE, SHARE_CODE, PREAMBLE
    _, folder, IMPORT, module, cls, method = FRAMEWORKS[framework]
    TARGET = os.path.join(REPO, ".cache", "targets", folder)
    PREAMBLE = PREAMBLES.get(framework, "")
    CODE = ("import time, warnings; warnings.simplefilter('ignore'); " + PREAMBLE + "t = time.perf_counter(); "
            "import %s; t = time.perf_counter() - t; import sys; m = sys.modules.get(%r); "
            "print(t, type(vars(m.%s)[%r]).__name__)" % (IMPORT, module, cls, method))
    SHARE_CODE = _SHARE_TEMPLATE.replace("import pytorch_lightning", "import " + IMPORT).replace(
        "warnings.simplefilter(\"ignore\")\n", "warnings.simplefilter(\"ignore\")\n" + PREAMBLE + "\n", 1)


_SHARE_TEMPLATE = r"""
import json, sys, time, warnings
warnings.simplefilter("ignore")
before = set(sys.modules)
import tpu_closure_fix.engine as engine  # activates the shim, as the .pth watcher would at this import
spent = [0.0]
_patch_module = engine._patch_module
def timed_patch_module(module, *args):  # what each post-import hook does for a call-site module
    start = time.perf_counter()
    try:
        return _patch_module(module, *args)
    finally:
        spent[0] += time.perf_counter() - start
engine._patch_module = timed_patch_module
start = time.perf_counter()
import pytorch_lightning
total = time.perf_counter() - start
loaded = sorted(sys.modules)  # by the end of the timed import (status() below imports more)
imported = len(set(sys.modules) - before)
# the shim's finders sit at the front of sys.meta_path: every import asks them first
from wrapt import importer
ours = [f for f in sys.meta_path if type(f).__module__.split(".")[0] in ("wrapt", "tpu_closure_fix",
                                                                          "_tpu_closure_fix_startup")]
names = [n for n in sys.modules if n not in importer._post_import_hooks]
start = time.perf_counter()
for finder in ours:
    for name in names:
        finder.find_spec(name, None)
per_import = (time.perf_counter() - start) / len(names)
patched = sum(r["verdict"] == "patched" for r in __import__("tpu_closure_fix").status())
print(json.dumps({"total": total, "patch": spent[0], "per_import": per_import, "imported": imported,
                  "finders": len(ours), "patched": patched, "modules": loaded}))
"""


def importtime_self(stderr):
    """{module: self seconds} from -X importtime output."""
    out = {}
    for line in stderr.splitlines():
        if line.startswith("import time:") and "cumulative" not in line:
            own, _cumulative, name = line[len("import time:"):].split("|", 2)
            out[name.strip()] = int(own) / 1e6
    return out


def share_once(python, disabled_modules):
    """One enabled run: the shim's own share of ``import pytorch_lightning``, in seconds, by part."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH",)}
    env["PYTHONPATH"] = TARGET
    env["TPU_CLOSURE_FIX"] = "1"
    proc = subprocess.run([python, "-X", "importtime", "-c", SHARE_CODE], env=env, capture_output=True, text=True,
                          check=True)
    run = json.loads(proc.stdout.strip().splitlines()[-1])
    assert run["patched"] > 0, "nothing patched: %s" % proc.stdout[-500:]
    extra = set(run["modules"]) - disabled_modules  # loaded only because the shim is on
    own = importtime_self(proc.stderr)
    return {"total": run["total"], "imports": sum(own.get(m, 0.0) for m in extra), "extra_modules": len(extra),
            "patch": run["patch"], "finders": run["per_import"] * run["imported"]}


def modules_when_disabled(python):
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH",)}
    env["PYTHONPATH"] = TARGET
    env["TPU_CLOSURE_FIX"] = "0"
    code = "import json, sys, warnings; warnings.simplefilter('ignore'); " + PREAMBLE + "import %s; " \
           "print(json.dumps(sorted(sys.modules)))" % IMPORT
    out = subprocess.run([python, "-c", code], env=env, capture_output=True, text=True, check=True).stdout
    return set(json.loads(out.strip().splitlines()[-1]))


def once(python, enabled):
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH",)}
    env["PYTHONPATH"] = TARGET
    env["TPU_CLOSURE_FIX"] = "1" if enabled else "0"
    out = subprocess.run([python, "-c", CODE], env=env, capture_output=True, text=True, check=True).stdout.split()
    assert (out[1] == "FunctionWrapper") == enabled, out  # the arm really is what it claims
    return float(out[0])


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=30)
    parser.add_argument("--share-runs", type=int, default=10, help="enabled runs for the in-process share")
    parser.add_argument("--python", default=os.path.join(REPO, ".cache", "venv", "bin", "python"))
    parser.add_argument("--smoke", action="store_true", help="2 pairs, for CI (figures not meaningful)")
    parser.add_argument("--framework", choices=sorted(FRAMEWORKS), default="lightning",
                        help="whose import to time (default lightning: pytorch-lightning 1.8.6)")
    args = parser.parse_args(argv)
    select(args.framework)
    if not os.path.isdir(TARGET):
        sys.exit("install the target first: python scripts/targets.py install %s" % FRAMEWORKS[args.framework][0])
    pairs = 2 if args.smoke else args.pairs
    off, on = [], []
    for i in range(pairs + 1):
        results = {}
        for arm in ((True, False) if i % 2 else (False, True)):
            results[arm] = once(args.python, arm)
        if i >= 1:
            off.append(results[False])
            on.append(results[True])
    print("%d pairs" % pairs)
    summary("import %s (%s)" % (IMPORT, FRAMEWORKS[args.framework][0]), off, on, "ms", scale=1e3,
            goal=None if args.smoke else 2.0, relative=True)
    disabled_modules = modules_when_disabled(args.python)
    runs = [share_once(args.python, disabled_modules) for _ in range(2 if args.smoke else args.share_runs)]
    med = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
    share = med["imports"] + med["patch"] + med["finders"]
    base = statistics.median(off)
    line = ("in-process share, n=%d (medians): imports only the shim brings (%d modules, -X importtime self) %.1f ms"
            " + patching in the hooks %.2f ms + its meta_path finders %.2f ms = %.1f ms = %.2f%% of the %.0f ms import"
            % (len(runs), med["extra_modules"], med["imports"] * 1e3, med["patch"] * 1e3, med["finders"] * 1e3,
               share * 1e3, 100.0 * share / base, base * 1e3))
    if not args.smoke:
        line += "  goal <= 2.0: %s" % ("met" if 100.0 * share / base <= 2.0 else "NOT met")
    print(line, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
