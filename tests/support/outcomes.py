"""The one decision of ``status`` and ``check`` driven from a payload, as the CLI drives it.

``status_outcome(payload, error)`` is what ``status`` answers for a fresh interpreter's payload (or its error);
``check_outcome(payload, events, graph, ...)`` is what ``check`` answers with its self-tests' results. The
zero-code sync check's line is composed from an empty environment unless ``environ`` is given.
"""
from tpu_closure_fix.outcome import decide, payload as _payload


def evidence(payload, error=None, environ=None):
    return _payload.receive(payload, error, asked="/venv/bin/python", environ=environ or {})


def status_outcome(payload, error=None, environ=None):
    return decide.decide(evidence(payload, error, environ))


def check_outcome(payload, events, graph=False, graph_unavailable=None, error=None):
    """``check``'s outcome: the status rules alone where they decide before the self-tests, else with them."""
    given = evidence(payload, error)
    first = decide.decide(given)
    if first.rule in decide.BEFORE_SELF_TESTS:
        return first
    return decide.decide(given, decide.SelfTests(events, graph, graph_unavailable))
