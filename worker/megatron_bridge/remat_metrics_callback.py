"""Writes the metrics file that remat's `command` trial backend reads.

remat runs your own training command for each recompute policy it tries (a command template
configured on the worker, see worker/README.md) and reads back, per rank, the peak allocated and
reserved bytes and the step times. This callback collects them inside a Megatron Bridge job:

    from remat_metrics_callback import RematMetricsCallback
    pretrain(config, forward_step, callbacks=[RematMetricsCallback()])

It writes ``$REMAT_METRICS_FILE.rank<N>`` (JSON, format in worker/README.md) after every step and
when the job ends, also when it dies of an out-of-memory error (status ``oom``, with the size of
the allocation that failed), so a crash still leaves figures.
Outside Megatron Bridge, call ``step_end(loss=...)`` after each training step yourself.

It enforces the trial's memory budget on the device: ``$REMAT_MEMORY_BUDGET_BYTES`` (set by the
worker; the template's ``{memory_budget_bytes}``), or the ``memory_budget_bytes`` argument, becomes
``torch.cuda.set_per_process_memory_fraction(budget / device memory)`` when training starts (the
device is chosen by then), so a policy whose peak is over the budget fails an allocation, as
it would on a device of that size, and is reported ``oom``. 0 or unset: no cap (a depth-proxy run
measures without one). Call ``enforce_memory_budget()`` yourself right after
``torch.cuda.set_device`` to cap the set-up too.

Only the standard library and torch are needed; without CUDA the peaks are 0 and nothing is
capped. docs/megatron-bridge.md wires a Megatron Bridge recipe end to end.
"""

import atexit
import json
import os
import re
import sys
import time

BUDGET_ENV = "REMAT_MEMORY_BUDGET_BYTES"

try:  # Megatron Bridge's callback base class, when it is installed.
    from megatron.bridge.training.callbacks import Callback as _BridgeCallback
except Exception:  # noqa: BLE001 - any import problem means "not available"
    class _BridgeCallback:  # pylint: disable=too-few-public-methods
        """Stand-in base class when Megatron Bridge is not importable."""


def _torch():
    try:
        import torch  # pylint: disable=import-outside-toplevel
        return torch
    except Exception:  # noqa: BLE001
        return None


def _is_oom(exc):
    torch = _torch()
    oom_type = getattr(getattr(torch, "cuda", None), "OutOfMemoryError", None) if torch else None
    if oom_type is not None and isinstance(oom_type, type) and isinstance(exc, oom_type):
        return True
    return "out of memory" in str(exc).lower()


# ---- pure helpers (no torch; tested on CPU by tests/worker/remat_metrics_callback_test.py) ----

def parse_budget_bytes(text, name=BUDGET_ENV):
    """The budget in bytes from its text (an environment variable's value): 0 (no cap) for None,
    "" or "0"; ValueError naming `name` for anything but a whole number of bytes >= 0."""
    if text is None or text.strip() == "":
        return 0
    try:
        value = int(text.strip())
    except ValueError:
        raise ValueError("%s: expected a whole number of bytes, got %r" % (name, text)) from None
    if value < 0:
        raise ValueError("%s: must be >= 0, got %d" % (name, value))
    return value


def memory_fraction(budget_bytes, device_total_bytes):
    """The fraction of the device the budget allows, at most 1; None when there is no cap (no
    budget, or a device whose size is unknown)."""
    if budget_bytes <= 0 or device_total_bytes <= 0:
        return None
    return min(1.0, float(budget_bytes) / float(device_total_bytes))


