"""What ``status`` and ``check`` answer, as one pipeline, each hop once.

1. :mod:`.records`: in the interpreter that trains (a fresh child, :mod:`tpu_closure_fix.verify.fresh`), one
   record per known call site, read from live objects;
2. :mod:`.payload`: what that interpreter sends back across the process boundary (its facts, its start-up
   hook's answer, the records), received as :class:`.payload.Evidence` by the process that asked;
3. :mod:`.decide`: the one outcome of ``status`` and of ``check`` (``check``'s self-tests only add evidence);
4. :mod:`.render`: the one renderer, text and JSON; :mod:`.sync_line` says what the zero-code sync check
   will do in the training process.

(Named ``outcome`` rather than ``status``: ``tpu_closure_fix.status`` is the public function.)
"""
