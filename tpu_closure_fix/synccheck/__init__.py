"""SyncCheck: catch data-parallel replicas that silently train different models.

The check's parts, one module each:

* what is compared -- :mod:`.fingerprint`: per tensor a 32-bit hash of its raw bits, its non-finite count
  and its value sums, folded into one fixed-length vector per replica;
* over which replicas -- :mod:`.groups`: each tensor over the ranks that must hold it equal (the whole
  world; a DTensor's Replicate mesh dimensions; neuronx-distributed's data-parallel groups; flat FSDP
  shards are not compared; a DDP module's process group); :mod:`.evidence`: the DDP and FSDP modules,
  recorded when they are made; :mod:`.decisions`: what the zero-code check's first look decided per tensor,
  kept with the tensor for its life;
* how the replicas exchange it -- :mod:`.comm`: a gloo group of the check's own, entered only when every
  rank agreed it reached the check, through the process group's store or, on XLA without a process group,
  a store of the check's own (never an XLA collective) handed to the replicas where torch_xla starts them
  (:mod:`.launch`); :mod:`.worker`: the zero-code check's agreement and
  exchange on a thread of their own per rank, off the training thread;
* one check and its verdict -- :mod:`.compare` (``compare_replicas``, ``check_sync``);
* when the zero-code check runs -- :mod:`.hook` (``TPU_CLOSURE_FIX_SYNC_CHECK``);
* what is said -- :mod:`.report` (the ``SyncReport``; one report per event from rank 0, on the
  ``tpu_closure_fix.synccheck`` logger, the one path of every report) and
  :mod:`.callback` (the Lightning callback, which also logs metrics).

Importing this package imports neither torch nor Lightning; docs/synccheck.md has the guarantees and
the measured cost.
"""
from . import evidence as _evidence
from . import launch as _launch
from .callback import SyncCheck
from .compare import DEFAULT_EVERY, DEFAULT_TOLERANCE, ON_DIVERGENCE, check_sync, compare_replicas
from .report import DIVERGED_OUTCOMES, NAMES_IN_MESSAGE, OUTCOMES, ReplicaDivergenceError, SyncReport

__all__ = ["SyncCheck", "check_sync", "compare_replicas", "ReplicaDivergenceError", "SyncReport",
           "DEFAULT_EVERY", "DEFAULT_TOLERANCE", "ON_DIVERGENCE", "OUTCOMES", "DIVERGED_OUTCOMES",
           "NAMES_IN_MESSAGE"]

# From the first import on, the DDP and FSDP modules made are recorded as layout evidence (weakly, at their
# construction): the checks never scan the live objects for them.
_evidence.watch()
try:
    _launch.watch()  # before the script's xmp.spawn: the replicas it starts get the check's channel
except Exception:  # never break the importing program: the replicas' checks then say why they stand down
    pass
