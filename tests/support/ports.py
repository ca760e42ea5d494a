"""Rendezvous ports for the replica runs, safe when two matrix workers run targets side by side.

A port found free, released, and bound again by a replica seconds later can meanwhile be handed
to another process: the kernel gives ports of its ephemeral range to every ``connect()`` and
``bind(0)`` (the other worker's gloo connections make many). So the ports come from below that
range, where the kernel never hands one out, in a block of their own per matrix worker
(``TPU_CLOSURE_FIX_PORT_BLOCK``, set by scripts/matrix.py), so the two workers never pick the
same one. Where the ephemeral range cannot be read, or the block would reach into it, the kernel
chooses (``bind(0)``), as a single worker always could.
"""
import os
import socket

BLOCK_VARIABLE = "TPU_CLOSURE_FIX_PORT_BLOCK"
BLOCKS_START = 20000
BLOCK_SIZE = 1000
_picks = 0


def ephemeral_low(path="/proc/sys/net/ipv4/ip_local_port_range"):
    """The first port of the kernel's ephemeral range, or None where it cannot be read."""
    try:
        with open(path) as handle:
            return int(handle.read().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def block_range(block):
    """The ports of one worker's block: ``range(first, first + BLOCK_SIZE)``."""
    first = BLOCKS_START + block * BLOCK_SIZE
    return range(first, first + BLOCK_SIZE)


def free_port(block=None, offset=None):
    """A port on 127.0.0.1 nothing listens on now, from ``block`` (default: the worker's, else 0).

    Tries the block's ports from ``offset`` on (default: this process's pid plus the picks so
    far, so that consecutive runs and processes start apart), skipping ports in use."""
    if block is None:
        block = int(os.environ.get(BLOCK_VARIABLE, "0"))
    ports = block_range(block)
    low = ephemeral_low()
    if low is None or ports[-1] >= low:
        return _kernel_port()
    global _picks
    if offset is None:
        offset = os.getpid() + _picks
    for step in range(BLOCK_SIZE):
        port = ports[(offset + step) % BLOCK_SIZE]
        if _bindable(port):
            _picks += 1
            return port
    raise AssertionError("no free port in %d..%d" % (ports[0], ports[-1]))


def free_ports(count, block=None):
    """``count`` distinct ports from :func:`free_port`, for servers that bind only later (each pick is free
    now, so two picks before any bind may name the same port)."""
    picked = []
    for _ in range(count * BLOCK_SIZE):
        port = free_port(block)
        if port not in picked:
            picked.append(port)
            if len(picked) == count:
                return picked
    raise AssertionError("no %d distinct free ports" % count)


def _bindable(port):
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:  # in use (a replica's store still closing, or another program)
            return False
    return True


def _kernel_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]
