"""The public :func:`tpu_closure_fix.status`: one record per known call site of this process
(:func:`tpu_closure_fix.outcome.records.status`; ``status`` and ``check`` are :mod:`tpu_closure_fix.outcome`)."""
from .outcome.records import status

__all__ = ["status"]
