"""Helpers of the interrupt tests: a KeyboardInterrupt raised where a signal's would land.

Python raises a signal's KeyboardInterrupt where it checks for one, at the start of a
function: these helpers raise one at the first entry of a chosen function (from a chosen
caller, if given), outside any ``__del__`` (Python reports an exception raised in a finalizer
instead of raising it, and the finalizer's work is lost with it)."""
import sys
import threading


def entered(fn, keep) -> list:
    """The code objects that ``fn()`` enters and ``keep(frame)`` accepts, in first-entry order."""
    seen: dict = {}

    def tracer(frame, event, arg):
        if event == "call" and keep(frame):
            seen.setdefault(frame.f_code, None)
    outer = sys.gettrace()
    sys.settrace(tracer)
    try:
        fn()
    finally:
        sys.settrace(outer)
    return list(seen)


def _outside_finalizers(frame) -> bool:
    while frame is not None and frame.f_code.co_name != "__del__":
        frame = frame.f_back
    return frame is None


def interrupted(fn, code, caller=None) -> BaseException | None:
    """Run ``fn()`` with a KeyboardInterrupt raised at ``code``'s first entry (from
    ``caller``, if given); the interrupt, or None if ``fn`` returned (it never got there)."""
    def tracer(frame, event, arg):
        if event == "call" and frame.f_code is code and _outside_finalizers(frame) and (
                caller is None or frame.f_back.f_code is caller):
            sys.settrace(None)
            raise KeyboardInterrupt
    outer = sys.gettrace()
    # One raised in a finalizer or a weakref callback is reported, not raised: dropped here,
    # so that the report keeps no frame (nor its values) alive.
    hook, sys.unraisablehook = sys.unraisablehook, lambda unraisable: None
    sys.settrace(tracer)
    try:
        fn()
    except KeyboardInterrupt as e:
        return e
    finally:
        sys.settrace(outer)
        sys.unraisablehook = hook
    return None


def is_free(lock) -> bool:
    """Whether another thread can take ``lock`` now."""
    got = []

    def take():
        if lock.acquire(timeout=5):
            got.append(True)
            lock.release()
    t = threading.Thread(target=take)
    t.start()
    t.join()
    return bool(got)
