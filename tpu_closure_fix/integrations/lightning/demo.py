"""``tpu-closure-fix demo``: see the bug and the fix on simulated TPU replicas, on CPU.

Trains a small MLP on scikit-learn's bundled digits data set (``load_digits``, no
download) with pytorch-lightning's real ``Trainer`` and ``TPUPrecisionPlugin``
(the plugin holding the buggy ``xm.optimizer_step`` call) on N replica processes
joined by ``torch.distributed`` over gloo. There is no TPU: each replica uses
:mod:`tpu_closure_fix._simulated_xla`, a CPU simulation of torch_xla's
``xla_model`` whose ``reduce_gradients`` averages gradients across the replica
processes (the shim never uses it). Every replica reads its own shard of the
data, as in data-parallel training.

The training runs twice: with the shim disabled (``TPU_CLOSURE_FIX=0``) and
enabled. It prints a table (final training loss and test accuracy per replica,
the largest parameter difference between replicas, SyncCheck's verdict), and
writes into ``--out``: ``demo.png`` (training loss and max parameter divergence
per step for both runs), TensorBoard scalars (``tensorboard/``), ``results.json``
and the replicas' logs.

Needs the ``demo`` extra (matplotlib, scikit-learn, tensorboardX, tqdm, pytorch-lightning 1.8.6 with its
pins), so it runs either in a venv of its own or from a clone, where ``bash scripts/demo.sh`` keeps all of it
in the clone's ``.cache/`` and installs nothing into the environment::

    python -m venv demo-venv && demo-venv/bin/pip install ".[demo]"    # in a clone: a venv of its own
    demo-venv/bin/tpu-closure-fix demo --out demo-out
"""

#: What to run instead when something is missing: commands that exist and change nothing in this environment.
HOW_TO_RUN = ("in a clone of the repository, `bash scripts/demo.sh --out demo-out` runs it with what it needs in "
              "the clone's .cache/ (nothing is installed here); or make a venv of its own: `python -m venv demo-venv "
              "&& demo-venv/bin/pip install \".[demo]\"` in the clone")
import json
import os
import socket
import sys
import time

SEED = 0
TEST_SIZE = 297  # of the 1797 digits; the other 1500 are split between the replicas
HIDDEN = 64


