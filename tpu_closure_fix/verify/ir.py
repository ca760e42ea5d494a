"""Analysis of torch_xla's pending IR after one traced training step (pure text, no torch needed).

The graph check dumps the pending graph of the parameters (``_get_xla_tensors_text``; HLO from
``_get_xla_tensors_hlo``) and asks three questions of it, in :func:`analyze_ir`: how many
gradient all-reduces (``xla::cross_replica_sum``, HLO ``all-reduce``) the step holds, whether
their operands are computed by this step's backward pass, and whether the parameter update
consumes their output.  The traced model is Linear + MSE; torch_xla keeps the autograd node names
when lowering (``aten::mse_loss_backward``...), which is what "from the backward" looks for.
"""
import re
from typing import Any, Dict, List, Sequence

__all__ = ["ALL_REDUCE_IR", "ALL_REDUCE_HLO", "analyze_ir", "short_line"]

ALL_REDUCE_IR = "xla::cross_replica_sum"
ALL_REDUCE_HLO = re.compile(r"\ball-reduce(?:-start)?\(")

_NODE_RE = re.compile(r"^\s*%(\d+) = (.*)$")
_OP_RE = re.compile(r"^(?:\([^=]*?\)|\S+)\s+([A-Za-z_][\w:.]*)\((.*?)\)(?:,|$)")
_REF_RE = re.compile(r"%(\d+)(?:\.(\d+))?")
# autograd nodes lowered by torch_xla keep their names: the traced model is Linear + MSE, whose
# backward starts with aten::mse_loss_backward (weight grad: mm/permute, bias grad: sum/view)
_BACKWARD_OP = re.compile(r"_backward\b")


def _parse_ir(text: str) -> Dict[int, Dict[str, Any]]:
    nodes: Dict[int, Dict[str, Any]] = {}
    for line in text.splitlines():
        m = _NODE_RE.match(line)
        if not m:
            continue
        idx, rest = int(m.group(1)), m.group(2)
        om = _OP_RE.match(rest)
        op, args = (om.group(1), om.group(2)) if om else ("?", "")
        operands = [(int(a), int(b) if b is not None else None) for a, b in _REF_RE.findall(args)
                    for a, b in [(a, b or None)]]
        root = re.search(r"ROOT=(\d+)", rest)
        nodes[idx] = {"op": op, "operands": operands, "line": line.strip(),
                      "root": int(root.group(1)) if root else None}
    return nodes


def _ancestors(nodes: Dict[int, Dict[str, Any]], start: Sequence[int]) -> set:
    seen: set = set()
    stack = list(start)
    while stack:
        n = stack.pop()
        if n in seen or n not in nodes:
            continue
        seen.add(n)
        stack.extend(o for o, _ in nodes[n]["operands"])
    return seen


def _users(nodes: Dict[int, Dict[str, Any]]) -> Dict[int, List[int]]:
    users: Dict[int, List[int]] = {}
    for idx, node in nodes.items():
        for o, _ in node["operands"]:
            users.setdefault(o, []).append(idx)
    return users


