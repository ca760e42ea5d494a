"""A job whose ranks are children forked by ``torch.multiprocessing.start_processes(start_method="fork")``, as
accelerate's debug and notebook launchers and Lightning's ``ddp_fork`` start them: each child ends with
``os._exit`` when its function returns (no interpreter exit, no ``atexit``).

``python -m support.fork_job --port P [--variant diverge]``: two children join a gloo group, train 20 steps with
the gradients all-reduced; with ``diverge`` rank 1 alone applies a different update at the last step (step 20).
The zero-code check is armed by the environment the test gives (every 10 steps): the check at step 20 is answered
only if the children's end answers it. Its report goes to stderr (the children inherit the parent's).
"""
import argparse


def rank_main(rank, world, port, variant):
    import types

    import torch
    import torch.distributed as dist

    from support.pod_scenarios import _twenty_steps

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method="tcp://127.0.0.1:%d" % port, rank=rank, world_size=world)
    _twenty_steps(types.SimpleNamespace(rank=rank, world=world, variant=variant))
    # the function returns: multiprocessing ends the child with os._exit


def main(argv=None):
    parser = argparse.ArgumentParser(description="a two-rank job of forked children")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--variant", default="")
    args = parser.parse_args(argv)
    import torch.multiprocessing as mp

    mp.start_processes(rank_main, args=(2, args.port, args.variant), nprocs=2, start_method="fork")
    print("JOB DONE", flush=True)


if __name__ == "__main__":
    main()
