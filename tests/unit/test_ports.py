"""The replica runs' rendezvous ports: per matrix worker a block of its own, below the ephemeral range."""
import importlib.util
import os
import socket

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
spec = importlib.util.spec_from_file_location("tcf_ports", os.path.join(os.path.dirname(HERE), "support", "ports.py"))
ports = importlib.util.module_from_spec(spec)
spec.loader.exec_module(ports)

LOW = ports.ephemeral_low()
needs_range = pytest.mark.skipif(LOW is None or LOW <= ports.block_range(1)[-1],
                                 reason="no readable ephemeral range above the blocks")


@needs_range
def test_each_worker_picks_from_its_own_block_below_the_ephemeral_range(monkeypatch):
    picked = {}
    for block in (0, 1):
        monkeypatch.setenv(ports.BLOCK_VARIABLE, str(block))
        picked[block] = {ports.free_port() for _ in range(20)}
        assert picked[block] <= set(ports.block_range(block))
        assert max(picked[block]) < LOW
    assert not picked[0] & picked[1]


@needs_range
def test_a_port_in_use_is_skipped():
    first = ports.block_range(3)[0]
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", first + 5))
        busy.listen(1)
        assert ports.free_port(block=3, offset=5) == first + 6
    assert ports.free_port(block=3, offset=5) == first + 5


def test_the_kernel_chooses_where_the_range_is_unknown(monkeypatch):
    monkeypatch.setattr(ports, "ephemeral_low", lambda: None)
    port = ports.free_port(block=0)
    assert port not in ports.block_range(0)


def test_the_kernel_chooses_where_the_block_would_reach_the_ephemeral_range(monkeypatch):
    monkeypatch.setattr(ports, "ephemeral_low", lambda: ports.block_range(2)[500])
    assert ports.free_port(block=2) not in ports.block_range(2)
    assert ports.free_port(block=1) in ports.block_range(1)
