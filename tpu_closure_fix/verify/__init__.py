"""Verification: does the code in place reduce gradients after the closure?  Used by ``check``.

The patching core (engine, sites, fixes, the integrations' ``__init__``/``fixes``) never imports
this package.  Parts:

* :mod:`.child`: run Python children with a hard timeout and read the JSON result each leaves;
* :mod:`.table`: which rows of the call-site table are in place here, and their drivers;
* :mod:`.driver`: what every integration's driver shares: the tiny model, data, optimizer and
  closure of one step and what they record, the graph step's scaffolding, the reference order;
* :mod:`.events`: the event-order self-test (recording stand-in for torch_xla, no hardware);
* :mod:`.graph`: the graph check on real torch_xla (collectives traced, never executed);
* :mod:`.ir`: analysis of torch_xla's pending IR (pure text);
* :mod:`.xla_api`: torch_xla calls found by feature detection.

Adding an integration's driver: create ``tpu_closure_fix/integrations/<name>/verify.py`` with

* ``event_step(target, torch, xm, events)``: one optimizer step through ``target`` (a
  :class:`.table.Target`: the table row matched for the loaded release and the live class and
  method it names) with the recording stand-in ``xm`` as torch_xla; append ``forward``,
  ``backward`` and ``step`` to ``events``;
* ``graph_step(target, harness)``: build one step on ``harness.device`` and return a
  :class:`.driver.TracedStep` (see :class:`.graph.Harness` for the helpers);
* ``reference_fix(target)``: put the upstream fix order, by hand, in place of the row's method
  (the graph check's harness self-test).

Each takes its model, batch, optimizer and closure from :mod:`.driver` (``recording_step``;
``graph_training``, ``traced_closure``, ``traced_step``; ``xla_reduced_closure``) and adds only how its
framework reaches the row's method.  The rows' ``integration`` field selects the driver; nothing else
needs registering.
"""
