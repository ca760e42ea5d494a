"""What the first-check rule decided for each tensor, kept with the tensor for its whole life.

The zero-code check arms on jobs that declared nothing, so a tensor no layout places (rule 7 of
:mod:`.groups`) is decided at its own first look: bitwise equal over the world there, it is a replica from
then on (:data:`REPLICA`: any later difference is a divergence); different there, it is set aside
(:data:`APART`: a rank-local scale, a pipeline stage, an optimizer-state shard) and never compared again.
The decision belongs to the tensor, not to the optimizer that first stepped it: a new optimizer, a
re-created one, a second one over the same parameters inherit it, and one tensor set aside takes no other
out of the comparison.

Every rank decides alike: a decision is read and written only while a check is exchanged, and a rank's
exchanges run in the same order on every rank (:mod:`.worker`), on the same reduced vector and the same
gathered hashes. The explicit calls (``compare_replicas``, ``check_sync``, the callback) are the user's
declaration and neither read nor write it.

Keyed by ``id(tensor)`` with a weak reference that clears the entry when the tensor dies (a new tensor at
the same address starts undecided); a tensor's ``__eq__`` is elementwise, so a ``WeakKeyDictionary`` cannot
hold tensors.
"""
import threading
import weakref

#: Seen bitwise equal over the world at its first look: compared over the world for its whole life.
REPLICA = "replica"
#: Different at its first look with nothing declared: not compared again.
APART = "apart"

_decided = {}  # id(tensor) -> (weak reference to it, REPLICA or APART)
_lock = threading.Lock()


def of(tensor):
    """The decision kept for ``tensor``: :data:`REPLICA`, :data:`APART` or None (not looked at yet)."""
    entry = _decided.get(id(tensor))
    if entry is None or entry[0]() is not tensor:
        return None
    return entry[1]


def record(tensor, decision):
    """Keep ``decision`` for ``tensor``; the first one stands (a tensor set aside is never compared again, so
    nothing can see it equal later; a replica's later difference is a divergence, not a new decision)."""
    if decision not in (REPLICA, APART):
        raise ValueError("decision must be %r or %r; got %r" % (REPLICA, APART, decision))
    key = id(tensor)
    with _lock:
        entry = _decided.get(key)
        if entry is not None and entry[0]() is tensor:
            return
        try:
            ref = weakref.ref(tensor, lambda _, key=key: _forget(key))
        except TypeError:  # not weakly referenceable: nothing to keep it by
            return
        _decided[key] = (ref, decision)


def _forget(key):
    with _lock:
        entry = _decided.get(key)
        if entry is not None and entry[0]() is None:
            del _decided[key]


def clear():
    """Forget every decision (the tests' fresh start)."""
    with _lock:
        _decided.clear()