_UNITS = {"B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "TiB": 1 << 40}


def failing_request_bytes(message):
    """The failed allocation's size from PyTorch's out-of-memory message ('Tried to allocate
    1.50 GiB'); 0 when it does not say. The megatron driver reads the same message
    (worker/megatron_driver/metrics.py); this file stays self-contained, so the rule is here too
    and a test holds the two to the same answers."""
    m = re.search(r"Tried to allocate ([0-9.]+) (B|KiB|MiB|GiB|TiB)", message or "")
    if not m:
        return 0
    return int(float(m.group(1)) * _UNITS[m.group(2)])


def _as_float(value):
    try:
        if hasattr(value, "item"):
            value = value.item()
        return float(value)
    except Exception:  # noqa: BLE001
        return None


class RematMetricsCallback(_BridgeCallback):
    """Records per-rank peak memory and step times for remat's command backend."""

    def __init__(self, metrics_file=None, rank=None, memory_budget_bytes=None):
        super().__init__()
        self.metrics_file = metrics_file or os.environ.get("REMAT_METRICS_FILE")
        self._rank = rank
        # A malformed budget must stop the job before it trains uncapped and reports a peak the
        # budget would not have allowed.
        self.memory_budget_bytes = (int(memory_budget_bytes) if memory_budget_bytes is not None
                                    else parse_budget_bytes(os.environ.get(BUDGET_ENV)))
        self.memory_fraction = None  # what was enforced (None: nothing yet, or no cap)
        self._budget_enforced = False
        self.step_times_s = []
        self.losses = []
        self.grad_norms = []
        self.status = "ok"
        self.message = ""
        self.failing_request_bytes = 0
        self._step_start = None
        self._last_end = None
        if self.metrics_file:
            atexit.register(self.write)
            previous = sys.excepthook

            def hook(exc_type, exc, tb):
                self.mark_failure(exc)
                self.write()
                previous(exc_type, exc, tb)

            sys.excepthook = hook

    # ---- Megatron Bridge events ---------------------------------------------------------

    def on_train_start(self, context=None):  # pylint: disable=unused-argument
        self.enforce_memory_budget()
        self._last_end = self._now()

    def on_train_step_start(self, context=None):  # pylint: disable=unused-argument
        self.enforce_memory_budget()
        self._step_start = self._now()

    def on_train_step_end(self, context=None):
        loss = None
        loss_dict = getattr(context, "loss_dict", None) if context is not None else None
        if isinstance(loss_dict, dict) and loss_dict:
            loss = loss_dict.get("lm loss", next(iter(loss_dict.values())))
        grad_norm = getattr(context, "grad_norm", None) if context is not None else None
        self.step_end(loss=loss, grad_norm=grad_norm)

    def on_train_end(self, context=None):  # pylint: disable=unused-argument
        self.write()

    # ---- framework-agnostic API ---------------------------------------------------------

    def enforce_memory_budget(self):
        """Caps this process's CUDA allocator at the budget on its current device (once; later
        calls do nothing). Returns the fraction set, or None when there is nothing to cap."""
        if self._budget_enforced:
            return self.memory_fraction
        torch = _torch()
        if self.memory_budget_bytes <= 0 or torch is None or not torch.cuda.is_available():
            self._budget_enforced = True
            return None
        device = torch.cuda.current_device()
        total = torch.cuda.get_device_properties(device).total_memory
        fraction = memory_fraction(self.memory_budget_bytes, total)
        if fraction is not None:
            torch.cuda.set_per_process_memory_fraction(fraction, device)
        self.memory_fraction = fraction
        self._budget_enforced = True
        return fraction

    def step_end(self, loss=None, grad_norm=None):
        """Call after each training step (when not driven by Megatron Bridge)."""
        self.enforce_memory_budget()
        now = self._now()
        start = self._step_start if self._step_start is not None else self._last_end
        if start is not None:
            self.step_times_s.append(now - start)
        self._step_start = None
        self._last_end = now
        loss_value = _as_float(loss)
        if loss_value is not None:
            self.losses.append(loss_value)
        norm_value = _as_float(grad_norm)
        if norm_value is not None:
            self.grad_norms.append(norm_value)
        self.write()

    def mark_failure(self, exc):
        """Records why the job failed: status oom for an out-of-memory error (with the size of
        the allocation that failed), else failed."""
        self.status = "oom" if _is_oom(exc) else "failed"
        text = f"{type(exc).__name__}: {exc}"
        self.message = text.splitlines()[0][:500] if text else ""
        if self.status == "oom":
            self.failing_request_bytes = failing_request_bytes(str(exc))

    def record_failure(self, exc):
        """mark_failure, then write: for a job that catches its training's exception itself
        (`except BaseException as e: cb.record_failure(e); raise`)."""
        self.mark_failure(exc)
        self.write()

    def write(self):
        """Writes this rank's metrics atomically; never raises."""
        if not self.metrics_file:
            return
        try:
            rank = self.rank()
            entry = {
                "rank": rank,
                "status": self.status,
                "message": self.message,
                "step_times_s": self.step_times_s,
                "losses": self.losses,
                "grad_norms": self.grad_norms,
                "failing_request_bytes": self.failing_request_bytes,
            }
            entry.update(self._memory())
            path = f"{self.metrics_file}.rank{rank}"
            tmp = path + ".tmp"
            with open(tmp, "w", encoding="utf-8") as out:
                json.dump({"ranks": [entry]}, out)
            os.replace(tmp, path)
        except Exception as exc:  # noqa: BLE001 - metrics must never break training
            print(f"remat metrics: cannot write {self.metrics_file}: {exc}", file=sys.stderr)

    def rank(self):
        """This process's global rank (torch.distributed, else $RANK, else 0)."""
        if self._rank is not None:
            return self._rank
        torch = _torch()
        try:
            if torch is not None and torch.distributed.is_available() and \
                    torch.distributed.is_initialized():
                return torch.distributed.get_rank()
        except Exception:  # noqa: BLE001
            pass
        return int(os.environ.get("RANK", "0"))

    # ---- helpers --------------------------------------------------------------------------

    @staticmethod
    def _now():
        torch = _torch()
        if torch is not None and torch.cuda.is_available():
            torch.cuda.synchronize()  # step times must include the GPU work
        return time.perf_counter()

    @staticmethod
    def _memory():
        torch = _torch()
        if torch is None or not torch.cuda.is_available():
            return {"peak_allocated_bytes": 0, "peak_reserved_bytes": 0}
        stats = torch.cuda.memory_stats()
        return {
            "peak_allocated_bytes": int(torch.cuda.max_memory_allocated()),
            "peak_reserved_bytes": int(torch.cuda.max_memory_reserved()),
            "alloc_retries": int(stats.get("num_alloc_retries", 0)),
        }