def add_parser(subparsers):
    p = subparsers.add_parser(
        "demo", help="train on simulated TPU replicas without and with the shim; table, PNG, TensorBoard",
        description=__doc__.split("\n\n")[1].replace("\n", " "))
    p.add_argument("--replicas", type=int, default=2, help="simulated replicas (processes over gloo); default 2")
    p.add_argument("--epochs", type=int, default=8, help="epochs over each replica's shard; default 8")
    p.add_argument("--batch-size", type=int, default=32, help="per-replica batch size; default 32")
    p.add_argument("--lr", type=float, default=0.05, help="SGD learning rate (momentum 0.9); default 0.05")
    p.add_argument("--synccheck-every", type=int, default=20,
                   help="attach tpu_closure_fix.SyncCheck(every=N) to both runs; 0: do not; default 20")
    p.add_argument("--out", default="tpu-closure-fix-demo", help="output folder; default ./tpu-closure-fix-demo")
    p.add_argument("--png", help="write the picture here instead of OUT/demo.png")
    p.add_argument("--smoke", action="store_true", help="1 epoch of 6 steps (for tests)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=run)
    return p


# --------------------------------------------------------------------------- parent
def _missing_dependencies():
    from importlib.util import find_spec

    return [dist for module, dist in (("matplotlib", "matplotlib"), ("sklearn", "scikit-learn"),
                                      ("tensorboardX", "tensorboardX"), ("tqdm", "tqdm"))
            if find_spec(module) is None]


def _lightning_problem():
    """None when an affected pytorch-lightning (1.5-1.8) is installed, else what is wrong.
    Reads the distribution's metadata: the parent never imports Lightning (the replicas do)."""
    from importlib import metadata

    from packaging.version import Version

    try:
        found = metadata.version("pytorch-lightning")
    except metadata.PackageNotFoundError:
        return "pytorch-lightning is not installed"
    if not Version("1.5") <= Version(found) < Version("1.9"):
        return ("the demo needs an affected pytorch-lightning with TPUPrecisionPlugin (1.5-1.8; made with 1.8.6), "
                "found %s" % (found,))
    return None


#: Hard limit for one run of the replicas (both shim modes run one after the other).
REPLICA_TIMEOUT = 600


def _free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _run_replicas(args, shim, out, bar):
    """Run the replicas of one run (hard timeout), follow rank 0's progress lines, return rank -> result.

    Each replica's stderr is kept in ``<out>/logs/shim<0|1>-rank<N>.log``."""
    from ...verify.child import python_command, run_children, safe_environment

    port = _free_port()
    logs = os.path.join(out, "logs")
    os.makedirs(logs, exist_ok=True)
    env = safe_environment()
    env.update({"TPU_CLOSURE_FIX": "1" if shim else "0", "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore",
                "PYTHONUNBUFFERED": "1"})
    configs = [{"rank": rank, "world": args.replicas, "port": port, "epochs": args.epochs, "batch": args.batch_size,
                "lr": args.lr, "smoke": args.smoke, "synccheck": args.synccheck_every,
                "result": os.path.join(logs, "shim%d-rank%d.json" % (int(shim), rank))}
               for rank in range(args.replicas)]

    def progress(index, line):  # rank 0 prints "step N/TOTAL" per optimizer step
        if index == 0 and line.startswith("step ") and bar is not None:
            done, total = line.split()[1].split("/")
            bar.total = int(total)
            bar.update(int(done) - bar.n)

    runs = run_children([python_command("tpu_closure_fix.integrations.lightning.demo", "--worker", json.dumps(cfg)) for cfg in configs],
                        REPLICA_TIMEOUT, env=env, result_files=[cfg["result"] for cfg in configs], on_line=progress)
    results = {}
    for cfg, run in zip(configs, runs):
        log = os.path.join(logs, "shim%d-rank%d.log" % (int(shim), cfg["rank"]))
        with open(log, "w") as handle:
            handle.write(run.stderr)
        if not run.ok:
            raise RuntimeError("replica %d (shim %s) %s; its log %s ends with:\n%s"
                               % (cfg["rank"], "on" if shim else "off", run.error, log, run.stderr_tail(3000)))
        results[cfg["rank"]] = run.payload
    return results


def _summarize(results):
    ranks = sorted(results)
    steps = len(results[ranks[0]]["loss"])
    mean_loss = [sum(results[r]["loss"][i] for r in ranks) / len(ranks) for i in range(steps)]
    return {
        "steps": steps,
        "shim": results[ranks[0]]["shim"],
        "mean_loss": mean_loss,
        "divergence": results[ranks[0]]["divergence"],
        "max_divergence": max(results[ranks[0]]["divergence"] or [0.0]),
        "final_divergence": results[ranks[0]]["final_divergence"],
        "replicas": {r: {"final_loss": results[r]["final_loss"], "accuracy": results[r]["accuracy"]} for r in ranks},
        "synccheck": results[ranks[0]]["synccheck"],
        "lightning": results[ranks[0]]["lightning"],
    }


def _title(runs, replicas):
    return ("%s Trainer + TPUPrecisionPlugin, %d simulated TPU replicas (processes over gloo), load_digits, %d steps"
            % (runs[0][1]["lightning"], replicas, runs[0][1]["steps"]))


def _report(runs, replicas):
    """What the demo prints of its runs (``[(label, summary)]``): the title, wrapped at 120 columns, and the table
    (docs/demo.md shows it, regenerated from docs/demo-results.json by scripts/doc_samples.py)."""
    import textwrap

    lines = textwrap.wrap(_title(runs, replicas), 120, subsequent_indent="    ") + _table(runs).split("\n")
    return "\n".join(line.rstrip() for line in lines)


def _table(runs):
    lines = ["%-9s %-8s %12s %14s %18s  %s" % ("run", "replica", "final loss", "test accuracy",
                                                "max divergence", "SyncCheck")]
    for label, s in runs:
        checks = s["synccheck"]
        if checks is None:
            verdict = "off"
        elif checks["warned_steps"]:
            verdict = "warned at step %s" % ", ".join(str(x) for x in checks["warned_steps"][:3]) + (
                ", ..." if len(checks["warned_steps"]) > 3 else "")
        else:
            verdict = "silent (%d checks)" % checks["checks"]
        for i, (rank, rep) in enumerate(sorted(s["replicas"].items(), key=lambda kv: int(kv[0]))):
            lines.append("%-9s %-8s %12.4f %13.1f%% %18s  %s" % (
                label if i == 0 else "", rank, rep["final_loss"], 100.0 * rep["accuracy"],
                ("%.3g" % s["max_divergence"]) if i == 0 else "", verdict if i == 0 else ""))
    return "\n".join(lines)


def _plot(runs, path, title):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colors = {"shim off": "tab:red", "shim on": "tab:blue"}
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.2))
    for label, s in runs:
        xs = list(range(1, s["steps"] + 1))
        acc = sum(r["accuracy"] for r in s["replicas"].values()) / len(s["replicas"])
        ax1.plot(xs, s["mean_loss"], color=colors[label], lw=1.2,
                 label="%s (mean test acc. %.1f%%)" % (label, 100 * acc))
        ax2.plot(xs, s["divergence"], color=colors[label], lw=1.6,
                 label="%s (max %.3g)" % (label, s["max_divergence"]))
    ax1.set(xlabel="optimizer step", ylabel="training loss (mean over replicas)", title="Training loss")
    ax2.set(xlabel="optimizer step", ylabel="max |θ_i − θ_j| over parameters, replicas i, j",
            title="Parameter divergence between replicas")
    for ax in (ax1, ax2):
        ax.grid(alpha=0.3)
        ax.legend()
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _tensorboard(runs, folder):
    from tensorboardX import SummaryWriter

    for label, s in runs:
        writer = SummaryWriter(os.path.join(folder, label.replace(" ", "_")))
        for i, (loss, div) in enumerate(zip(s["mean_loss"], s["divergence"]), 1):
            writer.add_scalar("train/loss", loss, i)
            writer.add_scalar("train/max_param_divergence", div, i)
        for rank, rep in s["replicas"].items():
            writer.add_scalar("final/test_accuracy_replica%s" % rank, rep["accuracy"], s["steps"])
        writer.close()


