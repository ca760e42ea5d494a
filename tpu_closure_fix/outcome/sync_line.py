"""The zero-code sync check's line: what the training process will do with ``TPU_CLOSURE_FIX_SYNC_CHECK``.

Composed from the settings as the training process parses them (:class:`..settings.Settings` over its
environment, read only: :meth:`~..settings.Settings.peek`) and from whether the shim activates there at all (its
start-up hook): never from what the asking process armed in itself, which trains nothing.
"""
from ..config import ASCII_WHITESPACE, ON_DIVERGENCE_VAR, SYNC_CHECK_VAR
from ..settings import Settings

HEAD = "zero-code sync check: "


def line(facts, hook, environ):
    """One line for ``status`` and ``check``: ``facts`` of the interpreter that trains (its flags), ``hook``:
    ``(active, reason)`` of its start-up hook, ``environ``: the environment it starts with. The first rule
    that applies decides."""
    training = Settings(environ)
    raw = training.raw[SYNC_CHECK_VAR]
    flags = facts.get("flags") or {}
    # 1. Unset or empty: off.
    if raw is None or raw.strip(ASCII_WHITESPACE) == "":
        return HEAD + "off (%s unset)" % SYNC_CHECK_VAR
    # 2. The interpreter ignores the environment (-E, -I): the variable is never read there.
    if flags.get("ignore_environment") or flags.get("isolated"):
        return HEAD + "off: python -E/-I ignores the environment, %s included" % SYNC_CHECK_VAR
    every, problem = training.peek(SYNC_CHECK_VAR)
    # 3. A bad value: the training process warns and leaves the check off.
    if problem:
        return HEAD + "off: %s (the training process warns and leaves it off)" % _first_sentence(problem)
    # 4. 0: off.
    if not every:
        return HEAD + "off (%s=0)" % SYNC_CHECK_VAR
    # 5. The shim never activates there (its start-up hook does not run): nothing arms the check.
    if hook[0] is False:
        return HEAD + ("not armed: the start-up hook does not run there, and only the shim's activation arms it "
                       "(a training script that imports tpu_closure_fix arms it)")
    action, problem = training.peek(ON_DIVERGENCE_VAR)
    said = action if not problem else "%s (%s)" % (action, _first_sentence(problem))
    # 6. Armed where torch's optimizer is imported: what the training process will do.
    return HEAD + "armed at the first optimizer step of a process that imports torch: every %d step%s, " \
                  "on divergence: %s" % (every, "" if every == 1 else "s", said)


def _first_sentence(message):
    """The first sentence of a bad value's warning (:func:`..config.bad_value_message`) on one line."""
    text = " ".join(message.split())
    return text.split("; accepted:")[0]