def analyze_ir(ir_text: str, hlo_text: str = "", loss_ir_text: str = "") -> Dict[str, Any]:
    """Analyse the pending graph of the parameters after one traced step.

    * ``all_reduce_count``: ``xla::cross_replica_sum`` nodes in the graph.
    * ``operands_from_backward``: every tensor operand of every all-reduce (the token, its last
      operand, excluded) is computed in this graph (not a materialised ``device_data`` gradient
      of an earlier step) and has an autograd backward op (``aten::*_backward``) among its
      ancestors; when ``loss_ir_text`` (the loss of the traced step) is given, the ancestry must
      also share forward ops (``addmm``...) with it.
    * ``update_consumes_all_reduce``: every parameter root (``ROOT=i``) has an all-reduce among
      its ancestors, and the last op producing it (the SGD update) reaches the all-reduce.
    """
    nodes = _parse_ir(ir_text)
    users = _users(nodes)
    ar = [i for i, n in nodes.items() if n["op"] == ALL_REDUCE_IR]
    roots = {n["root"]: i for i, n in nodes.items() if n["root"] is not None}
    res: Dict[str, Any] = {
        "all_reduce_count": len(ar),
        "hlo_all_reduce_count": len(ALL_REDUCE_HLO.findall(hlo_text)) if hlo_text else None,
        "param_roots": len(roots),
        "operands_from_backward": False,
        "update_consumes_all_reduce": False,
        "all_reduce_operands": [],
        "update_ops": [],
        "excerpt": [],
    }
    loss_ops = set()
    if loss_ir_text:
        loss_ops = {n["op"] for n in _parse_ir(loss_ir_text).values()} - {"xla::device_data", "prim::Constant"}
    if ar:
        operand_ok = []
        for a in ar:
            operands = [o for o, _ in nodes[a]["operands"]]
            nout = re.search(r"num_outputs=(\d+)", nodes[a]["line"])
            if nout and int(nout.group(1)) == len(operands) and len(operands) > 1:
                operands = operands[:-1]  # the last operand/output is the collective's token
            for o in operands:
                on = nodes.get(o)
                if on is None:
                    operand_ok.append(False)
                    continue
                anc = _ancestors(nodes, [o])
                bw = [x for x in anc if _BACKWARD_OP.search(nodes[x]["op"])]
                ops = {nodes[x]["op"] for x in anc}
                has_loss = bool(loss_ops & ops) if loss_ops else True
                # a materialised gradient of an earlier step would be a bare xla::device_data
                ok = on["op"] != "xla::device_data" and bool(bw) and has_loss
                operand_ok.append(ok)
                res["all_reduce_operands"].append({"node": o, "op": on["op"], "from_backward": ok,
                                                   "backward_ops": sorted({nodes[x]["op"] for x in bw})})
        res["operands_from_backward"] = bool(operand_ok) and all(operand_ok)
        consumed = []
        ar_set = set(ar)
        for r, idx in sorted(roots.items()):
            anc = _ancestors(nodes, [idx])
            # which all-reduce outputs (%ar.k) feed this parameter's new value
            outs = sorted({f"%{o}.{k}" if k is not None else f"%{o}" for x in anc | {idx}
                           for o, k in nodes[x]["operands"] if o in ar_set})
            hit = bool(outs) and nodes[idx]["op"] != ALL_REDUCE_IR
            consumed.append(hit)
            res["update_ops"].append({"root": r, "node": idx, "op": nodes[idx]["op"],
                                      "consumes_all_reduce": hit, "all_reduce_outputs_used": outs})
        res["update_consumes_all_reduce"] = bool(consumed) and all(consumed)
    else:
        res["update_ops"] = [{"root": r, "node": idx, "op": nodes[idx]["op"], "consumes_all_reduce": False}
                             for r, idx in sorted(roots.items())]
    # every parameter's new value is computed from this step's backward (true in both orders:
    # with the fix through the all-reduce, without it from the local gradient)
    bw_all = {i for i, n in nodes.items() if _BACKWARD_OP.search(n["op"])}
    root_anc = {idx: _ancestors(nodes, [idx]) for idx in roots.values()}
    res["update_from_backward"] = bool(roots) and all(anc & bw_all for anc in root_anc.values())
    # excerpt: the chain backward op -> (all-reduce) -> update, i.e. nodes that descend from a
    # backward op and are ancestors of a parameter root
    desc: set = set()
    frontier = list(bw_all)
    while frontier:
        u = frontier.pop()
        if u in desc:
            continue
        desc.add(u)
        frontier.extend(users.get(u, []))
    on_chain = desc & set().union(*root_anc.values()) if root_anc else set()
    res["excerpt"] = [nodes[i]["line"] for i in sorted(on_chain)]
    res["excerpt"] = [short_line(line) for line in res["excerpt"]][:30]
    return res


def short_line(line: str, width: int = 220) -> str:
    line = re.sub(r", location=[^,]*(?=,|$)", "", line)
    return line if len(line) <= width else line[: width - 3] + "..."