def run(args):
    missing = _missing_dependencies()
    if missing:
        print("tpu-closure-fix demo needs %s, not installed here: %s" % (", ".join(missing), HOW_TO_RUN),
              file=sys.stderr)
        return 2
    problem = _lightning_problem()
    if problem:
        print("tpu-closure-fix demo: %s; %s" % (problem, HOW_TO_RUN), file=sys.stderr)
        return 2
    if args.replicas < 2:
        print("tpu-closure-fix demo: --replicas must be >= 2 (one replica has nothing to diverge from)",
              file=sys.stderr)
        return 2
    from tqdm import tqdm

    out = os.path.abspath(args.out)
    os.makedirs(out, exist_ok=True)
    started = time.time()
    runs = []
    for shim in (False, True):
        label = "shim on" if shim else "shim off"
        bar = None if args.no_progress else tqdm(total=None, desc="%-8s" % label, unit="step", file=sys.stderr,
                                                 dynamic_ncols=True)
        try:
            runs.append((label, _summarize(_run_replicas(args, shim, out, bar))))
        finally:
            if bar is not None:
                bar.close()
    title = _title(runs, args.replicas)
    png = os.path.abspath(args.png) if args.png else os.path.join(out, "demo.png")
    if os.path.dirname(png):
        os.makedirs(os.path.dirname(png), exist_ok=True)
    _plot(runs, png, title)
    _tensorboard(runs, os.path.join(out, "tensorboard"))
    with open(os.path.join(out, "results.json"), "w") as handle:
        json.dump({label: s for label, s in runs}, handle, indent=1)
    print(_report(runs, args.replicas))
    off, on = runs[0][1], runs[1][1]
    print("\nWithout the shim each replica steps with its own gradients: parameters differ by up to %.3g. "
          "With it they are %s." % (off["max_divergence"], "bitwise identical" if on["max_divergence"] == 0
                                      else "within %.3g" % on["max_divergence"]))
    print("Wrote %s, TensorBoard scalars in %s (tensorboard --logdir %s), %s  [%.0f s]"
          % (png, os.path.join(out, "tensorboard"), os.path.join(out, "tensorboard"),
             os.path.join(out, "results.json"), time.time() - started))
    return 0


# --------------------------------------------------------------------------- replica process
def _worker(cfg):
    import warnings

    warnings.simplefilter("ignore")
    import logging

    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    rank, world = cfg["rank"], cfg["world"]
    dist.init_process_group("gloo", init_method="tcp://127.0.0.1:%d" % cfg["port"], rank=rank, world_size=world)

    import pytorch_lightning as pl  # Lightning first, as in a user's script ...

    for name in ("pytorch_lightning", "lightning_lite"):
        logging.getLogger(name).setLevel(logging.ERROR)
    from ... import _simulated_xla

    _simulated_xla.install(world, rank)  # ... then the simulated torch_xla takes torch_xla's place
    from pytorch_lightning.plugins.precision import tpu as tpu_precision

    tpu_precision._XLA_AVAILABLE = True  # the plugin's constructor refuses to run without torch_xla
    import tpu_closure_fix  # TPU_CLOSURE_FIX (set by the parent) decides, as for a user
    from ...synccheck import SyncCheck

    from sklearn.datasets import load_digits

    digits = load_digits()
    gen = torch.Generator().manual_seed(SEED)
    order = torch.randperm(len(digits.target), generator=gen)
    x = torch.tensor(digits.data, dtype=torch.float32)[order] / 16.0
    y = torch.tensor(digits.target, dtype=torch.long)[order]
    x_test, y_test = x[:TEST_SIZE], y[:TEST_SIZE]
    x_train, y_train = x[TEST_SIZE:][rank::world], y[TEST_SIZE:][rank::world]  # this replica's shard
    data = torch.utils.data.TensorDataset(x_train, y_train)
    loader = torch.utils.data.DataLoader(data, batch_size=cfg["batch"], shuffle=True, drop_last=True,
                                         generator=torch.Generator().manual_seed(SEED + rank))
    limit = 6 if cfg["smoke"] else None
    epochs = 1 if cfg["smoke"] else cfg["epochs"]
    total = epochs * (min(limit, len(loader)) if limit else len(loader))

    class Classifier(pl.LightningModule):
        def __init__(self):
            super().__init__()
            torch.manual_seed(SEED)  # the same initial model on every replica
            self.net = torch.nn.Sequential(torch.nn.Linear(64, HIDDEN), torch.nn.ReLU(),
                                           torch.nn.Linear(HIDDEN, 10))

        def forward(self, inputs):
            return self.net(inputs)

        def training_step(self, batch, batch_idx):
            inputs, target = batch
            return torch.nn.functional.cross_entropy(self(inputs), target)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=cfg["lr"], momentum=0.9)

    record = {"loss": [], "divergence": []}

    def max_divergence(module):
        flat = torch.cat([p.detach().reshape(-1) for p in module.parameters()])
        both = torch.cat([flat, -flat])
        dist.all_reduce(both, op=dist.ReduceOp.MAX)  # [max over replicas, -min over replicas]
        return float((both[:flat.numel()] + both[flat.numel():]).max())

    class Metrics(pl.Callback):
        def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx, *rest):
            loss = outputs["loss"] if isinstance(outputs, dict) else outputs
            record["loss"].append(float(loss))
            record["divergence"].append(max_divergence(module))
            if rank == 0:
                print("step %d/%d" % (len(record["loss"]), total), flush=True)

    warned = []
    callbacks = [Metrics()]
    if cfg["synccheck"]:
        sync = SyncCheck(every=cfg["synccheck"], on_divergence=lambda report: warned.append(report.step))
        callbacks.append(sync)
    model = Classifier()
    trainer = pl.Trainer(max_epochs=epochs, limit_train_batches=limit, accelerator="cpu", devices=1,
                         logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, num_sanity_val_steps=0,
                         plugins=[tpu_precision.TPUPrecisionPlugin()], callbacks=callbacks)
    trainer.fit(model, train_dataloaders=loader)

    with torch.no_grad():
        accuracy = float((model(x_test).argmax(dim=1) == y_test).float().mean())
    per_epoch = total // epochs
    result = {
        "rank": rank,
        "shim": tpu_closure_fix.is_enabled(),
        "lightning": "pytorch-lightning %s" % pl.__version__,
        "loss": record["loss"],
        "divergence": record["divergence"],
        "final_loss": sum(record["loss"][-per_epoch:]) / max(1, len(record["loss"][-per_epoch:])),
        "final_divergence": max_divergence(model),
        "accuracy": accuracy,
        "synccheck": ({"checks": len(sync.reports), "warned_steps": warned} if cfg["synccheck"] else None),
    }
    with open(cfg["result"], "w") as handle:
        json.dump(result, handle)
    dist.barrier()
    # Leave without tearing gloo down: its threads can abort the interpreter at exit ("terminate called
    # without an active exception"); the result is written and every replica is past the barrier.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _main(argv=None):
    import argparse

    parser = argparse.ArgumentParser(prog="tpu-closure-fix")
    add_parser(parser.add_subparsers(dest="command"))
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--worker"]:
        return _worker(json.loads(argv[1]))
    args = parser.parse_args(["demo"] + argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(_main())
